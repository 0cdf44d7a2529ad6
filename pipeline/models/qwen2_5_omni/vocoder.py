"""BigVGAN (Qwen2.5-Omni's vocoder) as a function of tensors that CUDA graphs can capture, with an optional fused
form of its anti-aliased activations.

Where a vocoder call's time goes on a GPU (BENCHMARKS.md §12.1): not its convolutions but its 109 anti-aliased
SnakeBeta activations (18 per upsampling stage, one after the last). Each is a replicate pad, a 2x upsampling by a
depthwise transposed convolution with a 12-tap Kaiser-sinc filter, a crop, SnakeBeta (exp, sin, pow, mul, add), a
second replicate pad and a depthwise 12-tap low-pass convolution of stride 2: ~10 memory-bound float32 kernels over
signals at up to twice the output sample rate, and cuDNN runs the depthwise transposed convolution as a slow grouped
``dgrad`` kernel. :func:`anti_aliased_snake` computes the same thing from the input signal directly: each upsampled
sample is a 6-tap sum of input samples (polyphase form of the transposed convolution), each output sample a 12-tap
sum of SnakeBeta of upsampled samples, with the replicate padding of both stages as clamped reads. Written in plain
tensor ops it is slow eagerly, but ``torch.compile`` turns it into two fused kernels (:class:`CompiledActivation`);
the synthesizer uses it when it compiles the vocoder, on CUDA by default.

Equal to the reference up to float rounding (sums in another order); ``tests/test_vocoder.py`` checks both forms
against transformers' modules.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "Activation",
    "CompiledActivation",
    "VOCODER_DB_SHIFT",
    "VOCODER_MIN_DB",
    "anti_aliased_snake",
    "min_amplitude",
    "reference_activation",
    "waveform",
]

VOCODER_MIN_DB = -115.0
VOCODER_DB_SHIFT = 20.0
"""BigVGAN's input normalisation (the reference's ``process_mel_spectrogram``): log-mel -> dB floored at -115 dB,
shifted by -20 dB, scaled to [-1, 1]. Restated here only for the capturable vocoder; a test checks it against the
reference module."""

SNAKE_EPS = 1e-9
"""SnakeBeta's guard against division by zero (the reference's ``no_div_by_zero``)."""

Activation = Callable[[torch.nn.Module, Tensor], Tensor]
"""``(anti-aliased activation module, (rows, channels, T) signal) -> (rows, channels, T)``: one of BigVGAN's
``Qwen2_5OmniAntiAliasedActivation1d`` applied to a signal (:func:`reference_activation`, :func:`fused_activation`
or :class:`CompiledActivation`)."""


def reference_activation(module: torch.nn.Module, hidden: Tensor) -> Tensor:
    """The module's own forward (transformers' code)."""
    return module(hidden)


def upsampled_snake(hidden: Tensor, up_filter: Tensor, up_ratio: int, alpha: Tensor, beta: Tensor) -> Tensor:
    """Upsample by ``up_ratio`` (transposed convolution with the 1-D ``up_filter``, whose length is a multiple of the
    ratio, over the replicate-padded input, cropped as the reference crops it), then SnakeBeta with log-scale
    ``alpha``/``beta`` (channels,): (rows, channels, T) -> (rows, channels, up_ratio * T)."""
    length = hidden.shape[-1]
    taps = up_filter.shape[0]
    pad = taps // up_ratio - 1
    crop = pad * up_ratio + (taps - up_ratio) // 2
    # Output sample n = up_ratio * m + phase of the transposed convolution reads input i = (n + crop - k) / up_ratio
    # (padded index) for the taps k of the right parity: input sample m + shift, shift = (phase + crop - k) // ratio
    # - pad, clamped to the signal (the replicate padding).
    shifts = {(phase, k): (phase + crop - k) // up_ratio - pad
              for phase in range(up_ratio) for k in range(taps) if (phase + crop - k) % up_ratio == 0}  # fmt: skip
    reach = max(abs(s) for s in shifts.values())
    padded = F.pad(hidden, (reach, reach), mode="replicate")
    phases = []
    for phase in range(up_ratio):
        terms = [up_filter[k] * padded[..., reach + s : reach + s + length] for (p, k), s in shifts.items() if p == phase]
        phases.append(up_ratio * sum(terms[1:], terms[0]))
    upsampled = torch.stack(phases, dim=-1).flatten(-2)
    alpha = torch.exp(alpha)[:, None]
    beta = torch.exp(beta)[:, None]
    return upsampled + (1.0 / (beta + SNAKE_EPS)) * torch.pow(torch.sin(upsampled * alpha), 2)


def downsampled(hidden: Tensor, down_filter: Tensor, down_ratio: int, down_pad: tuple[int, int]) -> Tensor:
    """Low-pass with the 1-D ``down_filter`` over the signal replicate-padded by ``down_pad`` (left, right), stride
    ``down_ratio``: (rows, channels, T) -> (rows, channels, (T + left + right - taps) // down_ratio + 1)."""
    left, right = down_pad
    padded = F.pad(hidden, (left, right), mode="replicate")
    out_length = (hidden.shape[-1] + left + right - down_filter.shape[0]) // down_ratio + 1
    span = down_ratio * (out_length - 1) + 1
    terms = [down_filter[k] * padded[..., k : k + span : down_ratio] for k in range(down_filter.shape[0])]
    return sum(terms[1:], terms[0])


def anti_aliased_snake(hidden: Tensor, up_filter: Tensor, up_ratio: int, down_filter: Tensor, down_ratio: int,
                       down_pad: tuple[int, int], alpha: Tensor, beta: Tensor) -> Tensor:  # fmt: skip
    """One anti-aliased activation: :func:`upsampled_snake`, then :func:`downsampled`. (rows, channels, T) ->
    (rows, channels, T) for the packaged ratios (2, 2) and 12-tap filters."""
    return downsampled(upsampled_snake(hidden, up_filter, up_ratio, alpha, beta), down_filter, down_ratio, down_pad)


def _fused_arguments(module: torch.nn.Module) -> tuple:
    up, down, act = module.upsample, module.downsample, module.act
    # detached: dynamo keeps a parameter's shape static, and the channel count must stay dynamic (one graph for all)
    return (up.filter.reshape(-1), up.ratio, down.filter.reshape(-1), down.stride, (down.pad_left, down.pad_right),
            act.alpha.detach(), act.beta.detach())  # fmt: skip


def fused_activation(module: torch.nn.Module, hidden: Tensor) -> Tensor:
    """:func:`anti_aliased_snake` with the module's filters and parameters, eagerly."""
    return anti_aliased_snake(hidden, *_fused_arguments(module))


def _compiled(function: Callable) -> Callable:
    """``torch.compile`` of a private copy of ``function``'s code (dynamo's recompile limit counts per code object,
    so each instance gets its own budget); ``fullgraph``: a graph break raises instead of running partly eagerly."""
    code = function.__code__.replace()
    copy = types.FunctionType(code, function.__globals__, function.__name__, function.__defaults__)
    return torch.compile(copy, fullgraph=True, mode="default")


class CompiledActivation:
    """:func:`anti_aliased_snake` through ``torch.compile`` (inductor), an :data:`Activation`: two compiled
    functions, so that the activated upsampled signal is written once and read by the low-pass (one function would
    let inductor inline SnakeBeta into each of the low-pass's 12 taps, a sine per tap and output sample: measured
    4x slower on an H100, BENCHMARKS.md §12.1). Two kernels per activation.

    Rows, channels and length are dynamic (marked on every call), filters and SnakeBeta parameters are inputs; the
    ratios and padding are plain ints (specialized, the same in every layer of a checkpoint), so one pair of graphs
    serves every activation of the vocoder (plus dynamo's own specialization of a single row)."""

    def __init__(self) -> None:
        self._up = _compiled(upsampled_snake)
        self._down = _compiled(downsampled)

    def __call__(self, module: torch.nn.Module, hidden: Tensor) -> Tensor:
        up_filter, up_ratio, down_filter, down_ratio, down_pad, alpha, beta = _fused_arguments(module)
        torch._dynamo.mark_dynamic(hidden, (0, 1, 2))
        torch._dynamo.mark_dynamic(alpha, 0)
        torch._dynamo.mark_dynamic(beta, 0)
        activated = self._up(hidden, up_filter, up_ratio, alpha, beta)
        torch._dynamo.mark_dynamic(activated, (0, 1, 2))
        return self._down(activated, down_filter, down_ratio, down_pad)


def min_amplitude(device: torch.device) -> Tensor:
    """The -115 dB amplitude floor as a device scalar, computed as the reference computes it."""
    exponent = torch.tensor(VOCODER_MIN_DB / 20.0 * np.log(10), device=device, dtype=torch.float32)
    return torch.exp(exponent)


def _amp_block(block: torch.nn.Module, hidden: Tensor, activation: Activation) -> Tensor:
    """transformers' ``Qwen2_5OmniAMPBlock.forward`` with each anti-aliased activation run by ``activation``."""
    acts1, acts2 = block.activations[::2], block.activations[1::2]
    for conv1, conv2, act1, act2 in zip(block.convs1, block.convs2, acts1, acts2):
        hidden = hidden + conv2(activation(act2, conv1(activation(act1, hidden))))
    return hidden


def waveform(bigvgan, floor: Tensor, mel: Tensor, activation: Activation = reference_activation) -> Tensor:
    """BigVGAN's forward without its final copy to the host, so that it can be captured: (rows, mel_dim, frames) ->
    (rows, frames * hop) on the model's device (rows are independent: every layer is a per-row convolution or
    activation). The reference builds its dB floor from a Python float on every call (a host-to-device copy, which
    capture forbids); here it is ``floor`` (:func:`min_amplitude`), made once. ``activation`` runs each
    anti-aliased activation (the modules' own forward by default)."""
    decibels = 20 * torch.log10(torch.clamp(torch.exp(mel), min=floor)) - VOCODER_DB_SHIFT
    hidden = bigvgan.conv_pre(bigvgan.normalize_spectrogram(decibels, 1, VOCODER_MIN_DB))
    per_layer = bigvgan.num_residual_blocks
    for layer in range(bigvgan.num_upsample_layers):
        hidden = bigvgan.ups[layer][0](hidden)
        blocks = bigvgan.resblocks[layer * per_layer : (layer + 1) * per_layer]
        hidden = sum(_amp_block(block, hidden, activation) for block in blocks) / per_layer
    samples = bigvgan.conv_post(activation(bigvgan.activation_post, hidden))
    return torch.clamp(samples, min=-1.0, max=1.0).reshape(mel.shape[0], -1)

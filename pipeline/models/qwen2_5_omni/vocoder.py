"""BigVGAN (Qwen2.5-Omni's vocoder) as a function of tensors that CUDA graphs can capture, with its anti-aliased
activations optionally run as two Triton kernels each.

Where a vocoder call's time goes on a GPU (``scripts/profile_token2wav.py``): not its convolutions but its 109
anti-aliased SnakeBeta activations (18 per upsampling stage, one after the last). Each is a replicate pad, a 2x
upsampling by a depthwise transposed convolution with a 12-tap Kaiser-sinc filter, a crop, SnakeBeta (exp, sin, pow,
mul, add), a second replicate pad and a depthwise 12-tap low-pass convolution of stride 2: ~10 memory-bound float32
kernels over signals at up to twice the output sample rate, and cuDNN runs the depthwise transposed convolution as a
slow grouped ``dgrad`` kernel. :func:`triton_activation` computes the same thing in two kernels:

- upsampled samples 2m and 2m + 1 are 6-tap sums of input samples m - 3 .. m + 3 (the polyphase form of the
  transposed convolution; input indices clamped: the first replicate padding), SnakeBeta applied, written once;
- output sample t is the 12-tap low-pass of activated samples 2t - 5 .. 2t + 6 (clamped: the second replicate
  padding).

Equal to the reference up to float rounding (sums in another order); ``tests/unit/models/test_vocoder.py`` checks the
kernels
against transformers' modules (on the GPU, or in Triton's interpreter on the CPU). Two other forms were measured
slower on an H100: torch.compile of the same arithmetic (its index arithmetic over dynamic shapes
dominated), and one kernel recomputing SnakeBeta for each of an output's 12 taps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from torch import Tensor

from pipeline.errors import ConfigError

if TYPE_CHECKING:
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
        Qwen2_5OmniAMPBlock,
        Qwen2_5OmniAntiAliasedActivation1d,
    )

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU installs without triton
    triton = None

__all__ = [
    "Activation",
    "VOCODER_DB_SHIFT",
    "VOCODER_MIN_DB",
    "check_fusable",
    "min_amplitude",
    "reference_activation",
    "triton_activation",
    "waveform",
]

VOCODER_MIN_DB = -115.0
VOCODER_DB_SHIFT = 20.0
"""BigVGAN's input normalisation (the reference's ``process_mel_spectrogram``): log-mel -> dB floored at -115 dB,
shifted by -20 dB, scaled to [-1, 1]. Restated here only for the capturable vocoder; a test checks it against the
reference module."""

SNAKE_EPS = 1e-9
"""SnakeBeta's guard against division by zero (the reference's ``no_div_by_zero``)."""

FUSED_GEOMETRY = {"up_ratio": 2, "up_taps": 12, "down_ratio": 2, "down_taps": 12, "down_pad": (5, 6)}
"""The anti-aliased activation the kernel implements (transformers' defaults, every Qwen2.5-Omni checkpoint's)."""

BLOCK = 256
"""Output samples per kernel program."""

Activation = Callable[["Qwen2_5OmniAntiAliasedActivation1d", Tensor], Tensor]
"""``(anti-aliased activation module, (rows, channels, T) float32 signal) -> (rows, channels, T)``: one of BigVGAN's
``Qwen2_5OmniAntiAliasedActivation1d`` applied to a signal (:func:`reference_activation` or
:func:`triton_activation`)."""


def reference_activation(module: Qwen2_5OmniAntiAliasedActivation1d, hidden: Tensor) -> Tensor:
    """The module's own forward (transformers' code)."""
    return module(hidden)


def _geometry(module: Qwen2_5OmniAntiAliasedActivation1d) -> dict:
    up, down = module.upsample, module.downsample
    return {
        "up_ratio": up.ratio,
        "up_taps": up.kernel_size,
        "down_ratio": down.stride,
        "down_taps": down.kernel_size,
        "down_pad": (down.pad_left, down.pad_right),
    }


def check_fusable(bigvgan) -> None:
    """Raise :class:`ConfigError` unless every anti-aliased activation of ``bigvgan`` has :data:`FUSED_GEOMETRY`."""
    modules = [bigvgan.activation_post, *(act for block in bigvgan.resblocks for act in block.activations)]
    odd = {str(_geometry(m)) for m in modules} - {str(FUSED_GEOMETRY)}
    if odd:
        raise ConfigError(
            f"the fused vocoder activation needs {FUSED_GEOMETRY}, the checkpoint has {sorted(odd)}; "
            "run it unfused (stage config: stages.token2wav.compile: off)",
            param="compile",
        )


if triton is not None:

    @triton.jit
    def _upsampled_snake_kernel(X, Activated, UpFilter, Alpha, Beta, channels, length, BLOCK: tl.constexpr):
        # input samples m of one row and channel -> activated upsampled samples 2m (phase 0) and 2m + 1 (phase 1)
        row_channel = tl.program_id(0)
        m = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        valid = m < length
        base = row_channel.to(tl.int64) * length
        channel = row_channel % channels
        alpha = tl.exp(tl.load(Alpha + channel))
        inv_beta = 1.0 / (tl.exp(tl.load(Beta + channel)) + 1e-9)
        even = tl.zeros([BLOCK], dtype=tl.float32)
        odd = tl.zeros([BLOCK], dtype=tl.float32)
        for s in tl.static_range(7):  # input samples m - 3 .. m + 3, clamped: the replicate padding
            x = tl.load(X + base + tl.minimum(tl.maximum(m + (s - 3), 0), length - 1), mask=valid, other=0.0)
            if s < 6:  # phase 0 reads m + 2 - j with tap 2j + 1: s = 5 - j
                even += tl.load(UpFilter + 11 - 2 * s) * x
            if s > 0:  # phase 1 reads m + 3 - j with tap 2j: s = 6 - j
                odd += tl.load(UpFilter + 12 - 2 * s) * x
        even = 2.0 * even
        odd = 2.0 * odd
        sin_even = tl.sin(even * alpha)
        sin_odd = tl.sin(odd * alpha)
        tl.store(Activated + 2 * base + 2 * m, even + inv_beta * (sin_even * sin_even), mask=valid)
        tl.store(Activated + 2 * base + 2 * m + 1, odd + inv_beta * (sin_odd * sin_odd), mask=valid)

    @triton.jit
    def _lowpass_kernel(Activated, Out, DownFilter, length, BLOCK: tl.constexpr):
        # output sample t = the 12-tap low-pass of activated samples 2t - 5 .. 2t + 6, clamped: the replicate padding
        row_channel = tl.program_id(0)
        t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        valid = t < length
        base = row_channel.to(tl.int64) * length
        last = 2 * length - 1
        out = tl.zeros([BLOCK], dtype=tl.float32)
        for k in tl.static_range(12):
            n = tl.minimum(tl.maximum(2 * t + (k - 5), 0), last)
            out += tl.load(DownFilter + k) * tl.load(Activated + 2 * base + n, mask=valid, other=0.0)
        tl.store(Out + base + t, out, mask=valid)


def triton_activation(module: Qwen2_5OmniAntiAliasedActivation1d, hidden: Tensor) -> Tensor:
    """The module's anti-aliased SnakeBeta in two Triton kernels (see the module docstring); ``hidden`` float32 on a
    device Triton runs on (a GPU, or the CPU under ``TRITON_INTERPRET=1``), the module of :data:`FUSED_GEOMETRY`
    (:func:`check_fusable`)."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    rows, channels, length = hidden.shape
    signal = hidden.contiguous()
    activated = signal.new_empty(rows, channels, 2 * length)
    out = torch.empty_like(signal)
    grid = (rows * channels, triton.cdiv(length, BLOCK))
    _upsampled_snake_kernel[grid](
        signal,
        activated,
        module.upsample.filter.reshape(-1),
        module.act.alpha,
        module.act.beta,
        channels,
        length,
        BLOCK=BLOCK,
    )
    _lowpass_kernel[grid](activated, out, module.downsample.filter.reshape(-1), length, BLOCK=BLOCK)
    return out


def min_amplitude(device: torch.device) -> Tensor:
    """The -115 dB amplitude floor as a device scalar, computed as the reference computes it."""
    exponent = torch.tensor(VOCODER_MIN_DB / 20.0 * np.log(10), device=device, dtype=torch.float32)
    return torch.exp(exponent)


def _amp_block(block: Qwen2_5OmniAMPBlock, hidden: Tensor, activation: Activation) -> Tensor:
    """transformers' ``Qwen2_5OmniAMPBlock.forward`` with each anti-aliased activation run by ``activation``."""
    acts1, acts2 = block.activations[::2], block.activations[1::2]
    for conv1, conv2, act1, act2 in zip(block.convs1, block.convs2, acts1, acts2):
        # ModuleList items are typed Module; the AMP block's activations are all anti-aliased activations
        act1, act2 = cast("Qwen2_5OmniAntiAliasedActivation1d", act1), cast("Qwen2_5OmniAntiAliasedActivation1d", act2)
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

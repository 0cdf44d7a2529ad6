"""The vocoder as the synthesizer runs it (:mod:`pipeline.models.qwen2_5_omni.vocoder`): the capturable forward equals
BigVGAN's own, and the fused anti-aliased activation equals transformers' module (eagerly and compiled) on the tiny
token2wav of test_token2wav_stream, with SnakeBeta parameters away from their all-zero initialization."""

from __future__ import annotations

import pytest
import torch

from pipeline.models.qwen2_5_omni import vocoder
from tests.test_token2wav_stream import MEL_DIM, build_token2wav

FUSED_TOLERANCE = 2e-6
"""Fused vs module activation, absolute, on signals of magnitude ~1-5: the same float32 arithmetic with the filter
sums in another order (measured 1.2e-6 at most); a wrong tap, phase or edge moves samples by orders of magnitude
more."""


@pytest.fixture(scope="module")
def bigvgan():
    model = build_token2wav().code2wav_bigvgan_model
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # trained-like SnakeBeta parameters: every channel its own frequency and magnitude
        for module in model.modules():
            if isinstance(module, type(model.activation_post.act)):
                module.alpha.copy_(torch.randn(module.alpha.shape, generator=generator) * 0.5)
                module.beta.copy_(torch.randn(module.beta.shape, generator=generator) * 0.5)
    return model


def mel(frames: int, rows: int = 1, seed: int = 4) -> torch.Tensor:
    """A mel in the range the DiT produces."""
    return torch.randn(rows, MEL_DIM, frames, generator=torch.Generator().manual_seed(seed)) * 3.0 - 4.0


def test_capturable_vocoder_equals_the_reference_module(bigvgan) -> None:
    """The vocoder function the graphs capture (no host copy, dB floor made once) computes what BigVGAN's own
    forward computes."""
    with torch.inference_mode():
        reference = bigvgan(mel(30))
        ours = vocoder.waveform(bigvgan, vocoder.min_amplitude(torch.device("cpu")), mel(30))
    assert ours.shape == (1, 30 * 240) and reference.abs().max() > 0.1
    torch.testing.assert_close(ours, reference.reshape(1, -1), rtol=0, atol=0)


@pytest.mark.parametrize("length", [1, 2, 5, 6, 7, 13, 40])
def test_fused_activation_equals_the_module(bigvgan, length: int) -> None:
    """Every length, including those shorter than the filters' reach (where both replicate paddings decide the
    output), for the first stage's and the last activation's channel counts."""
    generator = torch.Generator().manual_seed(length)
    for module in (bigvgan.resblocks[0].activations[1], bigvgan.activation_post):
        channels = module.act.alpha.shape[0]
        signal = torch.randn(3, channels, length, generator=generator) * 2
        with torch.inference_mode():
            expected, fused = module(signal), vocoder.fused_activation(module, signal)
        assert fused.shape == expected.shape == (3, channels, length)
        torch.testing.assert_close(fused, expected, rtol=0, atol=FUSED_TOLERANCE)


def test_fused_waveform_equals_the_reference(bigvgan) -> None:
    floor = vocoder.min_amplitude(torch.device("cpu"))
    with torch.inference_mode():
        expected = vocoder.waveform(bigvgan, floor, mel(30, rows=2))
        fused = vocoder.waveform(bigvgan, floor, mel(30, rows=2), vocoder.fused_activation)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(fused, expected, rtol=0, atol=1e-6)


def test_compiled_activation_equals_the_reference_for_every_shape(bigvgan) -> None:
    """One compiled pair of graphs serves every stage's channel count, length and (past the single row dynamo
    specializes) row count: the waveform at two shapes equals the reference, and the second shape compiles nothing
    new."""
    floor = vocoder.min_amplitude(torch.device("cpu"))
    compiled = vocoder.CompiledActivation()
    counters = torch._dynamo.utils.counters["stats"]
    with torch.inference_mode():
        for rows, frames in ((1, 12), (2, 30)):  # what the synthesizer's warm-up compiles: one row, then two
            vocoder.waveform(bigvgan, floor, mel(frames, rows), compiled)
        before = counters["unique_graphs"]
        got = vocoder.waveform(bigvgan, floor, mel(17, rows=3), compiled)
        assert counters["unique_graphs"] == before
        expected = vocoder.waveform(bigvgan, floor, mel(17, rows=3))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)

"""The vocoder as the synthesizer runs it (:mod:`pipeline.models.qwen2_5_omni.vocoder`): the capturable forward equals
BigVGAN's own, and the fused anti-aliased activation kernel equals transformers' module, on the tiny token2wav of
tests/helpers/token2wav.py with SnakeBeta parameters away from their all-zero initialization. The kernel runs on the
GPU, or in Triton's interpreter on the CPU (a subprocess: the interpreter is chosen at import)."""

from __future__ import annotations

import pytest
import torch

from pipeline.errors import ConfigError
from pipeline.models.qwen2_5_omni import vocoder
from tests.helpers.token2wav import MEL_DIM, build_token2wav, trained_like
from tests.helpers.triton_check import TritonCheck


@pytest.fixture(scope="module")
def bigvgan():
    return trained_like(build_token2wav().code2wav_bigvgan_model)


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


def test_the_packaged_geometry_is_fusable_and_another_is_refused(bigvgan) -> None:
    vocoder.check_fusable(bigvgan)
    other = build_token2wav().code2wav_bigvgan_model
    other.resblocks[1].activations[2].downsample.pad_left = 4
    with pytest.raises(ConfigError) as info:
        vocoder.check_fusable(other)
    assert info.value.param == "compile" and "compile: off" in str(info.value)


KERNEL_CHECK = """
import torch
from pipeline.models.qwen2_5_omni import vocoder
from tests.helpers.token2wav import FUSED_TOLERANCE, build_token2wav, trained_like

torch.set_num_threads(1)
device = "cuda" if torch.cuda.is_available() else "cpu"
module = trained_like(build_token2wav().code2wav_bigvgan_model).to(device).activation_post
channels = module.act.alpha.shape[0]
generator = torch.Generator().manual_seed(0)
# shorter than the filters' reach (both replicate paddings decide every output), one block, two blocks of two rows;
# few, since the interpreter takes ~0.25 s per program (rows x channels x blocks)
for rows, length in ((1, 1), (1, 13), (2, 300)):
    signal = (torch.randn(rows, channels, length, generator=generator) * 2).to(device)
    with torch.inference_mode():
        expected, fused = module(signal), vocoder.triton_activation(module, signal)
    assert fused.shape == expected.shape, (fused.shape, expected.shape)
    error = ((fused - expected).abs().max() / expected.abs().max()).item()
    assert error < FUSED_TOLERANCE, (rows, length, error)
print("ok")
"""


KERNEL = TritonCheck(KERNEL_CHECK)


@pytest.mark.background(KERNEL)
def test_the_fused_activation_kernel_equals_the_module() -> None:
    """On the GPU the compiled kernels; without one, the same kernels in Triton's interpreter."""
    KERNEL.assert_ok()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_fused_vocoder_equals_the_reference_on_the_gpu(bigvgan) -> None:
    """The whole vocoder with every activation fused, against the same function with the modules' forward (both on
    the GPU, where cuDNN's convolutions round the same way in both)."""
    model = bigvgan.to("cuda")
    floor = vocoder.min_amplitude(torch.device("cuda"))
    with torch.inference_mode():
        expected = vocoder.waveform(model, floor, mel(48, rows=3).cuda())
        fused = vocoder.waveform(model, floor, mel(48, rows=3).cuda(), vocoder.triton_activation)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(fused, expected, rtol=0, atol=1e-4)


def test_the_fused_vocoder_needs_cuda() -> None:
    from pipeline.models.qwen2_5_omni.token2wav_stream import StreamingToken2Wav

    with pytest.raises(ConfigError) as info:
        StreamingToken2Wav(build_token2wav(), fused_vocoder=True)
    assert info.value.param == "fused_vocoder"

"""Streaming code2wav for Qwen3-Omni (pipeline/models/qwen3_omni/code2wav_*.py) against the module's one-shot forward.

A tiny random ``Qwen3OmniMoeCode2Wav`` (hidden 32, 2 layers, sliding window 6, upsample 2 x 2 then decoder 2 x 3: 24
samples a frame), float32 on the CPU. Its ConvNeXt gammas, layer scales and Snake parameters are moved off their
near-zero initial values so that every path of the ConvNet carries signal (else a missing context frame would change
the output by less than a float ulp), and its last convolution is scaled so that samples reach ~0.3 (below the clamp).

Tolerance: streamed and one-shot samples come from the same arithmetic per frame and per sample; what differs is the
order of sums inside matrix products and attention of different shapes (a chunk's few rows or a padded batch vs the
whole utterance's rows; a cache-shaped key set vs the full sequence). In float32 that moves samples by a few ulps of
the signal (~1e-7 measured at a 0.3 peak); ATOL = 1e-5 is 100x that and 1e4x below what one missing frame of left
context changes (checked below).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

from pipeline.errors import ConfigError, InvalidInputError, PipelineError
from pipeline.models.family import StreamStatus
from pipeline.models.qwen3_omni.code2wav_chunking import Code2WavChunking
from pipeline.models.qwen3_omni.code2wav_geometry import ConvGeometry
from pipeline.models.qwen3_omni.code2wav_stream import (
    Code2WavStreamStateError,
    StreamingCode2Wav,
    one_shot,
)
from pipeline.models.qwen3_omni.code2wav_transformer import KVWindow, transformer_step

ATOL = 1e-5
CODEBOOK = 32
QUANTIZERS = 16


def _tiny_model() -> Qwen3OmniMoeCode2Wav:
    torch.manual_seed(0)
    cfg = Qwen3OmniMoeCode2WavConfig(
        codebook_size=CODEBOOK,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=6,
        num_quantizers=QUANTIZERS,
        upsample_rates=[2, 3],
        upsampling_ratios=[2, 2],
        decoder_dim=16,
        max_position_embeddings=256,
    )
    model = Qwen3OmniMoeCode2Wav(cfg).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("gamma", ".scale")):
                param.fill_(0.5)
            elif name.endswith(("alpha", "beta")):
                param.normal_(0, 0.3)
        model.decoder[-1].conv.weight.mul_(3e4)
    return model


@pytest.fixture(scope="module")
def model() -> Qwen3OmniMoeCode2Wav:
    return _tiny_model()


def _frames(count: int, seed: int) -> torch.Tensor:
    return torch.randint(0, CODEBOOK, (count, QUANTIZERS), generator=torch.Generator().manual_seed(seed))


def _stream_all(synth: StreamingCode2Wav, frames: torch.Tensor, push: int, *, quick: bool = False) -> list[np.ndarray]:
    """Push ``push`` frames at a time, stepping whenever a chunk is ready; finish; step until done."""
    stream = synth.start(len(frames), quick=quick)
    chunks = []
    for start in range(0, len(frames), push):
        stream.push(frames[start : start + push])
        while stream.ready():
            chunks.append(stream.step())
    stream.finish()
    while not stream.done:
        chunks.append(stream.step())
    return chunks


# ---------------------------------------------------------------------------------------------------
# The ConvNet's index arithmetic


def test_geometry_sample_counts_match_the_forward(model):
    geometry = ConvGeometry.of(model)
    assert geometry.samples_per_frame == 24
    for frames in (1, 2, 7, 40):
        assert geometry.samples(frames) == one_shot(model, _frames(frames, frames)).size
        assert geometry.samples(frames) == frames * 24 - geometry.deficit
    assert 0 <= geometry.deficit < 24


def test_geometry_dependencies_match_autograd(model):
    """Which hidden frames each output sample reads, by the gradient of a float64 copy (structural: a zero gradient
    means no path, unlike a perturbation, whose far effects round away)."""
    geometry = ConvGeometry.of(model)
    convnet = _tiny_model().double()
    hidden = torch.randn(1, 32, 30, dtype=torch.float64, requires_grad=True)
    out = hidden
    for blocks in convnet.upsample:
        for block in blocks:
            out = block(out)
    for block in convnet.decoder:
        out = block(out)
    reach = 0
    for sample in range(0, out.shape[-1], 5):
        (grad,) = torch.autograd.grad(out[0, 0, sample], hidden, retain_graph=True)
        read = grad[0].abs().sum(0).nonzero()[:, 0]
        first, last = geometry.frames_read(sample)
        assert (int(read.min()), int(read.max())) == (max(first, 0), last)
        assert last < 30  # nothing past the frames given: every sample returned is final
        if first >= 0:
            reach = max(reach, sample // 24 - first)
    assert reach == geometry.left_context_frames == 20


def test_geometry_of_the_released_layout():
    """The released checkpoint's code2wav layout (``code2wav_config`` of Qwen3-Omni-30B-A3B: upsample_rates
    [8, 5, 4, 3], upsampling_ratios [2, 2]), built on the meta device."""
    cfg = Qwen3OmniMoeCode2WavConfig(
        hidden_size=1024, decoder_dim=1536, upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2], sliding_window=72
    )
    with torch.device("meta"):
        model = Qwen3OmniMoeCode2Wav(cfg)
    geometry = ConvGeometry.of(model)
    assert (geometry.samples_per_frame, geometry.deficit, geometry.left_context_frames) == (1920, 555, 10)


# ---------------------------------------------------------------------------------------------------
# The incremental transformer


def test_transformer_steps_equal_the_whole_pass(model):
    frames = _frames(30, 1)
    with torch.inference_mode():
        embeds = model.code_embedding(frames.T.unsqueeze(0) + model.code_offset).mean(1)
        whole = model.pre_transformer(inputs_embeds=embeds).last_hidden_state[0]
        for split in ([1] * 30, [7, 1, 2, 20], [30]):
            window, parts, at = KVWindow.empty(model), [], 0
            for n in split:
                hidden, (window,) = transformer_step(model, embeds[:, at : at + n], [n], [window])
                parts.append(hidden[0])
                at += n
            torch.testing.assert_close(torch.cat(parts), whole, rtol=0, atol=ATOL)
            assert window.frames == 30 and window.cached == model.config.sliding_window - 1


# ---------------------------------------------------------------------------------------------------
# Streams equal the one-shot decode


@pytest.mark.parametrize(
    "cfg",
    [Code2WavChunking(), Code2WavChunking(1, 1), Code2WavChunking(3, 5), Code2WavChunking(4, 8)],
    ids=["default", "1-1", "3-5", "4-8"],
)
@pytest.mark.parametrize("push", [1, 3, 40])
def test_stream_equals_one_shot(model, cfg, push):
    frames = _frames(37, 2)
    reference = one_shot(model, frames)
    chunks = _stream_all(StreamingCode2Wav(model, cfg), frames, push)
    assert all(c.dtype == np.float32 and c.size > 0 for c in chunks)
    np.testing.assert_allclose(np.concatenate(chunks), reference, rtol=0, atol=ATOL)


def test_chunk_sizes_follow_the_schedule(model):
    synth = StreamingCode2Wav(model, Code2WavChunking(first_chunk_frames=2, chunk_frames=3))
    chunks = _stream_all(synth, _frames(10, 3), push=1)
    deficit = synth.geometry.deficit
    assert [c.size for c in chunks] == [2 * 24 - deficit, 72, 72, 48]  # frames 2 + 3 + 3 + the last 2


def test_quick_first_chunk(model):
    cfg = Code2WavChunking(first_chunk_frames=3, chunk_frames=4, quick_first_chunk_frames=1)
    synth = StreamingCode2Wav(model, cfg)
    frames = _frames(20, 4)
    quick = synth.start(20, quick=True)
    assert quick.codes_until_ready() == 1
    quick.push(frames[:1])
    first = quick.step()
    assert first.size == 24 - synth.geometry.deficit
    chunks = _stream_all(synth, frames, push=1, quick=True)
    np.testing.assert_allclose(np.concatenate(chunks), one_shot(model, frames), rtol=0, atol=ATOL)
    assert synth.start(20).codes_until_ready() == 3  # a plain stream keeps the regular first chunk
    with pytest.raises(ConfigError):
        StreamingCode2Wav(model).start(20, quick=True)


def test_too_little_left_context_is_not_exact(model):
    """The equality above can fail: without the ConvNet's left context, chunk starts differ by far more than ATOL."""
    frames = _frames(37, 2)
    chunks = _stream_all(StreamingCode2Wav(model, Code2WavChunking(2, 4, left_context_frames=4)), frames, push=40)
    assert np.abs(np.concatenate(chunks) - one_shot(model, frames)).max() > 100 * ATOL


def test_step_many_equals_each_stream_alone(model):
    cfg = Code2WavChunking(first_chunk_frames=2, chunk_frames=3, quick_first_chunk_frames=1)
    synth = StreamingCode2Wav(model, cfg, max_batch=2)  # three streams: two passes
    utterances = [_frames(n, 10 + n) for n in (25, 9, 31)]
    streams = [synth.start(len(f), quick=i == 1) for i, f in enumerate(utterances)]
    out: list[list[np.ndarray]] = [[] for _ in streams]
    # streams at different points: the second is 5 frames ahead, the third starts late
    streams[1].push(utterances[1][:5])
    out[1] += [streams[1].step(), streams[1].step()]
    pushed = [0, 5, 0]
    while not all(s.done for s in streams):
        for i, (stream, frames) in enumerate(zip(streams, utterances)):
            if stream.status is StreamStatus.OPEN and (i != 2 or pushed[0] >= 6):
                stream.push(frames[pushed[i] : pushed[i] + 2])
                pushed[i] = min(pushed[i] + 2, len(frames))
                if pushed[i] == len(frames):
                    stream.finish()
        ready = [s for s in streams if s.ready()]
        for stream, chunk in zip(ready, synth.step_many(ready)):
            out[streams.index(stream)].append(chunk)
    for frames, chunks, i in zip(utterances, out, range(3)):
        alone = _stream_all(synth, frames, push=2, quick=i == 1)
        np.testing.assert_allclose(np.concatenate(chunks), np.concatenate(alone), rtol=0, atol=ATOL)
        np.testing.assert_allclose(np.concatenate(chunks), one_shot(model, frames), rtol=0, atol=ATOL)


def test_warm_up_leaves_no_state(model):
    synth = StreamingCode2Wav(model, max_batch=3)
    synth.warm_up(max_batch=3)
    frames = _frames(12, 5)
    np.testing.assert_allclose(
        np.concatenate(_stream_all(synth, frames, push=3)), one_shot(model, frames), rtol=0, atol=ATOL
    )


# ---------------------------------------------------------------------------------------------------
# States and errors


def test_codes_until_ready_counts_down(model):
    stream = StreamingCode2Wav(model, Code2WavChunking(first_chunk_frames=3, chunk_frames=2)).start(10)
    counts = []
    for frame in _frames(3, 6):
        counts.append(stream.codes_until_ready())
        assert not stream.ready()
        stream.push([frame.tolist()])
    assert counts == [3, 2, 1] and stream.codes_until_ready() == 0 and stream.ready()
    stream.step()
    assert stream.codes_until_ready() == 2 and stream.chunks_emitted == 1 and stream.codes_received == 3
    stream.finish()
    assert stream.codes_until_ready() is None and stream.done  # every frame pushed was decoded already


def test_empty_finished_stream_is_done_at_once(model):
    stream = StreamingCode2Wav(model).start(5)
    stream.push([])
    stream.finish()
    assert stream.done and stream.status is StreamStatus.DONE and not stream.ready()
    assert stream.codes_until_ready() is None
    assert one_shot(model, []).size == 0


def test_state_errors(model):
    synth = StreamingCode2Wav(model)
    stream = synth.start(8)
    with pytest.raises(Code2WavStreamStateError) as caught:
        stream.step()
    assert caught.value.code == "token2wav_stream_state" and isinstance(caught.value, PipelineError)
    stream.push(_frames(3, 7))
    stream.finish()
    stream.finish()  # idempotent
    with pytest.raises(Code2WavStreamStateError):
        stream.push(_frames(1, 8))
    while not stream.done:
        stream.step()
    with pytest.raises(Code2WavStreamStateError):
        stream.step()
    stream.close()
    stream.close()
    assert stream.status is StreamStatus.CLOSED
    with pytest.raises(Code2WavStreamStateError):
        stream.push(_frames(1, 9))
    with pytest.raises(ValueError):
        other = synth.start(4)
        other.push(_frames(2, 9))
        synth.step_many([other, other])
    with pytest.raises(ValueError):
        StreamingCode2Wav(model).step_many([other])


def test_step_many_refuses_before_changing_any_stream(model):
    synth = StreamingCode2Wav(model, Code2WavChunking(1, 1))
    ready, waiting = synth.start(4), synth.start(4)
    ready.push(_frames(1, 10))
    with pytest.raises(Code2WavStreamStateError):
        synth.step_many([ready, waiting])
    assert ready.chunks_emitted == 0 and ready.ready()


@pytest.mark.parametrize(
    "frames",
    [
        [[0] * (QUANTIZERS - 1)],  # a frame too narrow
        list(range(QUANTIZERS)),  # one frame not wrapped in a sequence
        [[CODEBOOK] + [0] * (QUANTIZERS - 1)],  # a code past the codebook
        [[-1] + [0] * (QUANTIZERS - 1)],
        torch.zeros(2, QUANTIZERS),  # floats
        [[0] * QUANTIZERS, [0] * 3],  # ragged
    ],
    ids=["narrow", "flat", "too-big", "negative", "float", "ragged"],
)
def test_push_validates_frames(model, frames):
    stream = StreamingCode2Wav(model).start(8)
    with pytest.raises(InvalidInputError):
        stream.push(frames)
    assert stream.codes_received == 0


def test_push_past_max_codes(model):
    stream = StreamingCode2Wav(model).start(2)
    stream.push(_frames(2, 11))
    with pytest.raises(InvalidInputError):
        stream.push(_frames(1, 12))
    with pytest.raises(InvalidInputError):
        StreamingCode2Wav(model).start(model.config.max_position_embeddings + 1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"first_chunk_frames": 0},
        {"chunk_frames": -1},
        {"chunk_frames": True},
        {"left_context_frames": -1},
        {"quick_first_chunk_frames": 0},
        {"quick_first_chunk_max_open": -1},
        {"first_chunk_frames": 1.5},
    ],
)
def test_chunking_validation(kwargs):
    with pytest.raises(ConfigError) as caught:
        Code2WavChunking(**kwargs)
    assert caught.value.param == next(iter(kwargs))


def test_synthesizer_validation(model):
    with pytest.raises(ConfigError):
        StreamingCode2Wav(model, max_batch=0)
    assert StreamingCode2Wav(model, Code2WavChunking(left_context_frames=3)).left_context_frames == 3
    assert StreamingCode2Wav(model).left_context_frames == ConvGeometry.of(model).left_context_frames

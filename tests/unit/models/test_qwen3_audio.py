"""Qwen3-Omni's user-audio input: the incremental log-mel features (pipeline/models/qwen3_omni/audio_features.py) equal
the checkpoint's processor over the whole message, and the AuT encoder fed one attention window at a time
(pipeline/models/qwen3_omni/audio_encoder.py), alone or batched with other messages' blocks, equals transformers'
``Qwen3OmniMoeAudioEncoder`` on the whole message; token counts are transformers'."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeAudioEncoderConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeAudioEncoder,
    _get_feat_extract_output_lengths,
)

from pipeline.errors import CheckpointError
from pipeline.models.common.log_mel import IncrementalLogMel
from pipeline.models.qwen3_omni.audio_encoder import EncoderWindows, Qwen3OmniBlockEncoder
from pipeline.models.qwen3_omni.audio_features import incremental_log_mel

SR = 16_000
N_WINDOW = 50  # the released value: 100-frame chunks, 13 tokens each (transformers hard-codes 13)
RELEASED = Qwen3OmniMoeAudioEncoderConfig(n_window=50, n_window_infer=800)
ATOL = 1e-5

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def tiny_config(n_window_infer: int = 300) -> Qwen3OmniMoeAudioEncoderConfig:
    """d_model 32, 2 layers; attention windows of 3 chunks (300 frames) so that a few seconds span several."""
    return Qwen3OmniMoeAudioEncoderConfig(
        d_model=32,
        encoder_layers=2,
        encoder_attention_heads=2,
        encoder_ffn_dim=64,
        downsample_hidden_size=8,
        output_dim=48,
        n_window=N_WINDOW,
        n_window_infer=n_window_infer,
        max_source_positions=64,
    )


@pytest.fixture(scope="module")
def tower() -> Qwen3OmniMoeAudioEncoder:
    """A tiny random encoder in fp32 whose biases are not zero (transformers initialises them to zero, which would
    hide the zero padding's effect) and whose attention is sharp enough that a wrong window shows."""
    torch.manual_seed(0)
    model = Qwen3OmniMoeAudioEncoder(tiny_config()).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.3 if p.ndim > 1 else 0.1
            base = 1.0 if "norm" in name and name.endswith("weight") else 0.0
            p.copy_(base + scale * torch.randn(p.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def extractor() -> WhisperFeatureExtractor:
    """The released Qwen3-Omni preprocessor settings (128 bins, Whisper defaults otherwise)."""
    return WhisperFeatureExtractor(feature_size=128, sampling_rate=SR, return_attention_mask=True)


def reference(tower, features: list[torch.Tensor]) -> torch.Tensor:
    """transformers' forward on messages (n_mels, T_i) packed along time, with their ``feature_lens``."""
    lens = torch.tensor([f.shape[1] for f in features], dtype=torch.long, device=features[0].device)
    return tower(input_features=torch.cat(features, dim=1), feature_lens=lens).last_hidden_state


def mel(n: int, seed: int) -> torch.Tensor:
    return torch.randn(128, n, generator=torch.Generator().manual_seed(seed))


def split(features: torch.Tensor, size: int) -> list[torch.Tensor]:
    return [features[:, s : s + size] for s in range(0, features.shape[1], size)]


def signal(n: int, seed: int) -> np.ndarray:
    """Noise getting louder, with a tone: the final floor differs from the early ones."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / SR
    ramp = np.linspace(0.01, 1.0, n)
    return (ramp * (0.1 * rng.standard_normal(n) + 0.3 * np.sin(2 * np.pi * 440.0 * t))).astype(np.float32)


def processor_features(extractor, pcm: np.ndarray) -> torch.Tensor:
    """What ``Qwen3OmniMoeProcessor`` feeds the model for one message: ``padding=True, truncation=False``, the
    frames of its ``feature_attention_mask``."""
    out = extractor(
        pcm, sampling_rate=SR, padding=True, truncation=False, return_attention_mask=True, return_tensors="pt"
    )
    return out["input_features"][0, :, : int(out["attention_mask"].sum())]


def stream(features: IncrementalLogMel, pcm: np.ndarray, piece: int) -> dict[int, float]:
    """Feed ``pcm`` in pieces as the engine does; returns the floor each block was ready with."""
    floors: dict[int, float] = {}
    for start in range(0, len(pcm), piece):
        features.append(pcm[start : start + piece])
        for k in range(len(floors), features.ready_blocks()):
            features.raw_block(k)
            floors[k] = features.running_floor
    features.finish()
    return floors


# --- token counts -----------------------------------------------------------------------------------------------


def test_token_counts_are_transformers():
    windows = EncoderWindows.of(RELEASED)
    assert (windows.chunk_frames, windows.block_frames, windows.tokens_per_chunk) == (100, 800, 13)
    frames = torch.arange(0, 2500)
    expected = _get_feat_extract_output_lengths(frames, RELEASED.n_window).tolist()
    assert [windows.tokens(int(n)) for n in frames] == expected
    encoder = Qwen3OmniBlockEncoder(Qwen3OmniMoeAudioEncoder(tiny_config()), device="cpu")
    assert [encoder.audio_tokens(n) for n in range(1, 301)] == expected[1:301]


def test_configs_whose_windows_cannot_match_the_reference_are_refused():
    with pytest.raises(CheckpointError, match="n_window_infer"):
        EncoderWindows.of(Qwen3OmniMoeAudioEncoderConfig(n_window=50, n_window_infer=99))
    with pytest.raises(CheckpointError, match="tokens per chunk"):
        EncoderWindows.of(Qwen3OmniMoeAudioEncoderConfig(n_window=20, n_window_infer=800))
    # a window that is not a whole number of chunks is cut to whole chunks, as the reference's integer ratio does
    assert EncoderWindows.of(Qwen3OmniMoeAudioEncoderConfig(n_window=50, n_window_infer=850)).block_frames == 800


# --- features ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n", [4_000, 16_000, 127_999, 128_000, 128_039, 128_040, 128_161, 200_000, 256_000, 300_123, 500_000]
)
def test_streamed_features_equal_the_processor(extractor, n):
    """Every block of one attention window, the tail and the whole message equal the processor's features of the
    whole message (lengths around the 8 s block, its look-ahead, a partial hop, beyond 30 s)."""
    pcm = signal(n, n)
    ref = processor_features(extractor, pcm)
    features = incremental_log_mel(extractor, RELEASED)
    floors = stream(features, pcm, piece=320 if n < 200_000 else 4_000)
    block = features.geometry.block_frames
    assert block == 800 and features.total_frames == ref.shape[1] == n // 160
    torch.testing.assert_close(features.one_shot_features(), ref, atol=ATOL, rtol=0)
    final = features.final_floor()
    for k in range(features.ready_blocks()):
        got = features.features(features.raw_block(k), final)
        torch.testing.assert_close(got, ref[:, k * block : (k + 1) * block], atol=ATOL, rtol=0)
    tail = features.features(features.raw_tail(), final)
    torch.testing.assert_close(tail, ref[:, features.ready_blocks() * block :], atol=ATOL, rtol=0)
    assert len(floors) == max(0, (n - 200 + 160) // (block * 160))  # each block once its look-ahead arrived
    for k, floor in floors.items():  # what the engine re-encodes at commit
        early = features.features(features.raw_block(k), floor)
        differs = float((early - ref[:, k * block : (k + 1) * block]).abs().max()) > ATOL
        assert features.block_changes(k, floor, atol=ATOL) == differs


def test_the_padding_convention_matters(extractor):
    """Qwen2.5-Omni's processor pads to 30 s, Qwen3-Omni's does not: a message keeps one frame fewer for a partial
    hop, and its last frame, whose window passes the end, sees the signal reflected instead of zeros."""
    pcm = signal(32_980, 3)  # the last kept frame's window ends 20 samples past the signal
    qwen3 = incremental_log_mel(extractor, RELEASED)
    qwen25 = IncrementalLogMel(extractor, block_frames=800)
    for features in (qwen3, qwen25):
        features.append(pcm)
        features.finish()
    assert (qwen3.total_frames, qwen25.total_frames) == (206, 207)
    diff = (qwen3.one_shot_features() - qwen25.one_shot_features()[:, :206]).abs().amax(dim=0)
    assert float(diff[-1]) > 1e-3


def test_a_feature_extractor_of_other_mel_bins_is_refused():
    with pytest.raises(CheckpointError, match="mel bins"):
        incremental_log_mel(WhisperFeatureExtractor(feature_size=80), RELEASED)


# --- the encoder ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("frames", [300, 301, 450, 600, 799, 1000, 1234])
@torch.inference_mode()
def test_blocks_encoded_one_by_one_equal_the_whole_message(tower, frames):
    """Window-sized blocks (3 chunks here, 8 s released), the last one shorter, concatenated."""
    encoder = Qwen3OmniBlockEncoder(tower, device="cpu")
    assert encoder.block_frames == 300
    features = mel(frames, frames)
    whole = reference(tower, [features])
    blockwise = torch.cat([encoder.encode_many([block])[0] for block in split(features, 300)])
    assert blockwise.shape == whole.shape == (_get_feat_extract_output_lengths(torch.tensor(frames), N_WINDOW), 48)
    torch.testing.assert_close(blockwise, whole, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_several_messages_blocks_batched_together(tower):
    """One encode_many over the blocks of four messages, interleaved, each message's tokens equal its own forward."""
    encoder = Qwen3OmniBlockEncoder(tower, device="cpu")
    messages = [mel(n, n) for n in (700, 300, 1234, 150)]
    pieces = [(m, block) for m, features in enumerate(messages) for block in split(features, 300)]
    order = sorted(range(len(pieces)), key=lambda i: (i * 7) % len(pieces))
    encoded = dict(zip(order, encoder.encode_many([pieces[i][1] for i in order]), strict=True))
    for m, features in enumerate(messages):
        got = torch.cat([encoded[i] for i in range(len(pieces)) if pieces[i][0] == m])
        torch.testing.assert_close(got, reference(tower, [features]), atol=ATOL, rtol=0)


@torch.inference_mode()
def test_smaller_blocks_would_not_be_exact(tower):
    """Why the block is the attention window: one-chunk blocks lose the attention across the window's chunks."""
    whole = reference(tower, [mel(600, 5)])
    per_chunk = torch.cat([reference(tower, [block]) for block in split(mel(600, 5), 100)])
    assert float((per_chunk - whole).abs().max()) > 1e-3


@torch.inference_mode()
def test_a_message_shorter_than_a_chunk_is_convolved_at_the_chunk_width(tower):
    """The reference pads a short chunk to its batch's longest chunk: beside any longer message (a prompt with one)
    it equals this encoder's result; alone (its own width) it differs a little (the module docstring's caveat)."""
    encoder = Qwen3OmniBlockEncoder(tower, device="cpu")
    short, longer = mel(57, 1), mel(230, 2)
    (got,) = encoder.encode_many([short])
    beside = reference(tower, [longer, short])[-got.shape[0] :]
    torch.testing.assert_close(got, beside, atol=ATOL, rtol=0)
    alone = reference(tower, [short])
    assert got.shape == alone.shape and float((got - alone).abs().max()) > 1e-4


@torch.inference_mode()
def test_streamed_features_through_the_encoder_equal_the_one_shot_path(tower, extractor):
    """The engine's path: features block by block as the audio arrives, each block encoded when ready, the tail at
    the end, equals transformers' encoder on the processor's features of the whole message."""
    pcm = signal(113_000, 7)  # 7.06 s: two 3 s windows and a tail
    features = incremental_log_mel(extractor, tower.config)
    assert features.geometry.block_frames == 300
    stream(features, pcm, piece=320)
    final = features.final_floor()
    blocks = [features.features(features.raw_block(k), final) for k in range(features.ready_blocks())]
    blocks.append(features.features(features.raw_tail(), final))
    encoder = Qwen3OmniBlockEncoder(tower, device="cpu")
    got = torch.cat(encoder.encode_many(blocks))
    torch.testing.assert_close(got, reference(tower, [processor_features(extractor, pcm)]), atol=1e-4, rtol=0)


def test_bad_blocks_are_refused(tower):
    encoder = Qwen3OmniBlockEncoder(tower, device="cpu")
    assert encoder.encode_many([]) == []
    for bad in (torch.zeros(128, 301), torch.zeros(128, 0), torch.zeros(80, 100), torch.zeros(128)):
        with pytest.raises(ValueError, match=r"\(128, 1..300\)"):
            encoder.encode_many([bad])
    encoder.capture()  # CPU: nothing to capture
    assert not encoder.captured


@cuda
@torch.inference_mode()
def test_graph_replays_equal_transformers(tower):
    tower = tower.to("cuda")
    try:
        encoder = Qwen3OmniBlockEncoder(tower, device="cuda", batch_sizes=(1, 4))
        encoder.capture()
        assert encoder.captured
        messages = [mel(n, n) for n in (700, 300, 57, 1000)]
        blocks = [block for features in messages for block in split(features, 300)]  # 9: replays of 4, 4 and 1
        encoded = encoder.encode_many([b.cuda() for b in blocks])
        at = 0
        for features in messages:
            n = len(split(features, 300))
            got = torch.cat(encoded[at : at + n])
            at += n
            want = reference(tower, [mel(230, 2).cuda(), features.cuda()])[-got.shape[0] :]  # a long one beside
            torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    finally:
        tower.to("cpu")

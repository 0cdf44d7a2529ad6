"""Incremental log-mel features (pipeline.models.common.log_mel) equal the reference
WhisperFeatureExtractor's one-shot features, whatever the chunking; blocks are claimed ready only once
their look-ahead arrived; block_changes says exactly which early blocks the final floor changes; and the
audio tower run block by block equals the tower run on the whole sequence."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
import soundfile as sf
import soxr
import torch
from transformers import WhisperFeatureExtractor

from pipeline.errors import InvalidAudioError
from pipeline.models.common.hf_parts import thinker_audio_tower
from pipeline.models.common.log_mel import (
    IncrementalLogMel,
    MelGeometry,
    MelStreamStatus,
    floor_for_max,
    virtual_signal,
)
from tests.helpers.paths import TESTS

SR = 16_000
HOP = 160  # 10 ms
BLOCK = 200  # frames per encoder block (2 * n_window)
HALF_WINDOW = 200  # n_fft // 2
ATOL = 1e-5
SPEECH_DIR = TESTS / "fixtures" / "speech"
SPEECH_FILES = sorted(json.loads((SPEECH_DIR / "manifest.json").read_text()))
LENGTHS_S = (0.05, 1.0, 1.99, 2.0, 2.0125, 4.5, 7.0, 29.9)
KINDS = ("noise", "sine", "speech")
CHUNKINGS = ("20ms", "100ms", "random")


@pytest.fixture(scope="module")
def extractor() -> WhisperFeatureExtractor:
    """The released Qwen2.5-Omni preprocessor settings (128 bins, Whisper defaults otherwise)."""
    return WhisperFeatureExtractor(feature_size=128, sampling_rate=SR, return_attention_mask=True)


def load_speech_16k(name: str) -> np.ndarray:
    pcm, rate = sf.read(SPEECH_DIR / name, dtype="float32")
    return soxr.resample(pcm, rate, SR).astype(np.float32)


_SPEECH_CACHE: dict[str, np.ndarray] = {}


def all_speech() -> np.ndarray:
    """Every fixture end to end at 16 kHz (~40 s; each has 0.3 s of silence before, 1 s after)."""
    if "all" not in _SPEECH_CACHE:
        _SPEECH_CACHE["all"] = np.concatenate([load_speech_16k(name) for name in SPEECH_FILES])
    return _SPEECH_CACHE["all"]


def make_signal(kind: str, n: int) -> np.ndarray:
    t = np.arange(n) / SR
    if kind == "noise":
        return (np.random.default_rng(n).standard_normal(n) * 0.1).astype(np.float32)
    if kind == "sine":  # tonal: the hardest case for float precision (bins far below the peak)
        return (0.5 * np.sin(2 * np.pi * 440.0 * t) + 0.01 * np.sin(2 * np.pi * 3150.0 * t)).astype(np.float32)
    speech = all_speech()[int(0.2 * SR) :]  # starts 0.1 s before the first word
    return np.pad(speech[:n], (0, max(0, n - len(speech))))


def chunk_sizes(chunking: str, n: int, seed: int) -> list[int]:
    if chunking == "20ms":
        step = [320]
    elif chunking == "100ms":
        step = [1600]
    else:
        step = list(np.random.default_rng(seed).integers(1, 4000, size=257))
    sizes, total, i = [], 0, 0
    while total < n:
        size = min(int(step[i % len(step)]), n - total)
        sizes.append(size)
        total, i = total + size, i + 1
    return sizes


_REF_CACHE: dict[tuple[str, int], tuple[torch.Tensor, int]] = {}


def reference(extractor, pcm: np.ndarray, key: tuple[str, int] | None = None) -> tuple[torch.Tensor, int]:
    """(features (n_mels, n), n) as the reference computes them: max_length padding up to 30 s,
    beyond it the documented padding="longest", truncation=False convention."""
    if key is not None and key in _REF_CACHE:
        return _REF_CACHE[key]
    if len(pcm) <= extractor.n_samples:
        kwargs = {"padding": "max_length"}
    else:
        kwargs = {"padding": "longest", "truncation": False}
    out = extractor(pcm, sampling_rate=SR, return_attention_mask=True, return_tensors="pt", **kwargs)
    n = int(out["attention_mask"].sum())
    result = (out["input_features"][0, :, :n], n)
    if key is not None:
        _REF_CACHE[key] = result
    return result


def needed_samples(k: int) -> int:
    """Spec: block k's last frame (index 200k+199, centred at its 160-sample hop) reads 200 samples past its centre."""
    return ((k + 1) * BLOCK - 1) * HOP + HALF_WINDOW


def stream(extractor, pcm: np.ndarray, sizes: list[int]) -> tuple[IncrementalLogMel, dict[int, float]]:
    """Feed ``pcm`` in ``sizes`` pieces as the engine would: after each piece compute every newly ready
    block and remember the floor it would be encoded with. Checks readiness after every piece."""
    mel = IncrementalLogMel(extractor)
    floors: dict[int, float] = {}
    pos = 0
    for size in sizes:
        mel.append(pcm[pos : pos + size])
        pos += size
        ready = mel.ready_blocks()
        assert ready == sum(1 for k in range(pos // (BLOCK * HOP) + 1) if needed_samples(k) <= pos), pos
        for k in range(len(floors), ready):
            mel.raw_block(k)
            floors[k] = mel.running_floor
    assert pos == len(pcm)
    mel.finish()
    return mel, floors


def check_against_reference(mel: IncrementalLogMel, floors: dict[int, float], ref: torch.Tensor, n: int) -> float:
    """All the equalities the engine relies on; returns the max abs difference of the one-shot features."""
    assert mel.total_frames == n
    one_shot = mel.one_shot_features()
    assert one_shot.dtype == torch.float32 and one_shot.shape == (ref.shape[0], n)
    err = float((one_shot - ref).abs().max()) if n else 0.0
    assert err <= ATOL
    final = mel.final_floor()
    n_blocks = mel.ready_blocks()
    assert n_blocks == n // BLOCK
    for k in range(n_blocks):
        ref_slice = ref[:, k * BLOCK : (k + 1) * BLOCK]
        assert float((mel.features(mel.raw_block(k), final) - ref_slice).abs().max()) <= ATOL
    tail = mel.features(mel.raw_tail(), final)
    assert tail.shape[1] == n - n_blocks * BLOCK
    if tail.shape[1]:
        assert float((tail - ref[:, n_blocks * BLOCK :]).abs().max()) <= ATOL
    for k, floor in floors.items():
        early = mel.features(mel.raw_block(k), floor)
        differs = float((early - ref[:, k * BLOCK : (k + 1) * BLOCK]).abs().max()) > ATOL
        assert mel.block_changes(k, floor, atol=ATOL) == differs, k
        assert mel.block_changes(k, floor) or not differs
    return err


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("seconds", LENGTHS_S)
@pytest.mark.parametrize("kind", KINDS)
def test_streamed_features_equal_reference(extractor, kind, seconds, chunking):
    n = round(seconds * SR)
    pcm = make_signal(kind, n)
    ref, n_frames = reference(extractor, pcm, key=(kind, n))
    mel, floors = stream(extractor, pcm, chunk_sizes(chunking, n, zlib.crc32(f"{kind}{n}".encode())))
    check_against_reference(mel, floors, ref, n_frames)
    assert len(floors) == max(0, (n - HALF_WINDOW + HOP) // (BLOCK * HOP))  # every block whose look-ahead arrived


@pytest.mark.parametrize(
    "n",
    [0, 1, 159, 160, 161, 31_839, 31_840, 32_000, 32_039, 32_040, 32_041, 479_999, 480_000, 480_001, 480_161, 505_123],
)
def test_edge_lengths_and_the_no_truncation_convention(extractor, n):
    """Frame-count edges (partial hops, block boundaries, the look-ahead, 30 s) and audio beyond 30 s,
    which follows padding="longest", truncation=False instead of being cut."""
    pcm = make_signal("noise", n)
    ref, n_frames = reference(extractor, pcm)
    mel, floors = stream(extractor, pcm, chunk_sizes("random", n, n))
    check_against_reference(mel, floors, ref, n_frames)
    assert n_frames == (-(-n // HOP) if n <= 480_000 else n // HOP)


@pytest.mark.parametrize("n", [16_159, 31_999, 64_150])
def test_global_max_covers_the_frames_after_the_kept_ones(extractor, n):
    """A click in the last samples is loudest in the reference frames past attention_mask.sum(): the final
    floor must come from them although no kept frame holds that max."""
    pcm = np.zeros(n, np.float32)
    pcm[:-90] = make_signal("noise", n - 90) * 1e-3
    pcm[-60:] = 0.9 * np.sign(np.sin(np.arange(60)))
    ref, n_frames = reference(extractor, pcm)
    mel, floors = stream(extractor, pcm, chunk_sizes("20ms", n, 0))
    check_against_reference(mel, floors, ref, n_frames)
    kept = [mel.raw_block(k) for k in range(mel.ready_blocks())] + [mel.raw_tail()]
    kept_max = float(np.concatenate(kept, axis=1).max())
    assert mel.final_floor() > floor_for_max(kept_max)


def test_block_changes_on_speech_fed_in_20ms(extractor, capsys):
    """Each spoken fixture as one user turn in 20 ms pieces: exact features, and how many of the blocks
    encoded before the end the final floor changes (printed: the engine re-encodes those)."""
    early = changed = 0
    lines = []
    for name in SPEECH_FILES:
        pcm = load_speech_16k(name)
        ref, n_frames = reference(extractor, pcm)
        mel, floors = stream(extractor, pcm, chunk_sizes("20ms", len(pcm), 0))
        check_against_reference(mel, floors, ref, n_frames)
        flags = [mel.block_changes(k, floor) for k, floor in floors.items()]
        early, changed = early + len(flags), changed + sum(flags)
        lines.append(f"{name}: {len(pcm) / SR:.2f} s, {len(flags)} early blocks, changed {flags}")
    with capsys.disabled():
        print(
            "\nblock_changes on speech (20 ms pieces):\n  "
            + "\n  ".join(lines)
            + f"\n  total: {changed}/{early} early blocks change under the final floor"
        )
    assert early >= 10


def test_floors_are_rounded_like_the_reference():
    raw = torch.tensor([0.1, -3.7, 2.3456789], dtype=torch.float32)
    for value in raw:
        assert floor_for_max(float(value)) == float(value - 8.0)


def test_virtual_signal_reflects_and_pads_like_the_reference():
    x = np.arange(1, 11, dtype=np.float32)
    padded = torch.nn.functional.pad(torch.from_numpy(np.pad(x, (0, 6)))[None, None], (4, 4), mode="reflect")[0, 0]
    got = virtual_signal(x, 16, 4, -4, 20)
    np.testing.assert_array_equal(got, padded.numpy())
    np.testing.assert_array_equal(virtual_signal(x, None, 4, -3, 5), [4, 3, 2, 1, 2, 3, 4, 5])
    with pytest.raises(ValueError):
        virtual_signal(x, None, 4, 0, 11)


def test_geometry_readiness_is_monotone_and_never_early():
    geo = MelGeometry(n_fft=400, hop=160, max_samples=480_000, block_frames=200)
    previous = 0
    for received in range(0, 200_000, 37):
        ready = geo.blocks_ready(received)
        assert ready >= previous
        assert ready == 0 or needed_samples(ready - 1) <= received
        assert needed_samples(ready) > received
        previous = ready


def test_tiny_chunks_and_empty_appends(extractor):
    pcm = make_signal("speech", 33_000)
    mel = IncrementalLogMel(extractor)
    for i in range(0, len(pcm), 7):
        mel.append(pcm[i : i + 7])
        mel.append(pcm[:0])
    assert mel.samples_received == len(pcm) and mel.ready_blocks() == 1
    mel.finish()
    ref, _ = reference(extractor, pcm)
    assert float((mel.one_shot_features() - ref).abs().max()) <= ATOL


def test_misuse_is_refused(extractor):
    mel = IncrementalLogMel(extractor)
    with pytest.raises(InvalidAudioError):
        mel.append(np.zeros(10, np.float64))
    with pytest.raises(InvalidAudioError):
        mel.append(np.zeros((10, 2), np.float32))
    with pytest.raises(InvalidAudioError):
        mel.append(np.array([0.0, np.nan], np.float32))
    mel.append(np.zeros(100, np.float32))
    with pytest.raises(IndexError):
        mel.raw_block(0)
    for call in (mel.raw_tail, mel.final_floor, mel.one_shot_features, lambda: mel.total_frames):
        with pytest.raises(RuntimeError):
            call()
    assert mel.status is MelStreamStatus.RECEIVING and mel.running_max == -np.inf
    mel.finish()
    mel.finish()
    assert mel.status is MelStreamStatus.FINISHED and mel.total_frames == 1
    with pytest.raises(RuntimeError):
        mel.append(np.zeros(10, np.float32))
    dithering = WhisperFeatureExtractor(feature_size=128, sampling_rate=SR, dither=1e-4)
    with pytest.raises(ValueError):
        IncrementalLogMel(dithering)


# --- the property the engine relies on: the audio tower is blockwise ----------------------------
@pytest.fixture(scope="module")
def tiny_checkpoint(tiny_model_dir):
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    return load_checkpoint(tiny_model_dir)


@pytest.mark.parametrize("seconds", [0.05, 2.0, 2.0125, 4.5, 7.0])
def test_encoder_blocks_equal_one_shot(tiny_checkpoint, seconds):
    """The thinker's audio tower on each 200-frame block and on the tail separately, concatenated, equals the
    tower on the whole feature sequence."""
    tower = thinker_audio_tower(tiny_checkpoint.thinker)
    block_frames = 2 * tiny_checkpoint.config.thinker_config.audio_config.n_window
    n = round(seconds * SR)
    mel, _ = stream(tiny_checkpoint.feature_extractor, make_signal("speech", n), chunk_sizes("100ms", n, 0))
    final = mel.final_floor()
    pieces = [mel.features(mel.raw_block(k), final) for k in range(mel.ready_blocks())]
    if mel.raw_tail().shape[1]:
        pieces.append(mel.features(mel.raw_tail(), final))
    assert block_frames == BLOCK == mel.geometry.block_frames

    def encode(features: torch.Tensor) -> torch.Tensor:
        lens = torch.tensor([features.shape[1]], dtype=torch.long)
        return tower(input_features=features, feature_lens=lens).last_hidden_state

    with torch.inference_mode():
        blockwise = torch.cat([encode(p) for p in pieces])
        whole = encode(mel.one_shot_features())
    assert whole.shape == blockwise.shape
    assert whole.shape[0] == tiny_checkpoint.audio_tokens_for_samples(n)
    torch.testing.assert_close(blockwise, whole, atol=1e-5, rtol=0)

"""Incremental Whisper log-mel features for streaming audio prefill, shared by the families.

A family's audio encoder works on independent blocks of ``block_frames`` mel frames (Qwen2.5-Omni: 200 frames = 2 s
at the 10 ms hop; Qwen3-Omni: one attention window, 800 frames = 8 s). The engine encodes each complete block while
the user is still speaking and, at commit, only the unfinished tail. :class:`IncrementalLogMel` computes the features
of those blocks so that, at the end, they are the reference processor's features of the whole signal, under one of
the two padding conventions the families' processors use:

- ``padding="max_length"`` (Qwen2.5-Omni)::

    WhisperFeatureExtractor(...)(pcm, sampling_rate=16000, return_attention_mask=True,
                                 padding="max_length", return_tensors="pt")

  the signal zero-padded to 30 s (``max_samples``); audio longer than that follows the ``"longest"`` convention
  below instead of being truncated;
- ``padding="longest"`` (Qwen3-Omni: ``padding=True, truncation=False``): the signal itself, no zero padding;

keeping the first ``attention_mask.sum()`` frames.

Reference arithmetic, reproduced here step by step (the reference takes its torch path whenever
torch is installed):

- centred STFT: frame ``i`` is the ``n_fft`` samples starting at sample ``i * hop - n_fft // 2`` of
  the padded signal (:meth:`MelGeometry.padded_length`), reflect-padded by ``n_fft // 2`` at both ends;
  the STFT's last frame is dropped, so the reference has ``padded_len // hop`` frames;
- power spectrum, ``mel_filters.T @ power``, ``log10(clamp(mel, 1e-10))``: the *raw* values;
- a GLOBAL floor ``max(raw over all frames) - 8`` (with ``"max_length"`` the max includes the frames that only see
  the zero padding, and the frames after ``attention_mask.sum()``), then ``(max(raw, floor) + 4) / 4``.

Two things make early blocks differ from one-shot ones, and the design answers both:

- look-ahead: the last frame of a block reaches ``n_fft // 2 - hop`` samples (40 at 16 kHz) past
  the block's end, so a block is *ready* only once those samples arrived
  (:meth:`MelGeometry.samples_needed`); its raw values are then final (they never touch the end
  of the signal) and are cached;
- the global floor: a block encoded early used the floor known then (``running_floor``); after
  :meth:`IncrementalLogMel.finish`, :meth:`IncrementalLogMel.block_changes` says whether the final
  floor changes that block's features, so the engine re-encodes only those blocks.

Precision: the STFT runs in torch float32 with the reference's own window (``torch.hann_window``)
and mel filters, one fixed-width batch of ``block_frames`` frames at a time. A numpy float64 STFT
would be *more* accurate but differs from the float32 reference by up to ~1e-5 on tonal signals
(low-power bins within 8 decades of the max carry the reference's float32 rounding); the
matrix product is also run at full block width because BLAS picks other summation orders for
very narrow products. On the CPUs tested the results are bit-identical to the reference.

With ``"longest"`` (and beyond 30 s with ``"max_length"``) nothing is cut, no zero padding is added, the end is
reflect-padded on the real signal, ``len // hop`` frames are kept and the global max covers exactly those frames.

Units: samples at the extractor's sampling rate (16 kHz mono float32), frames of ``hop`` samples
(10 ms), log10 mel power.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from pipeline.errors import InvalidAudioError

DYNAMIC_RANGE_LOG10 = 8.0
"""The reference floors every value at ``max - 8`` (80 dB below the loudest mel bin)."""
MEL_POWER_EPSILON = 1e-10
"""The reference clamps mel power to this before ``log10``."""
FEATURE_SHIFT = 4.0
"""The reference maps ``raw`` to ``(raw + 4) / 4``."""
FEATURE_SCALE = 4.0

Padding = Literal["max_length", "longest"]
"""The reference's padding convention (see the module docstring)."""


def floor_for_max(max_log10: float) -> float:
    """The reference's floor ``max - 8`` rounded as its float32 arithmetic rounds it."""
    return float(np.float32(max_log10) - np.float32(DYNAMIC_RANGE_LOG10))


def normalize_log_mel(raw: np.ndarray, floor: float) -> torch.Tensor:
    """``(max(raw, floor) + 4) / 4`` in float32, the reference's last two steps. ``raw``: (n_mels, T)
    log10 mel power; returns a new float32 tensor of the same shape."""
    values = torch.from_numpy(np.array(raw, dtype=np.float32))  # a copy: cached blocks are read-only
    return (torch.clamp(values, min=floor) + FEATURE_SHIFT) / FEATURE_SCALE


@dataclass(frozen=True)
class MelGeometry:
    """Frame and block arithmetic of the reference extractor (pure, no audio).

    Frame ``i``'s window covers signal samples ``[i * hop - n_fft // 2, i * hop - n_fft // 2 + n_fft)``;
    block ``k`` holds frames ``[k * block_frames, (k + 1) * block_frames)``. ``max_samples``: the length the
    ``"max_length"`` convention zero-pads to (unused with ``"longest"``).
    """

    n_fft: int
    hop: int
    max_samples: int
    block_frames: int
    padding: Padding = "max_length"

    def __post_init__(self) -> None:
        for name in ("n_fft", "hop", "max_samples", "block_frames"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.padding not in ("max_length", "longest"):
            raise ValueError(f"padding must be 'max_length' or 'longest', got {self.padding!r}")

    @property
    def half_window(self) -> int:
        return self.n_fft // 2

    def window_start(self, frame: int) -> int:
        return frame * self.hop - self.half_window

    def window_stop(self, frame: int) -> int:
        """Exclusive end (in signal samples) of frame ``frame``'s window."""
        return self.window_start(frame) + self.n_fft

    def samples_needed(self, block: int) -> int:
        """Samples that must have arrived before block ``block`` is final: the end of its last frame's window."""
        return self.window_stop((block + 1) * self.block_frames - 1)

    def blocks_ready(self, n_received: int) -> int:
        """Blocks whose every frame lies inside the ``n_received`` samples received so far."""
        last_stop_in_block0 = self.samples_needed(0)
        if n_received < last_stop_in_block0:
            return 0
        return (n_received - last_stop_in_block0) // (self.block_frames * self.hop) + 1

    def padded_length(self, n_samples: int) -> int:
        """Length of the signal the reference takes the STFT of: with ``"max_length"`` zero-padded to
        ``max_samples``, or the signal itself when longer (the no-truncation convention); with ``"longest"`` the
        signal itself."""
        if self.padding == "longest":
            return n_samples
        return max(n_samples, self.max_samples)

    def reference_frames(self, n_samples: int) -> int:
        """Frames the reference computes (and takes its max over): the STFT's frames minus the last."""
        return self.padded_length(n_samples) // self.hop

    def total_frames(self, n_samples: int) -> int:
        """Frames the reference keeps (its attention-mask sum): frames starting inside the audio,
        at most :meth:`reference_frames`."""
        return min(-(-n_samples // self.hop), self.reference_frames(n_samples))

    def frames_touching_audio(self, n_samples: int) -> int:
        """Frames ``[0, result)`` may see a non-zero sample; every later reference frame sees only
        padding zeros (their raw value is ``log10(1e-10)``)."""
        first_silent = -(-(n_samples + self.half_window) // self.hop)
        return min(first_silent, self.reference_frames(n_samples))


def virtual_signal(pcm: np.ndarray, padded_length: int | None, half_window: int, start: int, stop: int) -> np.ndarray:
    """Samples ``[start, stop)`` of the signal as the reference's centred STFT sees it.

    ``pcm``: the audio so far. Negative indices reflect at the start (``x[-i] = x[i]``); indices from
    ``len(pcm)`` to ``padded_length`` are zeros; indices at or past ``padded_length`` reflect at its
    end, and those past its reflect padding are zeros (no kept frame reads them). With
    ``padded_length`` None the end is unknown yet and ``stop`` must not pass ``len(pcm)``.
    """
    if padded_length is None and stop > len(pcm):
        raise ValueError(f"samples up to {stop} requested, only {len(pcm)} received")
    idx = np.arange(start, stop)
    idx = np.where(idx < 0, -idx, idx)
    if padded_length is not None:
        idx = np.where(idx >= padded_length, 2 * (padded_length - 1) - idx, idx)
        idx = np.where(np.arange(start, stop) >= padded_length + half_window, -1, idx)
    inside = (idx >= 0) & (idx < len(pcm))
    out = np.zeros(stop - start, dtype=np.float32)
    out[inside] = pcm[idx[inside]]
    return out


class MelStreamStatus(enum.Enum):
    """Where an :class:`IncrementalLogMel` is: RECEIVING (audio may still be appended), then FINISHED."""

    RECEIVING = "receiving"
    FINISHED = "finished"


class _PcmBuffer:
    """Append-only float32 buffer with amortised O(1) appends."""

    def __init__(self) -> None:
        self._data = np.zeros(16_000, dtype=np.float32)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def append(self, pcm: np.ndarray) -> None:
        needed = self._size + len(pcm)
        if needed > len(self._data):
            grown = np.zeros(max(needed, 2 * len(self._data)), dtype=np.float32)
            grown[: self._size] = self._data[: self._size]
            self._data = grown
        self._data[self._size : needed] = pcm
        self._size = needed

    def view(self) -> np.ndarray:
        return self._data[: self._size]


class IncrementalLogMel:
    """Log-mel features of a growing 16 kHz signal, block by block, equal to the one-shot reference.

    Calling order: any number of :meth:`append` (interleaved with :meth:`ready_blocks` /
    :meth:`raw_block` / :attr:`running_max`), then :meth:`finish` once, after which
    :attr:`total_frames`, :meth:`raw_tail`, :meth:`final_floor`, :meth:`block_changes` and
    :meth:`one_shot_features` are available. Not thread-safe; one instance per audio item.

    Typical engine use: after each append, for each newly ready block ``k``, encode
    ``features(raw_block(k), running_floor)`` and remember that floor; at commit, ``finish()``,
    encode the remaining blocks and ``features(raw_tail(), final_floor())``, and re-encode block
    ``k`` under ``final_floor()`` when ``block_changes(k, floor_used)``.
    """

    def __init__(self, feature_extractor: Any, *, block_frames: int = 200, padding: Padding = "max_length") -> None:
        if getattr(feature_extractor, "dither", 0.0):
            raise ValueError("a dithering feature extractor is random: its features cannot be reproduced")
        self.geometry = MelGeometry(
            n_fft=int(feature_extractor.n_fft),
            hop=int(feature_extractor.hop_length),
            max_samples=int(feature_extractor.n_samples),
            block_frames=block_frames,
            padding=padding,
        )
        self.sampling_rate = int(feature_extractor.sampling_rate)
        self.n_mels = int(feature_extractor.feature_size)
        # The reference converts the float64 filters to float32 and multiplies by their transpose view.
        self._mel_filters = torch.from_numpy(np.asarray(feature_extractor.mel_filters)).to(torch.float32)
        self._window = torch.hann_window(self.geometry.n_fft)
        self._pcm = _PcmBuffer()
        self._blocks: dict[int, np.ndarray] = {}
        self._running_max = -math.inf
        self.status = MelStreamStatus.RECEIVING
        self._tail: np.ndarray | None = None
        self._final_max: float | None = None

    # --- receiving ----------------------------------------------------------------------------
    @property
    def samples_received(self) -> int:
        return len(self._pcm)

    def append(self, pcm: np.ndarray) -> None:
        """Add samples (1-D float32, finite, at :attr:`sampling_rate`; any length, 0 included).
        Raises :class:`InvalidAudioError` for bad audio, RuntimeError after :meth:`finish`."""
        if self.status is not MelStreamStatus.RECEIVING:
            raise RuntimeError("append() after finish()")
        if not isinstance(pcm, np.ndarray) or pcm.dtype != np.float32 or pcm.ndim != 1:
            raise InvalidAudioError(
                f"expected a 1-D float32 array, got {getattr(pcm, 'dtype', type(pcm))} "
                f"with shape {getattr(pcm, 'shape', None)}",
                param="pcm",
            )
        if not np.isfinite(pcm).all():
            raise InvalidAudioError("audio contains NaN or infinite samples", param="pcm")
        self._pcm.append(pcm)

    def ready_blocks(self) -> int:
        """Number of leading blocks computable now with their final values. Before :meth:`finish`:
        blocks whose look-ahead samples arrived; after: every complete block of :attr:`total_frames`."""
        if self.status is MelStreamStatus.FINISHED:
            return self.total_frames // self.geometry.block_frames
        return self.geometry.blocks_ready(len(self._pcm))

    def raw_block(self, k: int) -> np.ndarray:
        """Raw log10 mel of block ``k`` (n_mels, block_frames) float32, before the global floor;
        computed once and cached (read-only array). Raises IndexError when ``k`` is not ready."""
        if not 0 <= k < self.ready_blocks():
            raise IndexError(f"block {k} is not ready ({self.ready_blocks()} ready)")
        if k not in self._blocks:
            block = self._compute_frames(k * self.geometry.block_frames)
            block.setflags(write=False)
            self._blocks[k] = block
            self._running_max = max(self._running_max, float(block.max()))
        return self._blocks[k]

    @property
    def running_max(self) -> float:
        """Max raw value over the frames computed so far (``-inf`` before any); never decreases."""
        return self._running_max

    @property
    def running_floor(self) -> float:
        """``running_max - 8`` rounded like the reference: the floor to use for a block encoded now."""
        return floor_for_max(self._running_max)

    def features(self, raw: np.ndarray, floor: float) -> torch.Tensor:
        """``(max(raw, floor) + 4) / 4`` as float32 (n_mels, T); see :func:`normalize_log_mel`."""
        return normalize_log_mel(raw, floor)

    # --- finished -----------------------------------------------------------------------------
    def finish(self) -> None:
        """No more audio: computes the remaining blocks, the tail and the reference's global max
        (which also covers frames past :attr:`total_frames` and the frames of pure zero padding).
        Idempotent."""
        if self.status is MelStreamStatus.FINISHED:
            return
        self.status = MelStreamStatus.FINISHED
        geo, n = self.geometry, len(self._pcm)
        frames_in_max = geo.reference_frames(n)
        block_maxima = [float(self.raw_block(k).max()) for k in range(self.ready_blocks())]
        tail_start = self.ready_blocks() * geo.block_frames
        # Frames after the last block that can see audio, in whole fixed-width batches.
        batches = [
            self._compute_frames(start) for start in range(tail_start, geo.frames_touching_audio(n), geo.block_frames)
        ]
        tail = np.concatenate(batches, axis=1) if batches else np.zeros((self.n_mels, 0), np.float32)
        tail_maxima = [float(tail[:, : frames_in_max - tail_start].max())] if batches else []
        self._running_max = max([self._running_max, *tail_maxima])
        silent = [self._silent_frame_value()] if geo.frames_touching_audio(n) < frames_in_max else []
        self._final_max = max([*block_maxima, *tail_maxima, *silent])
        self._tail = tail[:, : geo.total_frames(n) - tail_start]
        self._tail.setflags(write=False)

    @property
    def total_frames(self) -> int:
        """Frames of the final features (the reference's attention-mask sum). Only after :meth:`finish`."""
        self._require_finished("total_frames")
        return self.geometry.total_frames(len(self._pcm))

    def raw_tail(self) -> np.ndarray:
        """Raw log10 mel (n_mels, total_frames - ready_blocks() * block_frames) of the frames after the
        last complete block, with the reference's end-of-signal padding. Only after :meth:`finish`."""
        self._require_finished("raw_tail")
        assert self._tail is not None
        return self._tail

    def final_floor(self) -> float:
        """The reference's ``max - 8`` over every frame its max covers. Only after :meth:`finish`."""
        self._require_finished("final_floor")
        assert self._final_max is not None
        return floor_for_max(self._final_max)

    def block_changes(self, k: int, floor_used: float, *, atol: float = 0.0) -> bool:
        """Whether block ``k``'s features under ``floor_used`` differ from those under
        :meth:`final_floor` by more than ``atol`` anywhere (``atol=0``: any difference at all).
        Only after :meth:`finish`."""
        final = self.final_floor()
        if floor_used == final:
            return False
        raw = self.raw_block(k)
        diff = (self.features(raw, floor_used) - self.features(raw, final)).abs()
        return bool(diff.max() > atol)

    def one_shot_features(self) -> torch.Tensor:
        """The whole signal's features (n_mels, total_frames) under the final floor: what the
        reference extractor returns for the final signal. Only after :meth:`finish`."""
        raws = [self.raw_block(k) for k in range(self.ready_blocks())] + [self.raw_tail()]
        return self.features(np.concatenate(raws, axis=1), self.final_floor())

    # --- internals ----------------------------------------------------------------------------
    def _require_finished(self, what: str) -> None:
        if self.status is not MelStreamStatus.FINISHED:
            raise RuntimeError(f"{what} is only known after finish()")

    def _compute_frames(self, first_frame: int) -> np.ndarray:
        """Raw log10 mel of the ``block_frames`` frames from ``first_frame``, on the signal as known
        (end padding applied only once finished)."""
        geo = self.geometry
        n = len(self._pcm)
        padded_length = geo.padded_length(n) if self.status is MelStreamStatus.FINISHED else None
        start = geo.window_start(first_frame)
        stop = geo.window_stop(first_frame + geo.block_frames - 1)
        segment = virtual_signal(self._pcm.view(), padded_length, geo.half_window, start, stop)
        return self._log_mel(segment)

    def _log_mel(self, segment: np.ndarray) -> np.ndarray:
        """The reference's raw log-mel of consecutive frames of ``segment`` (already padded)."""
        stft = torch.stft(
            torch.from_numpy(segment),
            self.geometry.n_fft,
            self.geometry.hop,
            window=self._window,
            center=False,
            return_complex=True,
        )
        power = (stft.abs() ** 2).contiguous()
        mel = self._mel_filters.T @ power
        return torch.clamp(mel, min=MEL_POWER_EPSILON).log10().numpy()

    def _silent_frame_value(self) -> float:
        """Raw value of a frame that sees only zeros, through the same arithmetic."""
        geo = self.geometry
        silent = np.zeros(geo.window_stop(geo.block_frames - 1) - geo.window_start(0), dtype=np.float32)
        return float(self._log_mel(silent).max())

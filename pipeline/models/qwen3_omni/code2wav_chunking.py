"""code2wav's chunk schedule (the stage config's ``token2wav.chunking`` for Qwen3-Omni), apart from the synthesizer so
that reading a stage config imports no model code."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.errors import ConfigError

__all__ = ["Code2WavChunking"]


@dataclass(frozen=True)
class Code2WavChunking:
    """The chunk schedule of streaming code2wav, in codec frames (80 ms each).

    Chunk 0 takes ``first_chunk_frames``, later chunks ``chunk_frames`` (a finished stream's last chunk takes what is
    left). A chunk ending at frame ``b`` emits the samples up to ``b * samples_per_frame - deficit``: with the released
    checkpoint (1920 samples a frame, deficit 555) a first chunk of 1 frame plays 57 ms, of 2 frames 137 ms, and every
    later frame adds 80 ms. Defaults are chosen for latency: the first audio needs 2 talker frames (a 1-frame first
    chunk plays for less time than the talker takes to make the next chunk's frames, unless it is much faster than real
    time), and steady chunks of 4 frames (320 ms) keep each job's ConvNet window (4 + 11 frames) small while the
    talker stays ahead of the player; larger chunks cost less ConvNet work per second of audio (the left context is
    re-run once per chunk) and fewer jobs, at a longer wait for each chunk's frames.

    ``left_context_frames``: hidden frames re-run through the ConvNet before the frame of a chunk's first sample. None
    (default): what the checkpoint needs for exactness (:attr:`.ConvGeometry.left_context_frames`); a smaller value
    saves ConvNet work at the price of exactness near each chunk's start (the zero padding of the window stands in for
    the frames it leaves out); a larger one only adds work. The transformer never needs context (its cache is exact).

    ``quick_first_chunk_frames``: the first chunk of a stream opened with ``quick`` (the engine asks for it while at
    most ``quick_first_chunk_max_open`` other streams are open), e.g. 1 frame: audio after one talker step instead of
    ``first_chunk_frames``, for one more job per reply. None: off.
    """

    first_chunk_frames: int = 2
    chunk_frames: int = 4
    left_context_frames: int | None = None
    quick_first_chunk_frames: int | None = None
    quick_first_chunk_max_open: int = 0

    def __post_init__(self) -> None:
        _require_int(self, "first_chunk_frames", 1)
        _require_int(self, "chunk_frames", 1)
        _require_int(self, "quick_first_chunk_max_open", 0)
        if self.left_context_frames is not None:
            _require_int(self, "left_context_frames", 0)
        if self.quick_first_chunk_frames is not None:
            _require_int(self, "quick_first_chunk_frames", 1)

    def chunk_size(self, index: int) -> int:
        """Frames of chunk ``index`` (0-based) of an utterance (its last chunk may take fewer)."""
        return self.first_chunk_frames if index == 0 else self.chunk_frames

    def quick(self) -> Code2WavChunking:
        """The schedule of a stream opened with the quick first chunk."""
        if self.quick_first_chunk_frames is None:
            raise ConfigError("Code2WavChunking.quick_first_chunk_frames is not set", param="quick_first_chunk_frames")
        return replace(self, first_chunk_frames=self.quick_first_chunk_frames, quick_first_chunk_frames=None)


def _require_int(cfg: Code2WavChunking, name: str, minimum: int) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"Code2WavChunking.{name} must be an integer >= {minimum}, got {value!r}", param=name)

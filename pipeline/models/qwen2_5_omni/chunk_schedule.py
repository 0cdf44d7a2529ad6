"""Chunk planning for streaming token2wav: which mel frames can be synthesized next.

Pure arithmetic, no torch. Units: every ``*_frames`` quantity counts mel frames (Qwen2.5-Omni: 2 mel
frames per codec token, 240 samples per frame at 24 kHz, so 1 codec token = 480 samples = 20 ms);
``*_codes`` counts codec tokens and ``*_samples`` counts output samples.

A chunk has these ranges (half-open, absolute positions from the start of the utterance):

- ``frames``: the mel frames the chunk makes final. Over a stream these tile ``[0, total_frames)``.
- ``dit_context``: the frames the DiT runs on, ``frames`` widened by up to ``past_frames`` before and
  ``future_frames`` after (clipped to the utterance). The block attention of the DiT lets a frame see
  neighbouring blocks, so the extra frames make the chunk's frames close to what a one-shot pass gives.
- ``vocoder_frames``: the mel frames fed to the vocoder: ``frames`` preceded by up to
  ``vocoder_overlap_frames`` already-final frames, re-run so the vocoder sees left context; for each of the first
  ``lookahead_chunks`` chunks (not the last), followed by ``first_vocoder_lookahead_frames`` of its DiT look-ahead
  frames
  (provisional: the next chunk makes them final) as right context.
- ``samples``: the output samples the chunk emits. The vocoder's first ``vocoder_trim_frames`` frames of
  output are discarded (they lack left context; they were emitted by an earlier chunk) and, unless the
  chunk is the last, its final ``hold_frames = vocoder_overlap_frames - vocoder_trim_frames`` frames are held
  back (they lack right context) and emitted by the next chunk; a chunk with provisional right context holds back
  only ``hold_frames`` minus that look-ahead. Each chunk starts its samples where the previous one stopped
  (``emitted_frames``), so over a stream they tile ``[0, total_frames * samples_per_frame)``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.errors import ConfigError

__all__ = ["ChunkingConfig", "ChunkPlan", "FrameRange", "plan_next_chunk"]


@dataclass(frozen=True)
class ChunkingConfig:
    """Streaming token2wav settings. All sizes in mel frames unless the name says otherwise.

    ``first_chunk_frames`` defaults to 48 (two DiT blocks), below the official 72: the first audio then needs
    (48 + 24) / 2 = 36 codec tokens instead of (72 + 24) / 2 = 48, i.e. 12 fewer talker steps (~240 ms at
    real-time talker speed) before the first sample. The trade: the first chunk's last block is computed
    with one block of look-ahead where the official schedule computes it with two, so those frames deviate
    a little more from a one-shot pass; later chunks use the official 72/48/24 values. Alone, the first chunk
    emits 48 - 20 = 28 frames (280 ms; a frame is 10 ms) of audio; the packaged config also vocodes 20 of its
    look-ahead frames (``first_vocoder_lookahead_frames``), so it emits all 48 (480 ms) and its next chunk, 48
    frames after 24 more codes, has 200 ms more time before the player runs dry.
    ``ChunkingConfig(first_chunk_frames=72)`` is the official schedule.

    ``dit_block_frames`` is the DiT's attention block size; when given, the chunk, first-chunk and context
    sizes must be multiples of it so that chunk boundaries fall on block boundaries. ``frames_per_code``
    (DiT ``repeats``) and ``samples_per_frame`` (vocoder hop) are model facts; the streaming synthesizer
    checks them against the checkpoint.
    """

    first_chunk_frames: int = 48
    chunk_frames: int = 72
    ramp_frames: tuple[int, ...] = ()
    """Sizes of the chunks after the first, before ``chunk_frames`` takes over. Why: a short first chunk
    plays for less time than the talker needs to produce a full 72-frame chunk (plus look-ahead), so the
    player would starve; small early chunks keep the audio ahead of the player while the talker catches up.
    Deterministic: chunk boundaries depend only on the chunk index, never on code arrival times."""
    past_frames: int = 48
    future_frames: int = 24
    vocoder_overlap_frames: int = 40
    vocoder_trim_frames: int = 20
    ode_steps: int = 10
    guidance_scale: float = 0.5
    sway_coefficient: float = -1.0
    frames_per_code: int = 2
    samples_per_frame: int = 240
    dit_block_frames: int | None = None
    first_vocoder_lookahead_frames: int = 0
    """Frames of the first chunk's DiT look-ahead that the vocoder also runs, as provisional right context, so that the
    first chunk holds back only ``hold_frames`` minus these (none when >= ``hold_frames``): with a 24-frame first chunk
    and 20 here, the first audio is 240 ms long after 24 codes instead of 40 ms. The trade: the samples just before the
    first seam are computed from look-ahead mel frames that the next chunk recomputes (at most ``future_frames``)."""
    lookahead_chunks: int = 1
    """How many of a stream's first chunks are vocoded with ``first_vocoder_lookahead_frames`` of provisional look-ahead
    (at most ``1 + len(ramp_frames)``: never the steady chunks). With 1 only the first; with 3 and two ramp chunks,
    each ramp chunk also plays all of its frames (a 48-frame one 480 ms instead of 280), so a stream has 200 ms more
    audio in hand through the ramp, when it is shortest, at the price of a provisional seam after each of them."""
    quick_first_chunk_frames: int | None = None
    """A shorter first chunk for streams opened while token2wav is nearly idle (the engine asks for it when at most
    ``quick_first_chunk_max_open`` other streams are open): its stream uses :meth:`quick` (this first chunk, vocoded
    with ``hold_frames`` of its look-ahead, so it emits all of its frames). Why only then: 24 frames need 24 codes
    instead of 36 (12 fewer talker steps before the first audio, ~25 ms at one user on the H100), but every reply then
    makes one more token2wav job, which under load costs more than it saves. None: off."""
    quick_first_chunk_max_open: int = 0
    """Other open streams (replies still being synthesized) up to which a new stream gets the quick first chunk."""

    def __post_init__(self) -> None:
        if not isinstance(self.ramp_frames, tuple):  # YAML gives a list
            object.__setattr__(self, "ramp_frames", tuple(self.ramp_frames))
        for i, size in enumerate(self.ramp_frames):
            _require(isinstance(size, int) and size >= 1, "ramp_frames", f"[{i}] must be an integer >= 1")
            _require(
                size % self.frames_per_code == 0,
                "ramp_frames",
                f"[{i}] ({size}) must be a multiple of frames_per_code ({self.frames_per_code})",
            )
            if self.dit_block_frames:
                _require(
                    size % self.dit_block_frames == 0,
                    "ramp_frames",
                    f"[{i}] ({size}) must be a multiple of dit_block_frames ({self.dit_block_frames})",
                )
        for name in ("first_chunk_frames", "chunk_frames", "frames_per_code", "samples_per_frame"):
            _require(getattr(self, name) >= 1, name, "must be >= 1")
        for name in ("past_frames", "future_frames", "vocoder_overlap_frames", "vocoder_trim_frames"):
            _require(getattr(self, name) >= 0, name, "must be >= 0")
        # The RK4 solver integrates between time points; fewer than 2 points means no integration.
        _require(self.ode_steps >= 2, "ode_steps", "must be >= 2 (number of ODE time points)")
        _require(self.guidance_scale >= 0, "guidance_scale", "must be >= 0")
        _require(
            0 <= self.first_vocoder_lookahead_frames <= self.future_frames,
            "first_vocoder_lookahead_frames",
            f"must be in [0, future_frames ({self.future_frames})]",
        )
        _require(
            isinstance(self.lookahead_chunks, int) and 1 <= self.lookahead_chunks <= 1 + len(self.ramp_frames),
            "lookahead_chunks",
            f"must be an integer in [1, 1 + len(ramp_frames)] ({1 + len(self.ramp_frames)})",
        )
        _require(self.quick_first_chunk_max_open >= 0, "quick_first_chunk_max_open", "must be >= 0")
        if self.quick_first_chunk_frames is not None:
            _require(
                isinstance(self.quick_first_chunk_frames, int) and self.quick_first_chunk_frames >= 1,
                "quick_first_chunk_frames",
                "must be an integer >= 1",
            )
            _require_multiple(self, "quick_first_chunk_frames", self.frames_per_code, "frames_per_code")
            if self.dit_block_frames is not None:
                _require_multiple(self, "quick_first_chunk_frames", self.dit_block_frames, "dit_block_frames")
        _require(
            self.vocoder_trim_frames <= self.vocoder_overlap_frames,
            "vocoder_trim_frames",
            f"must be <= vocoder_overlap_frames ({self.vocoder_overlap_frames})",
        )
        # Chunks end on codec-token boundaries: the DiT consumes whole tokens.
        for name in ("first_chunk_frames", "chunk_frames", "past_frames", "future_frames"):
            _require_multiple(self, name, self.frames_per_code, "frames_per_code")
        if self.dit_block_frames is not None:
            _require(self.dit_block_frames >= 1, "dit_block_frames", "must be >= 1")
            for name in ("first_chunk_frames", "chunk_frames", "past_frames", "future_frames"):
                _require_multiple(self, name, self.dit_block_frames, "dit_block_frames")

    def chunk_size(self, index: int) -> int:
        """Frames made final by chunk ``index`` (0-based) of an utterance."""
        if index == 0:
            return self.first_chunk_frames
        if index <= len(self.ramp_frames):
            return self.ramp_frames[index - 1]
        return self.chunk_frames

    def vocoder_lookahead(self, index: int) -> int:
        """Provisional look-ahead frames the vocoder runs after chunk ``index`` (unless it is the last)."""
        return self.first_vocoder_lookahead_frames if index < self.lookahead_chunks else 0

    def quick(self) -> ChunkingConfig:
        """The schedule of a stream opened with the quick first chunk (``quick_first_chunk_frames``): that first chunk,
        its vocoder running ``hold_frames`` (at most ``future_frames``) of its look-ahead; everything else as here."""
        if self.quick_first_chunk_frames is None:
            raise ConfigError("ChunkingConfig.quick_first_chunk_frames is not set", param="quick_first_chunk_frames")
        return replace(
            self,
            first_chunk_frames=self.quick_first_chunk_frames,
            quick_first_chunk_frames=None,
            first_vocoder_lookahead_frames=min(self.hold_frames, self.future_frames),
        )

    def schedules(self) -> tuple[ChunkingConfig, ...]:
        """This schedule and, when ``quick_first_chunk_frames`` is set, its :meth:`quick` variant: what a synthesizer's
        streams may use (the shapes worth a CUDA graph are theirs together)."""
        return (self,) if self.quick_first_chunk_frames is None else (self, self.quick())

    @property
    def hold_frames(self) -> int:
        """Frames at the end of a non-final chunk whose audio waits for the next chunk (right context)."""
        return self.vocoder_overlap_frames - self.vocoder_trim_frames

    @property
    def first_audio_codes(self) -> int:
        """Codec tokens needed before the first chunk is ready (unless the stream finishes earlier):
        the first chunk plus its look-ahead, and at least one token beyond the chunk."""
        return self.codes_needed(0, frames_done=0)

    def codes_needed(self, index: int, *, frames_done: int) -> int:
        """Codec tokens an open stream needs before chunk ``index``, starting at frame ``frames_done``, is ready:
        its frames plus their look-ahead, and at least one token beyond them (what :func:`plan_next_chunk` asks)."""
        end = frames_done + self.chunk_size(index)
        need = end + max(self.future_frames, self.frames_per_code)
        return -(-need // self.frames_per_code)


def _require(ok: bool, name: str, what: str) -> None:
    if not ok:
        raise ConfigError(f"ChunkingConfig.{name} {what}", param=name)


def _require_multiple(cfg: ChunkingConfig, name: str, unit: int, unit_name: str) -> None:
    value = getattr(cfg, name)
    _require(value % unit == 0, name, f"({value}) must be a multiple of {unit_name} ({unit})")


@dataclass(frozen=True)
class FrameRange:
    """Half-open range ``[start, end)`` of mel frames (or samples, for ``ChunkPlan.samples``)."""

    start: int
    end: int

    def __len__(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class ChunkPlan:
    """One synthesizable chunk; see the module docstring for what each range means.

    Invariants: ``dit_context`` contains ``frames``; ``vocoder_frames.end == frames.end`` except for a first chunk
    with provisional look-ahead (``vocoder_frames.end <= dit_context.end``); ``samples`` lies inside ``frames``' span of
    ``vocoder_frames`` scaled to samples; ``dit_codes`` is ``dit_context`` in codec tokens.
    """

    index: int
    frames: FrameRange
    dit_context: FrameRange
    dit_codes: FrameRange
    vocoder_frames: FrameRange
    samples: FrameRange
    is_last: bool


def plan_next_chunk(
    cfg: ChunkingConfig,
    *,
    frames_done: int,
    codes_available: int,
    finished: bool,
    index: int = 0,
    emitted_frames: int | None = None,
) -> ChunkPlan | None:
    """The chunk that starts at ``frames_done`` (frames already final), or ``None`` if none is ready.

    ``codes_available`` codec tokens have arrived; ``finished`` says no more will come. A chunk is ready
    when its frames and its look-ahead context have arrived, or when the stream is finished (the tail is
    then shortened to what exists). Before ``finished``, a chunk also needs at least one code beyond its
    frames, so a chunk planned before the end is never the last one and the held-back vocoder tail is
    always flushed by a later chunk. Returns ``None`` when everything is planned (``frames_done`` equals the
    total and ``finished``) or more codes are needed. Never uses codes beyond ``codes_available``.
    ``index`` is the chunk's position in the utterance (the caller counts chunks): it picks the chunk's
    size (``ChunkingConfig.chunk_size``). ``emitted_frames``: frames whose samples earlier chunks emitted (the
    caller counts them; default: what they emit without ``first_vocoder_lookahead_frames``).
    """
    available = codes_available * cfg.frames_per_code
    if not 0 <= frames_done <= available or frames_done % cfg.frames_per_code:
        raise ValueError(f"frames_done={frames_done} is inconsistent with {codes_available} codes")
    if frames_done == available:
        return None  # everything planned, or waiting for codes
    size = cfg.chunk_size(index)
    end = frames_done + size
    if finished:
        end = min(end, available)
    elif available < end + cfg.future_frames or available <= end:
        return None
    if emitted_frames is None:
        emitted_frames = max(0, frames_done - cfg.hold_frames)
    if not 0 <= emitted_frames <= frames_done:
        raise ValueError(f"emitted_frames={emitted_frames} is inconsistent with frames_done={frames_done}")
    return _make_plan(
        cfg, index, frames_done, end, available, is_last=finished and end == available, emitted=emitted_frames
    )


def _make_plan(
    cfg: ChunkingConfig, index: int, start: int, end: int, available: int, *, is_last: bool, emitted: int
) -> ChunkPlan:
    context = FrameRange(max(0, start - cfg.past_frames), min(available, end + cfg.future_frames))
    lookahead = 0 if is_last else min(cfg.vocoder_lookahead(index), context.end - end)
    vocoder = FrameRange(max(0, start - cfg.vocoder_overlap_frames), end + lookahead)
    # Samples of the frames earlier chunks held back come first; this chunk's own last frames that lack right context
    # (hold_frames, less any provisional look-ahead) wait for the next one. Clipping at 0 covers short chunks.
    keep_from = emitted
    keep_to = end if is_last else max(emitted, end - max(0, cfg.hold_frames - lookahead))
    hop = cfg.samples_per_frame
    fpc = cfg.frames_per_code
    return ChunkPlan(
        index=index,
        frames=FrameRange(start, end),
        dit_context=context,
        dit_codes=FrameRange(context.start // fpc, context.end // fpc),
        vocoder_frames=vocoder,
        samples=FrameRange(keep_from * hop, keep_to * hop),
        is_last=is_last,
    )

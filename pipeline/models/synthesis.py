"""What the engine needs of a family's token2wav: a streaming synthesizer (:class:`StreamingSynthesizer`, made by
:meth:`pipeline.models.family.ModelFamily.token2wav`) and its per-utterance streams (:class:`Token2WavStream`, opened
by :meth:`pipeline.models.family.ModelFamily.start_stream`).

A stream is driven in this order: any interleaving of ``push(codes)`` and, whenever ``ready()``, one chunk (its
``step()`` or the synthesizer's ``step_many([...])``); then ``finish()``; then chunks until ``done``. ``close()`` may
come at any time (idempotent) and frees its tensors. Every chunk is float32 mono 24 kHz samples, contiguous with the
previous chunk's (possibly empty). The engine core or its token2wav worker thread calls these, never both at once on
one stream.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

import numpy as np

__all__ = ["ChunkSchedule", "StreamStatus", "StreamingSynthesizer", "Token2WavStream"]


class StreamStatus(enum.Enum):
    """Lifecycle of a token2wav stream, in order: OPEN -> FINISHED -> DONE; CLOSED from any state."""

    OPEN = "open"  # accepting codes
    FINISHED = "finished"  # no more codes; chunks may remain to synthesize
    DONE = "done"  # every sample emitted
    CLOSED = "closed"  # tensors released


class Token2WavStream(Protocol):
    """The synthesis of one utterance (the calling order is the module docstring's)."""

    status: StreamStatus
    codes_received: int
    """Codes pushed so far."""
    chunks_emitted: int
    """Chunks synthesized so far."""

    @property
    def done(self) -> bool:
        """Every sample was emitted (:attr:`status` is DONE)."""
        ...

    def push(self, codes: Sequence[int] | Sequence[Sequence[int]]) -> None:
        """Append the synthesizer's codes: ids (what the ``talker -> token2wav`` connector made), or for a family
        whose talker speaks in frames (:mod:`pipeline.models.frame_talker`) frames, one id per codebook each. Raises
        ``InvalidInputError`` past the stream's ``max_codes``, a ``PipelineError`` when it is not OPEN."""
        ...

    def finish(self) -> None:
        """No more codes: what is left becomes the last chunk(s). Idempotent."""
        ...

    def ready(self) -> bool:
        """Whether a chunk can be synthesized now."""
        ...

    def codes_until_ready(self) -> int | None:
        """How many more codes must come before the next chunk is ready (0: ready now); None when no code can
        matter any more (finished, done or closed)."""
        ...

    def step(self) -> np.ndarray:
        """Synthesize the next chunk and return its samples; a ``PipelineError`` when none is ready."""
        ...

    def close(self) -> None:
        """Release the stream's tensors; unusable afterwards. Idempotent."""
        ...


class ChunkSchedule(Protocol):
    """What the engine's scheduler reads of a synthesizer's chunk schedule."""

    quick_first_chunk_frames: int | None
    """Not None: a reply that finds token2wav idle may start with a smaller, quicker first chunk
    (``start_stream(..., quick=True)``); None: no quick first chunk."""
    quick_first_chunk_max_open: int
    """A quick first chunk only while at most this many other streams are open."""


class StreamingSynthesizer(Protocol):
    """A family's token2wav, set up once per engine from the stage config."""

    max_batch: int
    """Most streams one :meth:`step_many` call synthesizes in one batched pass."""
    cfg: ChunkSchedule

    def warm_up(self, max_batch: int = 1) -> None:
        """Compile and capture what the first chunks of up to ``max_batch`` streams need, so that no stream pays for
        it (engine start, before any stream opens). Raises ``ConfigError`` when a configured compile fails."""
        ...

    def step_many(self, streams: Sequence[Token2WavStream]) -> list[np.ndarray]:
        """The next chunk of each of ``streams`` (each ready, opened by this synthesizer, listed once), in order,
        equal to each stream's ``step()`` up to float rounding; checked before any stream changes."""
        ...

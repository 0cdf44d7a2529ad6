"""The lifecycle both families' token2wav streams share (:class:`pipeline.models.synthesis.Token2WavStream`): its
:class:`~pipeline.models.synthesis.StreamStatus` (OPEN -> FINISHED -> DONE, CLOSED from any state), its counters, and
the checks of the calls that change it. How codes are kept, when a chunk is ready and how it is made are the family's
stream's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from pipeline.errors import PipelineError
from pipeline.models.synthesis import StreamStatus

__all__ = ["CodecStream", "next_chunks"]


class CodecStream:
    """Status and counters of one utterance's stream of at most ``max_codes`` codes, opened by the synthesizer
    ``owner``.

    A family's stream sets :attr:`STATE_ERROR` (raised for a call its status does not allow) and :attr:`KIND` (its
    name in messages), and gives :meth:`_release` (drop every tensor), :meth:`_codes_needed` (the codes the next chunk
    needs in all, while OPEN), :meth:`_drained` (whether a stream finished now has no chunk left to make),
    :meth:`_next_chunk` (what the next chunk is, None when none is ready) and :meth:`_not_ready_message`. Not
    thread-safe: one thread drives a stream at a time.
    """

    STATE_ERROR: ClassVar[type[PipelineError]]
    KIND: ClassVar[str]

    def __init__(self, owner: Any, max_codes: int) -> None:
        self._owner = owner
        self.max_codes = max_codes
        self.status = StreamStatus.OPEN
        self.codes_received = 0
        """Codes pushed so far (Qwen3-Omni: codec frames)."""
        self.frames_done = 0
        """Frames the chunks so far synthesized, in the family's frame unit."""
        self.samples_emitted = 0
        self.chunks_emitted = 0

    @property
    def done(self) -> bool:
        """True once every sample of a finished stream was returned by ``step()``."""
        return self.status is StreamStatus.DONE

    def finish(self) -> None:
        """No more codes: what is left becomes the last chunk(s). Idempotent; DONE at once when no chunk is left."""
        if self.status is StreamStatus.OPEN:
            self.status = StreamStatus.FINISHED
            if self._drained():
                self._set_done()

    def ready(self) -> bool:
        """Whether ``step()`` would make a chunk now."""
        return self._next_chunk() is not None

    def codes_until_ready(self) -> int | None:
        """How many more codes ``push`` must bring before the next chunk is ready (0: ready now); None when no code
        can matter any more (the stream is finished, done or closed)."""
        if self.status is not StreamStatus.OPEN:
            return None
        return max(0, self._codes_needed() - self.codes_received)

    def close(self) -> None:
        """Release every tensor; the stream is unusable afterwards. Safe to call more than once."""
        self._release()
        self.status = StreamStatus.CLOSED

    def _set_done(self) -> None:
        self.status = StreamStatus.DONE
        self._release()

    def _require(self, status: StreamStatus, action: str) -> None:
        if self.status is not status:
            raise self.STATE_ERROR(f"cannot {action}() a {self.KIND} stream that is {self.status.value}")

    def _release(self) -> None:
        raise NotImplementedError

    def _codes_needed(self) -> int:
        raise NotImplementedError

    def _drained(self) -> bool:
        raise NotImplementedError

    def _next_chunk(self) -> Any:
        raise NotImplementedError

    def _not_ready_message(self) -> str:
        raise NotImplementedError


def next_chunks(owner: Any, streams: Sequence[CodecStream]) -> list[Any]:
    """The next chunk (:meth:`CodecStream._next_chunk`) of each of ``streams`` for one batched step of their
    synthesizer ``owner``, checked before any stream changes: ValueError when a stream is listed twice or was opened
    by another synthesizer, the stream's STATE_ERROR when one has no chunk ready."""
    if len({id(s) for s in streams}) != len(streams):
        raise ValueError("a stream is listed more than once")
    if any(s._owner is not owner for s in streams):
        raise ValueError(f"every stream must come from this {type(owner).__name__}")
    chunks = [s._next_chunk() for s in streams]
    for stream, chunk in zip(streams, chunks):
        if chunk is None:
            raise stream.STATE_ERROR(stream._not_ready_message())
    return chunks

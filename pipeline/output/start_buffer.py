"""Holding a reply's first audio until its player has enough in hand to play through a busy token2wav.

Why: a real-time player starts on a reply's first chunk and from then on needs every chunk before the audio in hand
runs out. Alone, the next chunk comes well within the first one's 480 ms. But when more conversations are busy than
one token2wav job holds (``token2wav.max_batch``), a reply's next chunk can wait for a whole job of other streams and
then its own: without this hold, on the H100, in a burst of 32 users, the first replies and those of the second
wave ran dry for 50-600 ms after their first chunk, whatever the job schedule. Holding the first chunks until
``target_ms`` of audio is made (the first two chunks for the packaged schedule) gives the player that much to play
while the rest are made; the first audio comes that much later, only under such a load.

Pure logic, no torch and no clock: the engine decides at a reply's first chunk whether to hold (:func:`holds_start`,
asked by the scheduler), and its output side (``OutputProcessor.emit_audio`` in ``pipeline/output/processor.py``)
passes each chunk it makes to :meth:`StartBuffer.add` and sends what that returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["StartBuffer", "holds_start"]

Chunk = TypeVar("Chunk")


def holds_start(target_ms: int | None, busy_others: int, min_busy: int) -> bool:
    """Whether a reply whose first chunk is made now holds it: a start buffer is configured (``target_ms``) and at
    least ``min_busy`` other conversations are busy (a user speaking, or a response running)."""
    if min_busy < 1:
        raise ValueError(f"min_busy must be >= 1, got {min_busy}")
    return bool(target_ms) and busy_others >= min_busy


@dataclass
class StartBuffer(Generic[Chunk]):
    """A reply's first chunks, held until they hold ``target_ms`` of audio.

    Contract: :meth:`add` takes the chunks in order with their length (ms) and returns ``[]`` while holding, then,
    the call that reaches ``target_ms``, every chunk held so far in order (the buffer is then spent: later calls
    raise). :meth:`release` hands out what is held when the reply's audio ends before the target (its last chunk
    made). A cancelled reply simply drops the buffer: nothing held was sent."""

    target_ms: float
    held: list[Chunk] = field(default_factory=list)
    held_ms: float = 0.0
    spent: bool = False

    def __post_init__(self) -> None:
        if self.target_ms <= 0:
            raise ValueError(f"target_ms must be > 0, got {self.target_ms}")

    def add(self, chunk: Chunk, ms: float) -> list[Chunk]:
        """Hold ``chunk`` (``ms`` of audio); the held chunks once they reach ``target_ms``, else ``[]``."""
        if self.spent:
            raise RuntimeError("the start buffer was already released")
        if ms < 0:
            raise ValueError(f"ms must be >= 0, got {ms}")
        self.held.append(chunk)
        self.held_ms += ms
        return self.release() if self.held_ms >= self.target_ms else []

    def release(self) -> list[Chunk]:
        """Every chunk held, in order; the buffer is spent."""
        chunks, self.held, self.spent = self.held, [], True
        return chunks

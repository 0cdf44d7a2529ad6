"""The scheduler's rules as pure functions over plain values: no model, no tensors, no clock.

Each answers one question the engine asks every step; :class:`pipeline.scheduler.scheduler.Scheduler` calls them with
what it knows of the responses and conversations, and the tests call them with hand-made values.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from pipeline.errors import EngineFailure, FunctionCallError, PipelineError

__all__ = [
    "ChainRow",
    "Cleanup",
    "FirstChunkRow",
    "chain_steps",
    "failure_cleanup",
    "first_chunks_alone",
    "quick_first_chunk",
    "round_robin",
    "talker_may_step",
]


@dataclass(frozen=True)
class FirstChunkRow:
    """A decoding response as the GPU-sharing rules see it."""

    talking: bool
    """It has a talker that has not made its last code."""
    first_chunk_in_worker: bool
    """Its first audio chunk is being made by the token2wav worker right now."""


def first_chunks_alone(rows: Sequence[FirstChunkRow]) -> bool:
    """Whether a step decodes nothing at all: every decoding response is a spoken reply whose first chunk the
    token2wav worker is making. Nothing else then needs the GPU, and decode steps beside that chunk would only slow
    it down while someone waits to hear it; their next tokens are needed for the second chunk, hundreds of
    milliseconds of audio later."""
    return bool(rows) and all(r.first_chunk_in_worker for r in rows)


def talker_may_step(rows: Sequence[FirstChunkRow]) -> bool:
    """Whether the talker steps at all this step: not when every reply still talking is one whose first chunk the
    token2wav worker is making (the same reason as :func:`first_chunks_alone`, for the talker alone, beside replies
    that only write text). With any other row talking, the GPU is shared anyway and everyone steps."""
    talking = [r for r in rows if r.talking]
    return not (talking and all(r.first_chunk_in_worker for r in talking))


@dataclass(frozen=True)
class ChainRow:
    """A talker row as the chain rule sees it."""

    next_is_pad: bool
    """Past its text: its next input is the text-pad vector (the same at every step)."""
    codes_until_ready: int | None
    """Codes its token2wav stream still needs before its next chunk is ready (None: no chunk pending)."""
    codes: int
    """Codes made so far."""


def chain_steps(
    rows: Sequence[ChainRow], *, limit: int, can_chain: bool, alone: bool, max_codes: int, min_codes: int
) -> int:
    """How many talker steps to queue at once (1: a step as usual). Only when ``alone`` (every live response is in
    this batch, no thinker row, prefill, token2wav job or engine command waits) and every row is past its text; the
    chain ends where a row's next chunk becomes ready (it goes to token2wav in this step, as without a chain), where
    its stop suppression ends (``min_codes``: the flag is one per chain) and at its most codes."""
    if limit <= 1 or not can_chain or not alone or not rows:
        return 1
    steps = limit
    for r in rows:
        if not r.next_is_pad:
            return 1
        if r.codes_until_ready is not None:
            steps = min(steps, r.codes_until_ready)
        steps = min(steps, max_codes - r.codes)
        if r.codes < min_codes:
            steps = min(steps, min_codes - r.codes)
    return max(1, steps)


def quick_first_chunk(*, enabled: bool, held: bool, open_streams: int, max_open: int) -> bool:
    """Whether a reply's audio starts with the quick first chunk: only while at most ``max_open`` other replies' audio
    is still being made, and not when the start buffer would hold it (a quick chunk would only be held: a job for
    nothing)."""
    return enabled and not held and open_streams <= max_open


def round_robin(items: Sequence, turn: int) -> list:
    """``items`` starting at ``turn`` (modulo their number), wrapping around: who goes first moves by one each step."""
    if not items:
        return []
    k = turn % len(items)
    return list(items[k:]) + list(items[:k])


def idle_owner(lru_owners: Iterable[Hashable], busy: set[Hashable], exclude: Hashable) -> Hashable | None:
    """The least recently used owner of a slot pool that is neither busy nor ``exclude``: the one that gives its slot
    up to a conversation that needs one."""
    for owner in lru_owners:
        if owner != exclude and owner not in busy:
            return owner
    return None


@dataclass(frozen=True)
class Cleanup:
    """What a response that ends leaves behind in its conversation (nothing dropped: a reply that ended normally or
    was cancelled keeps its item and the caches)."""

    drop_item: bool = False
    """Remove its reply item: it was refused before anything was generated."""
    drop_caches: bool = False
    """Drop its conversation's caches and KV slots: a stage may have died mid-update."""


def failure_cleanup(error: Exception, *, prefilling: bool) -> Cleanup:
    """What a response failing with ``error`` leaves behind: a refusal (a :class:`~pipeline.errors.PipelineError`
    other than an internal failure) while it was still prefilling leaves no trace; a malformed function call (the
    model's own output) keeps the caches, which are sound; any other failure drops the caches, never keeping a
    possibly corrupt one (an error that is no ``PipelineError`` is internal)."""
    internal = not isinstance(error, PipelineError) or isinstance(error, EngineFailure)
    if prefilling and not internal:
        return Cleanup(drop_item=True)
    return Cleanup(drop_caches=not isinstance(error, FunctionCallError))

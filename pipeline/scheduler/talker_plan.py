"""Planning the talker's part of one step: which conversations' talkers listen, which replies' talkers start (into
which slot), and how many talker steps are queued at once.

What the talker does in a step follows from state the plan can see: a talker starts once it has its first input (a
thinker vector queued, or one the step's thinker decode queues for a row of ``thinker_rows``), under the step's talker
prefill budget, into a talker slot; a batch row's next input is a reply vector, the text-end vector once, then
text-pad (:class:`~pipeline.step.talker_feed.TalkerFeed`). These functions read that state and decide; they touch
no tensor. Engine thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from pipeline.core.conversation_state import ConversationState
from pipeline.core.response_state import ResponseState
from pipeline.scheduler import policies
from pipeline.scheduler.kv_slots import KVSlots
from pipeline.scheduler.plan import TalkerListen, TalkerStart
from pipeline.scheduler.prefill_batch import PrefillJob

__all__ = ["chain_rows", "talker_listens", "talker_starts"]


def talker_listens(
    jobs: Iterable[PrefillJob],
    conversations: Mapping[str, ConversationState],
    slots: KVSlots,
    talker_reads: Callable[[list], list] | None,
) -> list[TalkerListen]:
    """The background chunks' conversations whose talker cache follows their thinker cache once the chunk ran, each
    with its talker slot (its own or a free one: listening never evicts). ``talker_reads(keys)``: the keys of the
    positions the talker reads (None: all); a talker with nothing new to read takes no slot."""
    listens = []
    for job in jobs:
        if job.response_id is not None:
            continue
        conv = conversations[job.conv_id]
        cached = conv.cached_keys + job.keys  # the cache was cropped to the chunk's start while planning it
        if not cached:
            continue
        if talker_reads is not None:
            keys = talker_reads(cached)
            if conv.common_prefix_of(conv.talker_keys, keys) == len(keys):
                continue
        slot = slots.talker_slot(conv, evict=False)
        if slot is not None:
            listens.append(TalkerListen(conv.id, slot))
    return listens


def talker_starts(
    rows: Sequence[ResponseState],
    *,
    thinker_rows: set[str],
    budget: int,
    slots: KVSlots,
    quick: Callable[[ConversationState, int], bool],
    open_streams: int,
) -> list[TalkerStart]:
    """The talkers of ``rows`` (in order) that start this step: each not started whose first input is there once
    the thinker decoded (``thinker_rows``: the rows it decodes, each of which queues a vector unless its reply is
    silent), while ``budget`` lasts (a start that finds no talker slot spends its share and waits for the next step).
    ``quick(conv, open_streams)``: whether its audio starts with the quick first chunk, ``open_streams`` counting the
    streams still open (each start opens one)."""
    starts = []
    for r in rows:
        talker = r.talker
        if talker.done or talker.started:
            continue
        if not talker.queue and (r.id not in thinker_rows or r.thinker.silent):
            continue  # no input yet: it waits (or, with its text over, its talker ends)
        if budget <= 0:
            continue
        budget -= 1
        slot = slots.talker_slot(r.conv, evict=True)
        if slot is None:
            continue
        starts.append(TalkerStart(r.id, r.conv.id, slot, quick(r.conv, open_streams)))
        open_streams += 1
    return starts


def chain_rows(rows: Sequence[ResponseState]) -> list[policies.ChainRow]:
    """The talker batch rows of a step without a thinker decode (no vector is queued meanwhile), as the chain rule sees
    them: each started talker with an input — a queued reply vector, else (its text over) text-end once, then
    text-pad."""
    batch = []
    for r in rows:
        talker = r.talker
        if talker.done or not talker.started:
            continue
        if talker.queue:
            is_pad = False
        elif not r.thinker.done and not r.thinker.silent:
            continue  # waits for the thinker: no row this step
        else:
            is_pad = talker.eos_sent
        stream = r.audio.stream
        batch.append(
            policies.ChainRow(
                next_is_pad=is_pad and stream is not None,
                codes_until_ready=stream.codes_until_ready() if stream else None,
                codes=r.codec_tokens,
            )
        )
    return batch

"""Which conversation holds which KV slot of the two decoder stages, and who gives one up when a pool is full.

:class:`KVSlots` is the scheduler's part that assigns slots: a conversation keeps its slots across turns; a response
that needs one takes a free slot, else the least recently used idle conversation's (:func:`policies.idle_owner`);
background work (a background prefill, a talker listening) only takes its own or a free one. Bookkeeping only: the
allocators (:class:`pipeline.runners.kv_pool.SlotAllocator`) hold no tensors, and a conversation that loses a slot
only forgets what it cached there. Engine thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pipeline.core.conversation_state import ConversationState
from pipeline.scheduler import policies

__all__ = ["KVSlots"]

log = logging.getLogger("pipeline.scheduler.scheduler")


class KVSlots:
    def __init__(self, thinker, talker, conversations: Mapping[str, ConversationState]) -> None:
        """``thinker``, ``talker``: the stages' slot allocators (the talker's None in an engine without a talker);
        ``conversations``: the live conversations by id (the scheduler's, read only)."""
        self.thinker = thinker
        self.talker = talker
        self._conversations = conversations

    def release(self, conv: ConversationState) -> None:
        """Forget the conversation's caches and give its KV slots back to the pools."""
        conv.free()
        self.thinker.release(conv.id)
        if self.talker is not None:
            self.talker.release(conv.id)
        conv.slot = conv.talker_slot = None

    def _idle_owner(self, allocator, exclude: ConversationState) -> ConversationState | None:
        """The least recently used conversation holding a slot of ``allocator`` that no response is using."""
        owners = [o for o in allocator.lru_owners() if o in self._conversations]
        busy = {o for o in owners if self._conversations[o].active_response is not None}
        owner = policies.idle_owner(owners, busy, exclude.id)
        return None if owner is None else self._conversations[str(owner)]

    def thinker_slot(self, conv: ConversationState, *, evict: bool) -> int | None:
        """The conversation's thinker slot; a free one, or (``evict``) one taken from the least recently used idle
        conversation, which is prefilled again at its next response. None while every slot is busy."""
        slot = self.thinker.acquire(conv.id)
        if slot is None and evict:
            victim = self._idle_owner(self.thinker, exclude=conv)
            if victim is not None:
                log.info("KV pool full: conversation %s loses its cache to %s", victim.id, conv.id)
                self.release(victim)
                slot = self.thinker.acquire(conv.id)
        if slot is not None and slot != conv.slot:
            conv.free()  # a new slot holds nothing yet
            conv.slot = slot
        return slot

    def talker_slot(self, conv: ConversationState, *, evict: bool) -> int | None:
        """The conversation's talker slot; a free one, or (``evict``) one taken from the least recently used
        conversation with no response, which loses only its talker cache. None while every slot is busy."""
        slot = self.talker.acquire(conv.id)
        if slot is None and evict:
            victim = self._idle_owner(self.talker, exclude=conv)
            if victim is not None:
                victim.crop_talker(0)
                self.talker.release(victim.id)
                victim.talker_slot = None
                slot = self.talker.acquire(conv.id)
        if slot is not None and slot != conv.talker_slot:
            conv.crop_talker(0)
            conv.talker_slot = slot
        return slot

    def thinker_slot_open(self, conv: ConversationState) -> bool:
        """Whether a background prefill of ``conv`` could get a thinker slot now (its own or a free one)."""
        return self.thinker.slot_of(conv.id) is not None or self.thinker.used < self.thinker.capacity

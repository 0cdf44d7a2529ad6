"""A fixed pool of KV-cache slots for one decoder stage (thinker or talker).

Each conversation that has something cached owns one slot: a row of ``max_len`` positions in every layer's
key and value tensors. The pool is allocated once, at engine start, so decode steps never allocate and a
CUDA graph can address any slot through an index tensor. What a slot holds is described outside the pool:
the conversation keeps the per-position keys (``ConversationState.cached_keys``), and its length is the
slot's logical length. Cropping a cache is therefore free — positions past the logical length are simply
overwritten later.

Layout per layer: ``(slots + 1, max_len, kv_heads, head_dim)``. The extra last row is a scratch slot: padded
rows of a captured batch write there, so they never touch a real conversation's cache.

Memory (bytes) = 2 * layers * (slots + 1) * max_len * kv_heads * head_dim * dtype size. On the CPU the
tensors are allocated but untouched pages are not committed by the OS, so a large pool costs what is used.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import torch

__all__ = ["KVPool", "SlotAllocator"]


class SlotAllocator:
    """Which slot belongs to which owner (a conversation id), with least-recently-used order.

    Pure bookkeeping, no tensors. ``acquire`` never evicts by itself: the engine decides which idle owner
    may lose its cache (``lru_owners``) and calls ``release``.
    """

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("a KV pool needs at least one slot")
        self.capacity = slots
        self._free = list(range(slots - 1, -1, -1))  # pop() hands out slot 0 first
        self._owners: OrderedDict[Hashable, int] = OrderedDict()

    def acquire(self, owner: Hashable) -> int | None:
        """The owner's slot (marked most recently used), a newly assigned one, or None when all are taken."""
        if owner in self._owners:
            self._owners.move_to_end(owner)
            return self._owners[owner]
        if not self._free:
            return None
        slot = self._free.pop()
        self._owners[owner] = slot
        return slot

    def slot_of(self, owner: Hashable) -> int | None:
        return self._owners.get(owner)

    def release(self, owner: Hashable) -> None:
        slot = self._owners.pop(owner, None)
        if slot is not None:
            self._free.append(slot)

    def lru_owners(self) -> list[Hashable]:
        """Owners from least to most recently used."""
        return list(self._owners)

    @property
    def used(self) -> int:
        return len(self._owners)


class KVPool:
    """Key and value tensors of every layer for ``slots`` conversations of up to ``max_len`` positions."""

    def __init__(
        self,
        *,
        layers: int,
        slots: int,
        max_len: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if max_len < 1:
            raise ValueError("a KV pool needs max_len >= 1")
        shape = (slots + 1, max_len, kv_heads, head_dim)
        self.keys = [
            torch.zeros(shape, dtype=dtype, device=device)
            if torch.device(device).type == "cuda"
            else torch.empty(shape, dtype=dtype, device=device)
            for _ in range(layers)
        ]
        self.values = [torch.zeros_like(k) if k.is_cuda else torch.empty_like(k) for k in self.keys]
        self.slots = SlotAllocator(slots)
        self.max_len = max_len
        self.scratch_slot = slots
        """Row that padded batch rows write to."""

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

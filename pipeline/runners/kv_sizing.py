"""How many conversations' KV caches a device holds: the rule behind ``kv_slots: auto``, as arithmetic.

Pure: plain numbers in, a :class:`KVPlan` out, no torch and no device. The engine's build
(:mod:`pipeline.runners.build`) gives it each decoder stage's slot shape, read from the loaded modules, and each CUDA
device's free memory once the weights are on it, before any pool is allocated or graph captured; the capacity table
of docs/engine.md ("How many conversations fit", ``scripts/kv_capacity.py``) gives it the released models' shapes.

The rule:

- One slot of a stage takes :attr:`SlotShape.bytes`: ``2 x layers x kv_heads x head_dim x dtype bytes x positions``
  of keys and values, plus one row of each of the stage's samplers' seen-token tables (one byte per vocabulary id). A
  pool of ``n`` slots allocates ``n + 1`` rows: the last is the scratch row padded batch rows write to.
- Every stage whose ``kv_slots`` is ``auto`` gets the same count ``n`` (a conversation holds a slot in each stage),
  cut to the stage's own ``limit`` where it has one (the talker's is ``token2wav.max_batch``: every talking reply fits
  in one token2wav job). ``n`` is the largest count up to ``max_slots`` for which each CUDA device that holds an auto
  stage has room for all its pools (the integer ones as given) within its free memory less ``reserve``.
- On the CPU, where untouched pages are never committed (a pool costs what is used), ``n`` is :data:`CPU_KV_SLOTS`.
- A stage with an integer ``kv_slots`` keeps it, and nothing is checked for it (its pool is allocated as before).
- No room for one conversation: :class:`~pipeline.errors.ConfigError` naming the settings that make room.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pipeline.errors import ConfigError

__all__ = [
    "CPU_KV_SLOTS",
    "FRAME_TALKER_OPENING_ROOM",
    "GIB",
    "KVPlan",
    "PoolRequest",
    "SlotShape",
    "StagePool",
    "largest_fitting",
    "plan_kv_pools",
    "talker_slot_positions",
]

GIB = 1 << 30
CPU_KV_SLOTS = 16
"""What ``kv_slots: auto`` means for a stage on the CPU (and the most it gives any auto stage when one of them is on
the CPU)."""
FRAME_TALKER_OPENING_ROOM = 16
"""Talker positions a frame talker's reply opening may take beyond its prompt and frames."""
_TALKER_OPENING = 2
"""A one-code-per-step talker's positions beyond the prompt and codes: the speaker's bos and the first reply vector."""


def talker_slot_positions(max_context: int, max_codes: int, *, frames: bool) -> int:
    """Positions of one talker KV slot: the thinker positions its prompt reads (at most the whole context), the reply's
    opening, then one per code (``frames``: a frame talker, one per frame)."""
    return max_context + max_codes + (FRAME_TALKER_OPENING_ROOM if frames else _TALKER_OPENING)


@dataclass(frozen=True)
class SlotShape:
    """What one KV slot of a decoder stage is made of."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    positions: int
    """The slot's length (``max_len``)."""
    table_bytes: int = 0
    """The stage's other per-slot device rows: its samplers' seen-token tables, one byte per vocabulary id."""

    @property
    def bytes(self) -> int:
        """Device bytes of one slot (one pool row)."""
        kv = 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes * self.positions
        return kv + self.table_bytes


@dataclass(frozen=True)
class PoolRequest:
    """One decoder stage's pool as configured: ``slots`` None is ``auto``; ``limit``: the most slots auto gives it
    (None: only ``max_slots``)."""

    stage: str
    device: str
    """``cpu`` or ``cuda:N`` (a concrete device)."""
    shape: SlotShape
    slots: int | None
    limit: int | None = None

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def rows(self, n: int) -> int:
        """Pool rows when auto stages get ``n`` slots (the scratch row included)."""
        slots = self.slots if self.slots is not None else min(n, self.limit if self.limit is not None else n)
        return slots + 1


@dataclass(frozen=True)
class StagePool:
    """One stage's pool as resolved."""

    stage: str
    device: str
    slots: int
    positions: int
    bytes: int
    """Device bytes of the whole pool: ``slots + 1`` rows of :attr:`SlotShape.bytes`."""
    auto: bool
    """Whether ``slots`` came from ``auto``."""


@dataclass(frozen=True)
class KVPlan:
    """Each decoder stage's resolved pool, and the memory it was sized in."""

    pools: tuple[StagePool, ...]
    """The thinker's first."""
    free: tuple[tuple[str, int], ...] = ()
    """Bytes free on each CUDA device that holds a pool, when the plan was made (empty on the CPU)."""
    reserve: int = 0
    """Bytes left outside the pools on each device for auto stages (``engine.kv_reserve_gib``)."""

    def pool(self, stage: str) -> StagePool | None:
        return next((p for p in self.pools if p.stage == stage), None)

    def slots(self, stage: str) -> int:
        """The stage's slot count (KeyError for a stage without a pool)."""
        pool = self.pool(stage)
        if pool is None:
            raise KeyError(stage)
        return pool.slots

    @property
    def free_after(self) -> dict[str, int]:
        """Bytes each CUDA device has free once the pools are allocated (what graphs, activations and token2wav
        find)."""
        return {device: free - sum(p.bytes for p in self.pools if p.device == device) for device, free in self.free}

    def summary(self) -> str:
        """The load's log line: ``KV pool: 8 conversations × 8192 positions (6.8 GiB thinker, 1.8 GiB talker); free
        after: 3.9 GiB``."""
        thinker = self.pools[0]
        parts = [f"{_size(thinker.bytes)} {thinker.stage}"]
        for pool in self.pools[1:]:
            apart = f" of {pool.slots} slots" if pool.slots != thinker.slots else ""
            parts.append(f"{_size(pool.bytes)} {pool.stage}{apart}")
        line = f"KV pool: {thinker.slots} conversations × {thinker.positions} positions ({', '.join(parts)})"
        after = self.free_after
        if not after:
            return line + "; on the CPU"
        where = ", ".join(f"{_size(b)} on {d}" for d, b in after.items()) if len(after) > 1 else _size(*after.values())
        line += f"; free after: {where}"
        if any(p.auto for p in self.pools):
            line += f" (kv_slots auto: {_size(self.reserve)} kept for graphs, activations and token2wav)"
        return line


def largest_fitting(fits: Callable[[int], bool], upper: int) -> int:
    """The largest ``n`` in ``0 .. upper`` with ``fits(n)`` (0 when none), for a ``fits`` true up to some ``n`` and
    false beyond."""
    low, high = 0, upper
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def plan_kv_pools(requests: Sequence[PoolRequest], *, free: Mapping[str, int], reserve: int, max_slots: int) -> KVPlan:
    """The pools of ``requests`` (the thinker's first) resolved by the module's rule. ``free``: bytes free on each CUDA
    device (needed for those that hold an auto stage); ``reserve``: bytes each such device keeps outside the pools;
    ``max_slots``: the most slots auto gives a stage. :class:`ConfigError` (``param``: the first auto stage's
    ``kv_slots`` on the device that lacks room) when auto cannot give one slot."""
    auto = [r for r in requests if r.slots is None]
    n = 0
    if auto:
        upper = max_slots if all(r.on_cuda for r in auto) else min(max_slots, CPU_KV_SLOTS)
        devices = list(dict.fromkeys(r.device for r in auto if r.on_cuda))
        for device in devices:
            if device not in free:
                raise ValueError(f"no free memory given for {device}")

        def fits(k: int) -> bool:
            return all(_room(requests, d, k) <= free[d] - reserve for d in devices)

        n = largest_fitting(fits, upper)
        if n < 1:
            short = next(d for d in devices if _room(requests, d, 1) > free[d] - reserve)
            raise _no_room(requests, short, free[short], reserve)
    pools = tuple(
        StagePool(
            stage=r.stage,
            device=r.device,
            slots=r.rows(n) - 1,
            positions=r.shape.positions,
            bytes=r.rows(n) * r.shape.bytes,
            auto=r.slots is None,
        )
        for r in requests
    )
    held = dict.fromkeys(r.device for r in requests if r.on_cuda)
    return KVPlan(pools, tuple((d, free[d]) for d in held if d in free), reserve)


def _room(requests: Sequence[PoolRequest], device: str, n: int) -> int:
    """Bytes the pools on ``device`` take when auto stages get ``n`` slots."""
    return sum(r.rows(n) * r.shape.bytes for r in requests if r.device == device)


def _no_room(requests: Sequence[PoolRequest], device: str, free: int, reserve: int) -> ConfigError:
    here = [r for r in requests if r.device == device]
    first = next(r for r in here if r.slots is None)
    takes = ", ".join(f"{_size(r.rows(1) * r.shape.bytes)} {r.stage}" for r in here)
    return ConfigError(
        f"kv_slots is auto, but {device} has no room for one conversation: {_size(free)} free after the weights, "
        f"engine.kv_reserve_gib keeps {_size(reserve)}, and the pools of one conversation of "
        f"{first.shape.positions} positions (with their scratch rows) take {takes}. Lower "
        "stages.thinker.max_context_tokens, stages.talker.max_tokens or engine.kv_reserve_gib, or put a stage on "
        "another device",
        param=f"stages.{first.stage}.kv_slots",
    )


def _size(nbytes: int) -> str:
    """Bytes in GiB (one decimal), or MiB below 1 GiB."""
    if abs(nbytes) >= GIB:
        return f"{nbytes / GIB:.1f} GiB"
    return f"{nbytes / (1 << 20):.0f} MiB"

"""Which engine a new session goes to, and how many sessions each engine takes: pure, no I/O.

A server runs one engine or several (data parallel: one engine per GPU, ``--data-parallel-size``). Each session
is placed on one engine when it is admitted and stays there for its life: its conversation's KV cache lives in
that engine. :class:`EngineSlots` admits sessions over the engines; it has the interface of
:class:`realtime.server.limits.SessionSlots` (``limit``, ``active``, ``try_acquire``, ``refusal``), so the WebSocket
endpoint and the WebRTC calls take their slots from it alike.

Admission, in order (the first that fails names the refusal):

1. the server's total, ``max_sessions`` (``session_limit_reached``, :class:`realtime.server.limits.SessionSlots`);
2. an engine still serving (:attr:`PlacementCode.NO_ENGINE_AVAILABLE`: every engine failed);
3. an engine below its session capacity, ``max_sessions_per_engine`` (:attr:`PlacementCode.ENGINE_CAPACITY_REACHED`).

Headroom (:func:`choose_engine`): the serving engine with the most free session capacity; ties go to the one with
the fewest live responses (as its engine last reported them), then to the lowest index. With equal capacities this
spreads sessions evenly and, among equals, prefers the engine doing the least generation now.

An engine that fails (:meth:`EngineSlots.fail`) takes no new session; each of its sessions' slots runs the
callback its holder registered (:meth:`EngineSlot.on_engine_failure`), which ends that session. A failed engine may
be replaced (:meth:`EngineSlots.replace`, after :meth:`EngineSlots.restarting`): the new one serves new sessions from
zero; the failed one's sessions keep their own engine and end as before, their slots counting against nothing of it.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from realtime.errors import ErrorType, LimitExceeded, RealtimeError
from realtime.server.limits import SessionSlot, SessionSlots

logger = logging.getLogger(__name__)

E = TypeVar("E")


class PlacementCode(enum.StrEnum):
    """Wire error codes of engine placement (the ``error.code`` field, and ``/metrics`` refusal reasons)."""

    ENGINE_CAPACITY_REACHED = "engine_capacity_reached"
    """Every serving engine holds its ``max_sessions_per_engine`` sessions."""
    NO_ENGINE_AVAILABLE = "no_engine_available"
    """Every engine has failed (and none is restarted yet): the server serves nothing for now."""
    ENGINE_FAILED = "engine_failed"
    """The engine serving this session failed; the session ends (a new one goes to a surviving engine)."""


class EngineState(enum.StrEnum):
    """An engine's place in admission, in the order it moves through them (a replaced engine is serving again)."""

    SERVING = "serving"
    FAILED = "failed"
    """Its process died or it was closed: it takes no session; its sessions are being ended."""
    RESTARTING = "restarting"
    """A new engine is loading in its place: it takes no session until :meth:`EngineSlots.replace`."""


class NoEngineAvailable(RealtimeError):
    type = ErrorType.SERVER
    code = PlacementCode.NO_ENGINE_AVAILABLE


class EngineFailed(RealtimeError):
    """What a session whose engine failed is told before it is closed."""

    type = ErrorType.SERVER
    code = PlacementCode.ENGINE_FAILED


@dataclass(frozen=True)
class EngineLoad:
    """One engine as placement sees it."""

    index: int
    state: EngineState
    sessions: int
    capacity: int
    responses: int = 0
    """Live responses at the engine's last stats report (0 before any)."""

    @property
    def free(self) -> int:
        return max(self.capacity - self.sessions, 0)


def choose_engine(loads: Sequence[EngineLoad]) -> int | None:
    """The index of the engine with the most headroom (module docstring), or ``None`` when no serving engine has a
    free session slot."""
    open_ = [load for load in loads if load.state is EngineState.SERVING and load.free > 0]
    if not open_:
        return None
    return min(open_, key=lambda load: (-load.free, load.responses, load.index)).index


class EngineSlot(SessionSlot, Generic[E]):
    """One admitted session, placed on engine :attr:`index` (:attr:`engine`) for its life. :meth:`release` (or
    leaving the ``with`` block) frees it, once."""

    def __init__(self, slots: EngineSlots[E], total: SessionSlot, index: int) -> None:
        super().__init__(slots._total)
        self._engine_slots = slots
        self._total_slot = total
        self.index = index
        self.engine: E = slots.engines[index]
        """The engine this session is placed on, for its life (a replacement at :attr:`index` is not it)."""
        self._on_failure: Callable[[], None] | None = None

    def on_engine_failure(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (once, on the event loop, no I/O in it: it should only signal the session to end) if
        this slot's engine fails while the slot is held; at once if it has failed already."""
        self._on_failure = callback
        if self._engine_slots.engine_failed(self) and not self._released:
            callback()

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._total_slot.release()
            self._engine_slots._release(self)

    def _engine_failed(self) -> None:
        if self._on_failure is not None and not self._released:
            self._on_failure()


class EngineSlots(Generic[E]):
    """Admission of sessions over ``engines`` (module docstring): at most ``max_sessions`` in all and
    ``capacity`` on each engine. Not thread-safe: used from the event loop."""

    def __init__(self, engines: Sequence[E], *, max_sessions: int, capacity: int) -> None:
        if not engines:
            raise ValueError("at least one engine is needed")
        if capacity < 1:
            raise ValueError(f"the sessions per engine must be >= 1, got {capacity}")
        self.engines: tuple[E, ...] = tuple(engines)
        self.capacity = capacity
        self._total = SessionSlots(max_sessions)
        self._states = [EngineState.SERVING] * len(self.engines)
        self._responses = [0] * len(self.engines)
        self._held: list[set[EngineSlot[E]]] = [set() for _ in self.engines]
        self._last_refusal: RealtimeError = self._total.refusal()
        self._closed_with: RealtimeError | None = None

    @property
    def limit(self) -> int:
        """The server's total session limit."""
        return self._total.limit

    @property
    def active(self) -> int:
        return self._total.active

    def state(self, index: int) -> EngineState:
        return self._states[index]

    def sessions(self, index: int) -> int:
        return len(self._held[index])

    @property
    def serving(self) -> int:
        """Engines still serving."""
        return sum(state is EngineState.SERVING for state in self._states)

    def loads(self) -> list[EngineLoad]:
        return [
            EngineLoad(i, self._states[i], len(self._held[i]), self.capacity, self._responses[i])
            for i in range(len(self.engines))
        ]

    def report_responses(self, index: int, responses: int) -> None:
        """The engine's live responses, from its latest stats (the placement's tie-break)."""
        self._responses[index] = responses

    def close_admission(self, refusal: RealtimeError) -> None:
        """From now on every admission is refused with ``refusal`` (a drain: the server is going away); live
        sessions keep their slots until they end. Idempotent (the first refusal stays)."""
        if self._closed_with is None:
            self._closed_with = refusal

    @property
    def admission_closed(self) -> bool:
        return self._closed_with is not None

    def admit(self) -> EngineSlot[E] | RealtimeError:
        """A slot on the engine with the most headroom, or the error saying why there is none."""
        if self._closed_with is not None:
            return self._closed_with
        total = self._total.try_acquire()
        if total is None:
            return self._total.refusal()
        index = choose_engine(self.loads())
        if index is None:
            total.release()
            return self._refusal_without_engine()
        slot: EngineSlot[E] = EngineSlot(self, total, index)
        self._held[index].add(slot)
        return slot

    def try_acquire(self) -> EngineSlot[E] | None:
        """:meth:`admit` as :class:`SessionSlots` offers it: ``None`` when refused (:meth:`refusal` says why)."""
        admitted = self.admit()
        if isinstance(admitted, EngineSlot):
            return admitted
        self._last_refusal = admitted
        return None

    def refusal(self) -> RealtimeError:
        """Why the last :meth:`try_acquire` returned ``None``."""
        return self._last_refusal

    def _refusal_without_engine(self) -> RealtimeError:
        if self.serving == 0:
            return NoEngineAvailable("no engine of this server is serving (every one failed); try again later")
        return LimitExceeded(
            f"every engine of this server is serving its maximum of {self.capacity} sessions; try again later",
            code=PlacementCode.ENGINE_CAPACITY_REACHED,
        )

    def engine_failed(self, slot: EngineSlot[E]) -> bool:
        """Whether ``slot``'s own engine has failed (it is not serving, or another engine has replaced it)."""
        return self.engines[slot.index] is not slot.engine or self._states[slot.index] is not EngineState.SERVING

    def restarting(self, index: int) -> None:
        """Failed engine ``index`` is being replaced (it still takes no session)."""
        if self._states[index] is EngineState.SERVING:
            raise ValueError(f"engine {index} is serving: only a failed engine is restarted")
        self._states[index] = EngineState.RESTARTING

    def replace(self, index: int, engine: E) -> None:
        """``engine`` serves in place of failed engine ``index`` from now on, with no session yet. The failed
        one's sessions (their failure callbacks already ran) keep their slots until they end, outside its count."""
        if self._states[index] is EngineState.SERVING:
            raise ValueError(f"engine {index} is serving: only a failed engine is replaced")
        self.engines = (*self.engines[:index], engine, *self.engines[index + 1 :])
        self._held[index] = set()
        self._responses[index] = 0
        self._states[index] = EngineState.SERVING

    def fail(self, index: int) -> int:
        """Mark engine ``index`` failed (idempotent): it takes no new session, and each of its sessions' failure
        callbacks runs. Returns how many sessions it held."""
        if self._states[index] is not EngineState.SERVING:
            return 0
        self._states[index] = EngineState.FAILED
        held = list(self._held[index])
        for slot in held:
            try:
                slot._engine_failed()
            except Exception:  # noqa: BLE001 - every other session must still be ended
                logger.exception("ending a session of failed engine %d failed", index)
        return len(held)

    def _release(self, slot: EngineSlot[E]) -> None:
        self._held[slot.index].discard(slot)

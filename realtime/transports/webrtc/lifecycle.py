"""The life of a WebRTC call from its offer to its teardown, wherever its media run
(:class:`~realtime.transports.webrtc.endpoint.WebRTCCalls` keeps one).

:class:`CallLifecycle` keeps an endpoint's calls from registration (:meth:`CallLifecycle.add`, while the offer is
answered) to teardown. :meth:`CallLifecycle.serve` runs an answered call's session in its own task with a connect
watchdog (the call is disconnected when ICE/DTLS is not up within ``connect_timeout_s``), and tears the call down when
the session ends, however it ends. Teardown (:meth:`CallLifecycle.teardown`, safe in any state and for a call that
was never served) runs in this order: :meth:`ServedCall.closing`, the transport disconnected, the call's own tasks
cancelled and awaited, :meth:`ServedCall.close_media`, the slot released, the observer closed, the call forgotten
(counted ended if it was served). :meth:`CallLifecycle.close` refuses new calls (:attr:`CallLifecycle.closed`),
disconnects every call and waits for their teardown (a session stuck in its engine is cancelled after
:data:`CLOSE_WAIT_S`; its teardown still runs).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Generic, Protocol, TypeVar

from realtime.runner import SessionRunner
from realtime.server.limits import SessionSlot

logger = logging.getLogger(__name__)

CLOSE_WAIT_S = 5.0
"""How long :meth:`CallLifecycle.close` waits for the calls' sessions to end before cancelling them."""


class _Disconnects(Protocol):
    def disconnect(self) -> None:
        """The client is gone: the session's iteration of its messages ends."""
        ...


class _Closes(Protocol):
    def close(self) -> None: ...


class ServedCall(Protocol):
    """What :class:`CallLifecycle` needs of a call."""

    id: str
    connected: asyncio.Event
    """Set once ICE and DTLS are up."""
    tasks: set[asyncio.Task]
    """The call's own tasks (its session runner tracks its own); :meth:`spawn` adds to them."""

    @property
    def slot(self) -> SessionSlot | None: ...

    @property
    def observer(self) -> _Closes | None: ...

    @property
    def transport(self) -> _Disconnects: ...

    @property
    def runner(self) -> SessionRunner: ...

    def task_name(self, role: str) -> str: ...

    def spawn(self, coro: Coroutine, role: str) -> None: ...

    def closing(self) -> None:
        """Teardown begins (nothing is released yet)."""
        ...

    async def close_media(self) -> None:
        """Close the call's media (its peer connection, in this process or on its worker); must not raise."""
        ...


CallT = TypeVar("CallT", bound=ServedCall)


class CallLifecycle(Generic[CallT]):
    """An endpoint's calls and their serving (module docstring). ``connect_timeout_s``: how long an answered call may
    take to connect."""

    def __init__(self, connect_timeout_s: float) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.calls: dict[str, CallT] = {}
        self._serving: dict[str, asyncio.Task] = {}
        self.closed = False
        """:meth:`close` ran: the endpoint refuses new calls."""
        self.calls_started = 0
        self.calls_ended = 0

    def add(self, call: CallT) -> None:
        """Register ``call`` (teardown forgets it); it counts as live from now on."""
        self.calls[call.id] = call

    def serve(self, call: CallT) -> None:
        """Run the answered ``call``'s session until it ends, then tear the call down."""
        self.calls[call.id] = call
        self.calls_started += 1
        self._serving[call.id] = asyncio.create_task(self._serve(call), name=call.task_name("session"))

    async def _serve(self, call: CallT) -> None:
        call.spawn(self._connect_watchdog(call), "connect watchdog")
        try:
            await call.runner.run()
        except Exception:
            logger.exception("webrtc %s: session failed", call.id)
        finally:
            await self.teardown(call)

    async def _connect_watchdog(self, call: CallT) -> None:
        try:
            await asyncio.wait_for(call.connected.wait(), self.connect_timeout_s)
        except TimeoutError:
            logger.warning("webrtc %s: not connected after %.0f s: closing", call.id, self.connect_timeout_s)
            call.transport.disconnect()

    async def teardown(self, call: CallT) -> None:
        """Release everything the call holds (module docstring); safe whatever state it is in."""
        call.closing()
        call.transport.disconnect()
        tasks = list(call.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await call.close_media()
        if call.slot is not None:
            call.slot.release()
        if call.observer is not None:
            call.observer.close()
        served = self._serving.pop(call.id, None) is not None
        if self.calls.pop(call.id, None) is not None and served:
            self.calls_ended += 1
            logger.info("webrtc %s: closed", call.id)

    async def close(self) -> None:
        """Refuse new calls, end every call and wait until all are torn down."""
        self.closed = True
        for call in list(self.calls.values()):
            call.transport.disconnect()
        serving = list(self._serving.values())
        if serving:
            _, late = await asyncio.wait(serving, timeout=CLOSE_WAIT_S)
            for task in late:  # a session stuck in its engine: cancelling it still tears down
                task.cancel()
            await asyncio.gather(*serving, return_exceptions=True)

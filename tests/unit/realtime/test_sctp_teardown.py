"""realtime.transports.sctp_teardown: only aiortc's unawaited SCTP transmit failing on a closed DTLS transport is kept
out of the error log; every other loop exception reaches the handler that was there before."""

from __future__ import annotations

import asyncio

from realtime.transports import sctp_teardown


class RTCSctpTransport:  # the name aiortc's task runs under
    async def _transmit(self) -> None:
        raise ConnectionError("Cannot send encrypted data, not connected")


async def _other() -> None:
    raise ConnectionError("something else")


async def _failed(coro) -> asyncio.Task:
    task = asyncio.ensure_future(coro)
    await asyncio.wait([task])
    task.exception()  # retrieved here, so that the test's own loop does not report it
    return task


async def test_only_the_sctp_teardown_race_is_filtered():
    loop = asyncio.get_running_loop()
    seen = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    try:
        sctp_teardown.install(loop)
        sctp_teardown.install(loop)  # once per loop
        handler = loop.get_exception_handler()
        race = await _failed(RTCSctpTransport()._transmit())
        other = await _failed(_other())
        context = {"message": "Task exception was never retrieved", "future": race, "exception": race.exception()}
        assert sctp_teardown.is_sctp_teardown_race(context)
        handler(loop, context)
        assert seen == []
        unrelated = {"message": "Task exception was never retrieved", "future": other, "exception": other.exception()}
        assert not sctp_teardown.is_sctp_teardown_race(unrelated)
        handler(loop, unrelated)
        not_a_connection_error = {**context, "exception": ValueError("x")}
        handler(loop, not_a_connection_error)
        assert seen == [unrelated, not_a_connection_error]
    finally:
        loop.set_exception_handler(previous)

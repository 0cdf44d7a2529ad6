"""The clear of a barged-in reply with WebRTC media workers (realtime.transports.media_workers), without processes:
the worker drops only the audio of the response a clear names, and the server delivers the reply's truncation to
the session before anything that arrived after the clear, however late the worker says how much was played."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.client import InputAudioAppend
from realtime.protocol.names import Dialect
from realtime.server.limits import SessionSlots
from realtime.transports.media_workers import messages as m
from realtime.transports.media_workers.worker import Worker, WorkerCall
from realtime.transports.webrtc import WebRTCCalls
from realtime.transports.webrtc.worker_media import RemoteCall
from tests.fakes import FakeEngine


class _Wire:
    """What a worker or the server sends, recorded."""

    def __init__(self) -> None:
        self.sent: list[object] = []
        self.index = 0

    def send(self, message: object) -> None:
        self.sent.append(message)

    async def drain(self) -> None:
        pass


def _tone(ms: int) -> np.ndarray:
    return np.full(24 * ms, 0.3, dtype=np.float32)


async def test_the_worker_clears_only_the_response_the_clear_names():
    wire = _Wire()
    worker = Worker(wire, ())
    call = WorkerCall(worker, "rtc_m1", AudioFormat.PCM)
    worker.calls[call.id] = call
    try:
        # The next reply's audio is already queued when the clear of the interrupted one arrives.
        worker.handle(m.PlayAudioMessage(call.id, "resp_old", _tone(200)))
        worker.handle(m.PlayAudioMessage(call.id, "resp_next", _tone(200)))
        call.output.next_frame()  # 20 ms of the interrupted reply went out
        worker.handle(m.ClearAudioMessage(call.id, "resp_old"))
        assert call.output.response_ids() == ("resp_next",)
        assert wire.sent == [m.AudioCleared(call.id, "resp_old", 20.0)]
        worker.handle(m.EndAudio(call.id, "resp_old"))  # its response.done, after the clear: nothing to end
        worker.handle(m.EndAudio(call.id, "resp_next"))
        assert call.output.response_ids() == ("resp_next",)
        assert wire.sent[1:] == [m.AudioCleared(call.id, "resp_old", None)]  # nothing of it left to finish
        frames = [call.output.next_frame() for _ in range(10)]  # the next reply plays whole: 200 ms
        assert all(frame.audible for frame in frames) and frames[-1].finished == ("resp_next",)
    finally:
        await call.pc.close()


async def _remote_call() -> tuple[RemoteCall, _Wire]:
    local = WebRTCCalls(FakeEngine(), turn_detector_factory=lambda: lambda params: None)
    slot = SessionSlots(1).try_acquire()
    assert slot is not None
    make_runner = await local.session_factory(Dialect.GA, slot)
    link = _Wire()
    call = RemoteCall("rtc_m1", link, Dialect.GA, make_runner, gate=None, slot=slot, on_input_delay=None)
    # the interrupted reply's item went to the client; its response is no longer generating
    call.sent({"type": "response.output_item.added", "response_id": "resp_old", "item": {"id": "item_old"}})
    return call, link


def _mic(call: RemoteCall) -> m.MicAudio:
    return m.MicAudio(call.id, call.input_format.value, b"\x01\x00" * 480, None, 48_000)


async def test_the_truncation_waits_in_order_for_the_worker_to_say_what_was_played():
    call, link = await _remote_call()
    incoming = aiter(call.transport)
    call.receive(_mic(call))  # arrived before the clear
    call.clear("resp_old")
    call.receive(_mic(call))  # the user's next words, after the clear
    assert link.sent == [m.ClearAudioMessage(call.id, "resp_old")]
    assert isinstance(await anext(incoming), InputAudioAppend)
    pending = asyncio.ensure_future(anext(incoming))
    await asyncio.sleep(0.05)
    assert not pending.done()  # held until the worker answers the clear: nothing said later overtakes it
    call.receive(m.AudioCleared(call.id, "resp_old", 1234.5))
    truncate = json.loads(await asyncio.wait_for(pending, 1.0))
    assert truncate["type"] == "conversation.item.truncate"
    assert (truncate["item_id"], truncate["audio_end_ms"]) == ("item_old", 1234)
    assert isinstance(await anext(incoming), InputAudioAppend)


async def test_nothing_is_truncated_when_nothing_was_queued_or_the_call_ends():
    call, _ = await _remote_call()
    incoming = aiter(call.transport)
    call.clear("resp_old")
    call.receive(_mic(call))
    call.receive(m.AudioCleared(call.id, "resp_old", None))  # none of its audio was queued any more
    assert isinstance(await asyncio.wait_for(anext(incoming), 1.0), InputAudioAppend)

    call.sent({"type": "response.output_item.added", "response_id": "resp_2", "item": {"id": "item_2"}})
    call.clear("resp_2")
    pending = asyncio.ensure_future(anext(incoming))
    await asyncio.sleep(0.05)
    call.worker_ended("media worker lost")  # no answer will come: iteration ends, it does not wait
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(pending, 1.0)

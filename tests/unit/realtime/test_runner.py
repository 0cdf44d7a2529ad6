"""realtime.runner: the async driver over an in-memory transport and the scripted FakeEngine.
No model, no sockets; every test finishes in well under a second."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest

from pipeline.errors import ContextLimitError, EngineClosedError
from realtime.observe.first_audio import Hop
from realtime.protocol.codes import ErrorCode
from realtime.runner import OutboundOverflow, OutboundQueue, SessionRunner, TransportClosed
from realtime.session import AudioTransport, SessionSettings
from tests.fakes import FakeEngine, FakeTurnDetector, MemoryTransport, Script
from tests.helpers.session_harness import MANUAL, RATE, TEXT_ITEM, TIMEOUT, Harness, append, until

# --- full turns ---------------------------------------------------------------------------------


async def test_text_turn_end_to_end():
    async with Harness() as h:
        h.send(MANUAL, TEXT_ITEM, {"type": "response.create"})
        done = await h.transport.wait_for("response.done")
        assert done["response"]["status"] == "completed"
        assert done["response"]["output"][0]["content"][0]["transcript"] == "Hello there!"
        assert [c[0] for c in h.conversation.calls] == ["open", "add_text", "respond"]
        assert h.calls("respond") == [("respond", "item_2", ("audio", "text"), "Chelsie", FakeEngine.max_output_tokens)]
    types = h.transport.types()
    assert types[:2] == ["session.created", "session.updated"]
    assert types.count("response.output_audio.delta") == 3
    assert types.index("response.output_audio_transcript.done") > types.index("response.output_audio.delta")
    assert h.conversation.calls[-1] == ("close",) and h.transport.closed
    assert h.runner._tasks == set()


async def test_streamed_audio_reaches_the_engine_at_16_khz_and_reply_audio_is_pcm16():
    engine = FakeEngine(Script(text=("Hi",), audio_chunks=2, chunk_ms=40))
    async with Harness(engine) as h:
        h.send(MANUAL, append(100), append(150), {"type": "input_audio_buffer.commit"}, {"type": "response.create"})
        await h.transport.wait_for("response.done")
        (commit,) = h.calls("commit")
        assert commit[1] == "item_1" and commit[2] == pytest.approx(16_000 * 250 // 1000, abs=2)
        assert h.calls("open_audio") == [("open_audio", "item_1")]
    deltas = [e for e in h.transport.sent if e["type"] == "response.output_audio.delta"]
    assert sum(len(base64.b64decode(e["delta"])) for e in deltas) == 2 * 2 * RATE * 40 // 1000


async def test_server_vad_turn_sends_only_speech_and_answers():
    async with Harness() as h:
        for _ in range(10):
            h.send(append(100))  # 1 s of silence
        for _ in range(3):
            h.send(append(100, amplitude=0.5))
        for _ in range(7):
            h.send(append(100))
        started = await h.transport.wait_for("input_audio_buffer.speech_started")
        stopped = await h.transport.wait_for("input_audio_buffer.speech_stopped")
        assert started["audio_start_ms"] == pytest.approx(1000 - 300, abs=100)  # speech at ~1 s, minus the padding
        assert started["item_id"] == stopped["item_id"]
        await h.transport.wait_for("input_audio_buffer.committed")
        done = await h.transport.wait_for("response.done")
        assert done["response"]["status"] == "completed"
        await until(lambda: h.calls("commit"))
        sent_samples = h.calls("commit")[0][2]
        assert sent_samples < 16_000 * 1.6  # the leading silence (beyond padding + lookback) never reached the engine
        assert sent_samples > 16_000 * 0.9  # speech and the trailing silence did
        assert len(h.detectors) == 1


class LoudVad:
    """Speech probability 0.9 for a 32 ms frame louder than RMS 0.05, else 0: the real TurnDetector on tones."""

    frame_samples = 512

    def __call__(self, frame: np.ndarray) -> float:
        return 0.9 if float(np.sqrt(np.mean(frame**2))) > 0.05 else 0.0

    def reset(self) -> None:
        pass


def preemptive(engine: FakeEngine, **kwargs) -> Harness:
    """A harness whose real turn detector reports 200 ms pauses and whose session starts replies on them."""
    from realtime.turns.server_vad import TurnDetector

    return Harness(
        engine,
        turn_detector_factory=lambda p: TurnDetector(p, LoudVad(), pause_ms=200),
        settings=SessionSettings.for_engine(engine, preemptive_replies=True),
        **kwargs,
    )


async def test_a_preemptive_reply_withdrawn_by_more_speech_leaves_one_turn_and_one_reply():
    engine = FakeEngine()
    engine.script(Script(delay_s=0.05))  # still running when speech resumes
    traces = []
    async with preemptive(engine, on_first_audio=traces.append) as h:
        h.send(append(400, 0.5), append(300))  # speech, then a pause past 200 ms: a reply starts, unseen
        await until(lambda: len(h.calls("respond")) == 1)
        h.send(append(400, 0.5), append(700))  # speech again (withdrawn), then the turn ends
        done = await h.transport.wait_for("response.done")
        assert done["response"]["status"] == "completed"
        first = h.conversation.responses[0]
        assert first.cancel_reason == "turn_detected"
        await until(lambda: len(h.calls("commit")) == 2)
        commits = h.calls("commit")
        assert commits[0][1] == commits[1][1] == "item_1"  # the same message, committed again whole
        assert commits[1][2] > commits[0][2] + 16_000 * 0.6  # with the speech after the pause
        reply = h.calls("respond")[0][1]
        assert ("delete", reply) in h.conversation.calls and ("delete", "item_1") in h.conversation.calls
        assert h.conversation.items == ["item_1", h.calls("respond")[1][1]]
        await until(lambda: len(traces) == 2)
    types = h.transport.types()
    assert types.count("response.created") == 1 and types.count("input_audio_buffer.committed") == 1
    assert types.count("input_audio_buffer.speech_stopped") == 1 and "error" not in types
    assert all(e.get("item_id") != reply for e in h.transport.sent)
    withdrawn, answer = traces  # the withdrawn reply's trace is handed over too, marked, at its done
    assert (withdrawn.preemptive, withdrawn.withdrawn) == (True, True)
    assert Hop.SENT not in withdrawn.at and Hop.SHOWN not in withdrawn.at
    # the answer started on the turn's last pause, and was shown when speech stopped
    assert (answer.preemptive, answer.withdrawn) == (True, False) and Hop.SHOWN in answer.at and Hop.SENT in answer.at


async def test_a_preemptive_reply_is_shown_right_behind_speech_stopped():
    engine = FakeEngine(Script(text=("Hi",), audio_chunks=2, chunk_ms=40))
    traces = []
    async with preemptive(engine, on_first_audio=traces.append) as h:
        h.send(append(400, 0.5), append(300))
        await until(lambda: h.conversation.responses and h.conversation.responses[0].done is not None)
        assert "response.created" not in h.transport.types()  # finished, still unseen: the turn may go on
        h.send(append(300))
        await h.transport.wait_for("response.done")
        await until(lambda: len(traces) == 1)
    types = h.transport.types()
    stopped = types.index("input_audio_buffer.speech_stopped")
    assert types[stopped + 1 : stopped + 3] == ["input_audio_buffer.committed", "conversation.item.added"]
    assert types.count("response.output_audio.delta") == 2 and len(h.calls("respond")) == 1
    (trace,) = traces  # handed over only once shown (its done came before), the pause as its turn end
    assert trace.preemptive and not trace.withdrawn
    at = trace.at
    assert at[Hop.TURN_END] <= at[Hop.REQUESTED] <= at[Hop.RECEIVED] <= at[Hop.SHOWN] <= at[Hop.SENT]
    assert {"turn_end->shown", "shown->sent"} <= set(trace.segments())


async def test_each_response_reports_its_first_audio_path():
    traces = []
    async with Harness(on_first_audio=traces.append) as h:
        h.send(append(300, 0.5), *[append(100) for _ in range(6)])  # a spoken turn ended by the VAD
        await h.transport.wait_for("response.done")
        h.send(MANUAL, TEXT_ITEM, {"type": "response.create"})  # then a response to text
        await until(lambda: len(traces) == 2)
    spoken, text = traces
    path = [Hop.TURN_END, Hop.REQUESTED, Hop.RECEIVED, Hop.SENT]  # the fake engine reports no engine moments
    assert set(spoken.at) == {*path, Hop.COMMITTED}
    assert sorted(spoken.at[hop] for hop in path) == [spoken.at[hop] for hop in path]  # passed in path order
    assert spoken.at[Hop.TURN_END] <= spoken.at[Hop.COMMITTED]
    assert spoken.response_id != text.response_id
    assert [hop for hop in Hop if hop in text.at] == [Hop.REQUESTED, Hop.RECEIVED, Hop.SENT]
    assert text.total_ms() >= 0


async def test_the_response_to_a_spoken_turn_does_not_wait_for_the_commits_answer():
    engine = FakeEngine()
    engine.held_commits = []
    traces = []
    async with Harness(engine, on_first_audio=traces.append) as h:
        h.send(append(300, 0.5), *[append(100) for _ in range(6)])
        await h.transport.wait_for("response.done")  # answered while the commit's answer is still held
        assert [c[0] for c in h.conversation.calls if c[0] in ("commit", "respond")] == ["commit", "respond"]
        (held,) = engine.held_commits
        held.set_result(None)
        await until(lambda: traces and Hop.COMMITTED in traces[0].at)


async def test_a_failed_commit_is_reported_and_the_session_goes_on():
    engine = FakeEngine()
    engine.held_commits = []
    async with Harness(engine) as h:
        h.send(MANUAL, append(200, 0.5), {"type": "input_audio_buffer.commit"})
        await until(lambda: engine.held_commits)
        engine.held_commits[0].set_exception(ContextLimitError("the conversation is full", param="item"))
        error = await h.transport.wait_for("error")
        assert error["error"]["code"] == ContextLimitError.code
        engine.held_commits = None
        h.send(TEXT_ITEM, {"type": "response.create"})
        assert (await h.transport.wait_for("response.done"))["response"]["status"] == "completed"
        assert h.runner._tasks and all("commit" not in t.get_name() for t in h.runner._tasks)


# --- barge-in, cancellation, truncation ---------------------------------------------------------


async def test_barge_in_stops_audio_at_the_cancel_decision():
    engine = FakeEngine()
    engine.script(Script(text=("a", "b", "c", "d", "e"), audio_chunks=5, manual=True, events_after_cancel=2))
    async with Harness(engine) as h:
        h.send(append(300, 0.5), *[append(100) for _ in range(6)])
        await h.transport.wait_for("response.created")
        await until(lambda: h.conversation.responses)
        response = h.conversation.responses[0]
        response.release(4)  # a, chunk, b, chunk
        await until(lambda: h.transport.types().count("response.output_audio.delta") == 2)
        h.send(append(300, 0.5))  # the user talks over the reply
        await h.transport.wait_for("input_audio_buffer.speech_started")
        done = await h.transport.wait_for("response.done")
        assert done["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
        assert response.cancel_reason == "turn_detected"
        assert len(response.yielded) == 6  # the engine delivered two more events after the cancel
    types = h.transport.types()
    barge_in = types.index("input_audio_buffer.speech_started", types.index("response.created"))
    assert "response.output_audio.delta" not in types[barge_in:]
    assert "response.output_audio_transcript.delta" not in types[barge_in:]


async def test_cancel_then_truncate_waits_for_the_engine_to_be_idle():
    engine = FakeEngine(Script(audio_chunks=4, manual=True))
    async with Harness(engine) as h:
        h.send(MANUAL, TEXT_ITEM, {"type": "response.create"})
        await until(lambda: h.conversation.responses)
        h.conversation.responses[0].release(4)
        await until(lambda: h.transport.types().count("response.output_audio.delta") == 2)
        item_id = h.conversation.responses[0].item_id
        h.send(
            {"type": "response.cancel"},
            {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 60},
        )
        await h.transport.wait_for("conversation.item.truncated")
        await h.transport.wait_for("response.done")
        await until(lambda: h.calls("truncate"))
        assert h.calls("truncate") == [("truncate", item_id, 60)]
    assert "error" not in h.transport.types()


async def test_a_cancel_before_the_engine_started_the_response():
    async with Harness() as h:
        h.send(MANUAL, TEXT_ITEM, {"type": "response.create"}, {"type": "response.cancel"})
        done = await h.transport.wait_for("response.done")
        assert done["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
        assert h.conversation.responses[0].cancel_reason == "client_cancelled"


async def test_disconnect_mid_response_cancels_it_and_closes_everything():
    engine = FakeEngine(Script(manual=True))
    h = Harness(engine)
    async with h:
        h.send(MANUAL, TEXT_ITEM, {"type": "response.create"})
        await until(lambda: h.conversation.responses)
    response = h.conversation.responses[0]
    assert response.cancel_reason in ("client_disconnected", "conversation_closed")
    assert h.conversation.closed and h.transport.closed
    assert h.runner._tasks == set()


async def test_cancelling_run_cleans_up_and_propagates():
    engine = FakeEngine(Script(manual=True))
    h = Harness(engine)
    h.task = asyncio.create_task(h.runner.run())
    await h.transport.wait_for("session.created")
    h.send(MANUAL, TEXT_ITEM, {"type": "response.create"})
    await until(lambda: h.conversation.responses)
    h.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await h.task
    assert h.conversation.responses[0].cancel_reason is not None
    assert h.conversation.closed and h.transport.closed and h.runner._tasks == set()


# --- failures -----------------------------------------------------------------------------------


async def test_engine_command_errors_are_reported_and_the_session_goes_on():
    engine = FakeEngine()
    engine.fail_next("add_text", ContextLimitError("the conversation is full", param="item"))
    async with Harness(engine) as h:
        h.send(MANUAL, TEXT_ITEM)
        error = await h.transport.wait_for("error")
        assert error["error"]["code"] == ContextLimitError.code and error["error"]["type"] == "invalid_request_error"
        h.send(TEXT_ITEM, {"type": "response.create"})
        assert (await h.transport.wait_for("response.done"))["response"]["status"] == "completed"


async def test_a_response_that_fails_to_start_or_crashes_ends_as_failed():
    engine = FakeEngine()
    engine.fail_next("respond", ContextLimitError("too long"))
    engine.script(Script(crash_after=2))
    async with Harness(engine) as h:
        h.send(MANUAL, TEXT_ITEM, {"type": "response.create"})
        done = await h.transport.wait_for("response.done")
        assert done["response"]["status_details"]["error"]["code"] == ContextLimitError.code
        h.send({"type": "response.create"})
        done = await h.transport.wait_for("response.done")
        assert done["response"]["status"] == "failed"
        assert done["response"]["status_details"]["error"] == {
            "type": "server_error",
            "code": "server_error",
            "message": "internal server error",
        }
        h.send({"type": "response.create"})
        assert (await h.transport.wait_for("response.done"))["response"]["status"] == "completed"


async def test_an_unexpected_failure_ends_the_session_and_is_raised():
    class BrokenDetector(FakeTurnDetector):
        def feed(self, pcm16k):
            raise RuntimeError("detector bug")

    h = Harness(turn_detector_factory=BrokenDetector)
    h.task = asyncio.create_task(h.runner.run())
    h.send(append(100))
    with pytest.raises(RuntimeError, match="detector bug"):
        await asyncio.wait_for(h.task, TIMEOUT)
    assert h.conversation.closed and h.transport.closed


async def test_an_engine_that_refuses_the_conversation_closes_the_transport():
    class ClosedEngine(FakeEngine):
        def conversation(self, *, instructions=None):
            raise EngineClosedError("shutting down")

    h = Harness(ClosedEngine())
    with pytest.raises(EngineClosedError):
        await asyncio.wait_for(h.runner.run(), TIMEOUT)
    assert h.transport.closed and h.transport.sent == []


async def test_client_errors_do_not_end_the_session():
    async with Harness() as h:
        h.send({"type": "response.cancel", "event_id": "e1"})
        error = await h.transport.wait_for("error")
        assert (error["error"]["code"], error["error"]["event_id"]) == (ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE, "e1")
        h.transport.client_send("not json")
        assert (await h.transport.wait_for("error"))["error"]["code"] == ErrorCode.INVALID_JSON
        h.send(MANUAL)
        await h.transport.wait_for("session.updated")


# --- outbound queue and backpressure ------------------------------------------------------------


async def test_outbound_queue_policy():
    queue = OutboundQueue(high_water=2, hard_limit=3)
    queue.put({"type": "a"})
    await asyncio.wait_for(queue.wait_for_room(), 1)
    queue.put({"type": "b", "response_id": "r"})
    room = asyncio.create_task(queue.wait_for_room())
    await asyncio.sleep(0)
    assert not room.done()  # at high water: bulk producers wait
    queue.put({"type": "c"})  # control events still go in
    with pytest.raises(OutboundOverflow):
        queue.put({"type": "d"})
    assert queue.drop(lambda e: e.get("response_id") != "r") == 1
    assert [await queue.get(), await queue.get()] == [{"type": "a"}, {"type": "c"}]
    await asyncio.wait_for(room, 1)
    getter = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    assert not getter.done()
    queue.put({"type": "e"})
    assert await asyncio.wait_for(getter, 1) == {"type": "e"}
    with pytest.raises(ValueError):
        OutboundQueue(high_water=5, hard_limit=4)


class GatedTransport(MemoryTransport):
    """A client that reads only when the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def send(self, event: dict) -> None:
        await self.gate.wait()
        await super().send(event)


async def test_a_slow_client_pauses_the_response_without_losing_events():
    engine = FakeEngine(Script(text=tuple("abcdefghij"), audio_chunks=40, chunk_ms=20))
    transport = GatedTransport()
    h = Harness(engine, transport, outbound=OutboundQueue(high_water=8, hard_limit=64))
    h.task = asyncio.create_task(h.runner.run())
    h.send(MANUAL, TEXT_ITEM, {"type": "response.create"})
    await until(lambda: h.conversation.responses and len(h.runner.outbound) >= 8)
    await asyncio.sleep(0.05)
    response = h.conversation.responses[0]
    assert len(response.yielded) < 10  # the pump waits for the client instead of queueing it all
    assert len(h.runner.outbound) <= 8 + 8  # high water plus one batch of a response's events
    transport.gate.set()
    done = await transport.wait_for("response.done")
    assert done["response"]["status"] == "completed"
    assert transport.types().count("response.output_audio.delta") == 40
    ids = [e["event_id"] for e in transport.sent]
    assert ids == sorted(ids, key=lambda i: int(i.split("_")[1]))  # in the order the session made them
    transport.disconnect()
    await asyncio.wait_for(h.task, TIMEOUT)


async def test_a_cancel_is_honoured_while_the_client_lags_and_its_queued_audio_is_dropped():
    engine = FakeEngine(Script(text=("x",) * 30, audio_chunks=30, chunk_ms=20))
    transport = GatedTransport()
    h = Harness(engine, transport, outbound=OutboundQueue(high_water=8, hard_limit=64))
    h.task = asyncio.create_task(h.runner.run())
    h.send(MANUAL, TEXT_ITEM, {"type": "response.create"})
    await until(lambda: h.conversation.responses and len(h.runner.outbound) >= 8)
    response = h.conversation.responses[0]
    h.send({"type": "response.cancel"})
    await until(lambda: response.done is not None)  # the pump drained the engine without waiting
    queued = [e["type"] for e in h.runner.outbound._events]
    assert "response.output_audio.delta" not in queued and queued[-1] == "response.done"
    transport.gate.set()
    done = await transport.wait_for("response.done")
    assert done["response"]["status_details"]["reason"] == "client_cancelled"
    transport.disconnect()
    await asyncio.wait_for(h.task, TIMEOUT)


async def test_a_client_that_never_reads_is_disconnected():
    transport = GatedTransport()
    h = Harness(transport=transport, outbound=OutboundQueue(high_water=4, hard_limit=16))
    h.task = asyncio.create_task(h.runner.run())
    for _ in range(40):
        transport.client_send("not json")  # each is answered with an error event nobody reads
    await asyncio.wait_for(h.task, TIMEOUT)  # returns: overflow is the client's problem, not ours
    assert transport.closed and h.conversation.closed


async def test_a_closed_transport_ends_the_session():
    class ClosingTransport(MemoryTransport):
        async def send(self, event: dict) -> None:
            raise TransportClosed("peer went away")

    h = Harness(transport=ClosingTransport())
    await asyncio.wait_for(h.runner.run(), TIMEOUT)
    assert h.conversation.closed


# --- WebRTC media sink --------------------------------------------------------------------------


class RecordingSink:
    def __init__(self) -> None:
        self.played: list[tuple[str, int]] = []
        self.cleared: list[str] = []

    def play(self, response_id: str, pcm: np.ndarray) -> None:
        self.played.append((response_id, len(pcm)))

    def clear(self, response_id: str) -> None:
        self.cleared.append(response_id)


async def test_media_sessions_send_audio_to_the_sink():
    engine = FakeEngine()
    sink = RecordingSink()
    settings = SessionSettings.for_engine(engine, audio_transport=AudioTransport.MEDIA)
    async with Harness(engine, settings=settings, media=sink) as h:
        h.send(MANUAL, TEXT_ITEM, {"type": "response.create"})
        done = await h.transport.wait_for("response.done")
        rid = done["response"]["id"]
        assert sink.played == [(rid, 960)] * 3
        h.runner.playback_finished(rid)
        await h.transport.wait_for("output_audio_buffer.stopped")
    assert "response.output_audio.delta" not in h.transport.types()
    assert h.transport.types().count("output_audio_buffer.started") == 1


def test_media_sessions_need_a_sink():
    engine = FakeEngine()
    settings = SessionSettings.for_engine(engine, audio_transport=AudioTransport.MEDIA)
    with pytest.raises(ValueError, match="media sink"):
        SessionRunner(MemoryTransport(), engine, turn_detector_factory=FakeTurnDetector, settings=settings)


# --- input audio transcription ------------------------------------------------------------------

TRANSCRIBE = {
    "type": "session.update",
    "session": {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1", "language": "en"}}}},
}
SPOKEN_TURN = (append(300, 0.5), *[append(100) for _ in range(8)])
"""Speech, then silence past the VAD's window: a committed turn."""
COMPLETED = "conversation.item.input_audio_transcription.completed"
FAILED = "conversation.item.input_audio_transcription.failed"


def side(engine: FakeEngine) -> list:
    """The transcription side conversations opened so far."""
    return [c for c in engine.conversations if c.instructions == engine.transcription_prompt.instructions]


async def test_a_spoken_turns_transcription_starts_only_after_the_replys_first_audio():
    engine = FakeEngine(Script(text=("Sure",), audio_chunks=2, manual=True))
    async with Harness(engine) as h:
        h.send(TRANSCRIBE, *SPOKEN_TURN)
        await until(lambda: h.conversation.responses)
        reply = h.conversation.responses[0]
        reply.release(1)  # the reply's text: no audio yet
        await h.transport.wait_for("response.output_audio_transcript.delta")
        await asyncio.sleep(0.05)
        assert side(engine) == [] and h.runner.transcription.transcriber.started == []
        reply.release(1)  # its first audio
        await h.transport.wait_for("response.output_audio.delta")
        completed = await h.transport.wait_for(COMPLETED)
        reply.release(2)
        await h.transport.wait_for("response.done")
        (asr,) = side(engine)
        (commit,) = h.calls("commit")
        item_id, samples = commit[1], commit[2]
        assert completed["item_id"] == item_id and completed["transcript"] == "I said hello."
        assert completed["usage"]["type"] == "tokens" and completed["usage"]["output_tokens"] == 2
        assert [c[0] for c in asr.calls] == ["open", "add_audio", "add_text", "respond", "close"]
        assert asr.calls[1][2] == samples  # the committed message's audio, as the engine got it
        request = engine.transcription_prompt.render_request(language="en")
        assert asr.calls[2][2:] == (request, "user")
        max_tokens = asr.calls[3][4]
        assert asr.calls[3][2] == ("text",) and 16 < max_tokens <= 16 + 10 * (samples / 16_000) + 1
        h.send({"type": "conversation.item.retrieve", "item_id": item_id})
        retrieved = await h.transport.wait_for("conversation.item.retrieved")
        assert retrieved["item"]["content"][0]["transcript"] == "I said hello."
    types = h.transport.types()
    deltas = [i for i, t in enumerate(types) if t == "conversation.item.input_audio_transcription.delta"]
    assert len(deltas) == 2 and types.index("response.output_audio.delta") < deltas[0]
    assert "error" not in types and h.runner._tasks == set()


async def test_a_commit_with_no_reply_is_transcribed_at_once():
    engine = FakeEngine()
    async with Harness(engine) as h:
        h.send(MANUAL, TRANSCRIBE, append(200, 0.5), {"type": "input_audio_buffer.commit"})
        completed = await h.transport.wait_for(COMPLETED)
        assert completed["item_id"] == "item_1" and h.calls("respond") == []
        assert len(side(engine)) == 1 and side(engine)[0].closed


async def test_the_clients_language_and_prompt_reach_the_request_and_the_model_is_only_echoed():
    engine = FakeEngine()
    hints = {"model": "gpt-4o-transcribe", "language": "de", "prompt": "Namen: Anna, Berlin"}
    async with Harness(engine) as h:
        h.send(MANUAL, {"type": "session.update", "session": {"input_audio_transcription": hints}})
        updated = [await h.transport.wait_for("session.updated") for _ in range(2)][-1]
        assert updated["session"]["audio"]["input"]["transcription"] == hints
        h.send(append(200, 0.5), {"type": "input_audio_buffer.commit"})
        await h.transport.wait_for(COMPLETED)
    (request,) = [c for c in side(engine)[0].calls if c[0] == "add_text"]
    prompt = engine.transcription_prompt
    assert request[2] == f"{prompt.request} Language: de. Context: Namen: Anna, Berlin"
    assert prompt.render_request(language="", prompt=None) == prompt.request


async def test_a_text_replys_first_text_opens_the_way_for_the_transcription():
    engine = FakeEngine(Script(text=("Sure", "!"), manual=True))
    text_only = {"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}}
    async with Harness(engine) as h:
        h.send(text_only, TRANSCRIBE, *SPOKEN_TURN)
        await until(lambda: h.conversation.responses)
        await asyncio.sleep(0.05)
        assert side(engine) == []
        h.conversation.responses[0].release(1)
        await h.transport.wait_for("response.output_text.delta")
        await h.transport.wait_for(COMPLETED)
        h.conversation.responses[0].release(2)
        await h.transport.wait_for("response.done")


async def test_a_turn_ended_while_the_last_reply_winds_down_waits_for_the_next_replys_audio():
    engine = FakeEngine()
    # the first reply speaks, then lingers after the barge-in's cancel; the second is paced by the test
    engine.script(
        Script(text=("a", "b", "c"), audio_chunks=3, manual=True, events_after_cancel=2, delay_s=0.1),
        Script(text=("Yes",), audio_chunks=1, manual=True),
    )
    async with Harness(engine) as h:
        h.send(*SPOKEN_TURN)
        await until(lambda: h.conversation.responses)
        h.conversation.responses[0].release(2)
        await h.transport.wait_for("response.output_audio.delta")
        h.send(TRANSCRIBE, *SPOKEN_TURN)  # barge-in, and the new turn ends before the reply has wound down
        await h.transport.wait_for("input_audio_buffer.committed")
        await until(lambda: len(h.conversation.responses) == 2)
        second = h.conversation.responses[1]
        await asyncio.sleep(0.05)
        assert side(engine) == []
        second.release(2)
        await h.transport.wait_for(COMPLETED)
        assert second.yielded and any(e.__class__.__name__ == "AudioChunk" for e in second.yielded)


async def test_a_disconnect_cancels_the_running_transcription_and_closes_its_conversation():
    engine = FakeEngine(transcription_script=Script(text=("I", " said"), audio_chunks=0, manual=True))
    h = Harness(engine)
    async with h:
        h.send(MANUAL, TRANSCRIBE, append(200, 0.5), {"type": "input_audio_buffer.commit"})
        await until(lambda: side(engine) and side(engine)[0].responses)
        side(engine)[0].responses[0].release(1)
        await h.transport.wait_for("conversation.item.input_audio_transcription.delta")
    (asr,) = side(engine)
    assert asr.responses[0].cancel_reason == "transcription_cancelled"
    assert asr.closed and h.conversation.closed and h.runner._tasks == set()
    assert COMPLETED not in h.transport.types() and FAILED not in h.transport.types()


async def test_transcriptions_run_one_at_a_time_and_a_full_backlog_fails_the_newest():
    engine = FakeEngine(transcription_script=Script(text=("x",), audio_chunks=0, manual=True))
    commit = (append(200, 0.5), {"type": "input_audio_buffer.commit"})
    async with Harness(engine) as h:
        h.send(MANUAL, TRANSCRIBE, *commit)
        await until(lambda: side(engine))
        h.send(*commit * 5)  # four wait, the fifth is refused
        failed = await h.transport.wait_for(FAILED)
        assert failed["item_id"] == "item_6" and failed["error"]["code"] == ErrorCode.TRANSCRIPTION_BACKLOG
        assert failed["error"]["type"] == "rate_limit_error"
        assert len(side(engine)) == 1 and h.runner.transcription.transcriber.waiting == 4
        h.send({"type": "conversation.item.delete", "item_id": "item_3"})  # its waiting job is dropped
        await h.transport.wait_for("conversation.item.deleted")
        await until(lambda: h.runner.transcription.transcriber.waiting == 3)
        for done in range(1, 5):
            side(engine)[-1].responses[0].release(2)
            await until(lambda done=done: h.transport.types().count(COMPLETED) == done)
        completed = [e["item_id"] for e in h.transport.sent if e["type"] == COMPLETED]
        assert completed == ["item_1", "item_2", "item_4", "item_5"]
        assert all(c.closed for c in side(engine))


async def test_a_failed_transcription_is_reported_for_its_item_and_the_session_goes_on():
    engine = FakeEngine()
    engine.fail_next("add_audio", EngineClosedError("the engine is shutting down"))
    async with Harness(engine) as h:
        h.send(MANUAL, TRANSCRIBE, append(200, 0.5), {"type": "input_audio_buffer.commit"})
        failed = await h.transport.wait_for(FAILED)
        assert failed["item_id"] == "item_1" and failed["error"]["code"] == EngineClosedError.code
        assert side(engine)[0].closed
        h.send(*(append(200, 0.5), {"type": "input_audio_buffer.commit"}))
        assert (await h.transport.wait_for(COMPLETED))["item_id"] == "item_2"


async def test_a_message_begun_before_transcription_was_on_fails_clearly_and_the_next_is_transcribed():
    engine = FakeEngine()
    async with Harness(engine) as h:
        h.send(MANUAL, append(200, 0.5))
        await until(lambda: h.calls("open_audio"))  # the message began with transcription off: its audio is not kept
        h.send(TRANSCRIBE, {"type": "input_audio_buffer.commit"})
        failed = await h.transport.wait_for(FAILED)
        assert failed["item_id"] == "item_1" and failed["error"]["code"] == ErrorCode.TRANSCRIPTION_UNAVAILABLE
        assert side(engine) == [] and h.runner.transcription.transcriber is None
        h.send(append(200, 0.5), {"type": "input_audio_buffer.commit"})
        assert (await h.transport.wait_for(COMPLETED))["item_id"] == "item_2"
    assert h.runner.transcription.committed_audio is None


async def test_without_transcription_no_audio_is_kept():
    engine = FakeEngine()
    async with Harness(engine) as h:
        h.send(MANUAL, append(200, 0.5), {"type": "input_audio_buffer.commit"})
        await until(lambda: h.calls("commit"))
        assert h.runner.transcription.committed_audio == ("item_1", None) and h.runner.transcription.transcriber is None


# --- history: insertions ------------------------------------------------------------------------


async def test_an_insertion_behind_a_cancelled_response_waits_for_its_end_and_lands_in_place():
    """An item created before the end while the response is being cancelled reaches the engine once the response
    ended (the fake engine refuses an insertion while a response runs, as the engine does)."""
    engine = FakeEngine()
    engine.script(Script(delay_s=0.05, events_after_cancel=2))
    first = {**TEXT_ITEM, "item": {**TEXT_ITEM["item"], "id": "u1"}}
    early = {**TEXT_ITEM, "previous_item_id": "root", "item": {**TEXT_ITEM["item"], "id": "u0"}}
    async with Harness(engine) as h:
        h.send(MANUAL, first, {"type": "response.create"})
        await until(lambda: len(h.calls("respond")) == 1)
        h.send({"type": "response.cancel"}, early)
        done = await h.transport.wait_for("response.done")
        assert done["response"]["status"] == "cancelled"
        await until(lambda: len(h.calls("add_text")) == 2)
        assert h.calls("add_text")[1] == ("add_text", "u0", "Hi!", "user", "root")
        assert h.conversation.items == ["u0", "u1", h.calls("respond")[0][1]]
    assert "error" not in h.transport.types()

"""A LiveKit Agents voice agent against an OpenAI-Realtime-compatible server, run by the interpreter of a venv that
holds ``livekit-agents`` and ``livekit-plugins-openai`` (tests/integration/frameworks/test_livekit.py runs it).

The agent is LiveKit's quickstart shape with no room: ``AgentSession(llm=RealtimeModel(base_url=..., api_key=...))``
with the model's default settings and one ``function_tool``, its audio input and output set to in-memory I/O (frames
pushed in; an output that plays each segment out at once and counts its samples). In order, each phase waiting for
the last one's results (``--phase-timeout`` seconds each):

1. the greeting: ``generate_reply(instructions=...)`` on an empty conversation;
2. a spoken turn: the ``--speech`` WAV file (24 kHz mono pcm16) then silence, pushed as 20 ms frames into the
   session's audio input; the server's turn detection ends the turn and answers it; the phase ends once the reply
   and the user's input transcript have arrived;
3. a tool round trip: ``generate_reply(user_input=--question)``; the model calls ``get_weather``, LiveKit runs it and
   sends its output back, and the spoken answer arrives;
4. an edit of the history (``Agent.update_chat_ctx``): a user message (``--first-message``) inserted before
   everything, the greeting's text replaced by ``--edited-greeting``; then ``generate_reply(user_input=--follow-up)``
   and its reply.

Prints one line of JSON on stdout (see :func:`summary`), also when a phase does not complete in time (then it exits
with status 1). Everything LiveKit logs goes to stderr."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import sys
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass

from livekit import rtc
from livekit.agents import Agent, AgentSession, function_tool, llm
from livekit.agents.voice import io
from livekit.plugins.openai.realtime import RealtimeModel

SAMPLE_RATE = 24_000
FRAME_SAMPLES = SAMPLE_RATE // 50  # 20 ms
TRAILING_SILENCE_S = 1.5
"""Silence pushed after the speech, past the server turn detector's silence window."""
GREETING = "Greet the user and offer your assistance."
INSTRUCTIONS = "You are a helpful voice AI assistant."
WEATHER = {"sky": "clear", "celsius": 21}
"""What the tool returns (as JSON): the test finds it in the engine's function_call_output item."""


class PushedAudio(io.AudioInput):
    """The session's audio input: the frames put into :attr:`frames`."""

    def __init__(self) -> None:
        super().__init__(label="pushed")
        self.frames: asyncio.Queue[rtc.AudioFrame] = asyncio.Queue()

    async def __anext__(self) -> rtc.AudioFrame:
        return await self.frames.get()


class InstantPlayback(io.AudioOutput):
    """The session's audio output: each segment plays out at once; :attr:`segments` holds the samples of each."""

    def __init__(self) -> None:
        super().__init__(label="instant", capabilities=io.AudioOutputCapabilities(pause=False))
        self.segments: list[int] = []
        self._samples: int | None = None

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if self._samples is None:
            self._samples = 0
            self.on_playback_started(created_at=time.time())
        self._samples += frame.samples_per_channel

    def flush(self) -> None:
        super().flush()
        self._finish(interrupted=False)

    def clear_buffer(self) -> None:
        self._finish(interrupted=True)

    def _finish(self, *, interrupted: bool) -> None:
        if self._samples is None:
            return
        samples, self._samples = self._samples, None
        self.segments.append(samples)
        self.on_playback_finished(playback_position=samples / SAMPLE_RATE, interrupted=interrupted)


class Recorder:
    """What the agent saw: session events, the Realtime API events both ways, and LiveKit's log at WARNING and up."""

    def __init__(self) -> None:
        self.items: list[dict] = []
        self.transcripts: list[dict] = []
        self.tools_executed: list[dict] = []
        self.errors: list[str] = []
        self.server_events: list[dict] = []
        self.client_events: list[dict] = []
        self.tool_calls: list[dict] = []
        self.log: list[str] = []

    def attach(self, session: AgentSession) -> None:
        session.on("conversation_item_added", self._item)
        session.on("user_input_transcribed", self._transcribed)
        session.on("function_tools_executed", self._executed)
        session.on("error", lambda event: self.errors.append(repr(event.error)))

    def _item(self, event) -> None:
        item = event.item
        if item.type == "message":
            self.items.append({"type": "message", "role": item.role, "text": item.text_content or ""})
        else:
            self.items.append({"type": item.type})

    def _transcribed(self, event) -> None:
        self.transcripts.append({"transcript": event.transcript, "is_final": event.is_final})

    def _executed(self, event) -> None:
        for call, output in event.zipped():
            self.tools_executed.append(
                {
                    "name": call.name,
                    "arguments": call.arguments,
                    "output": None if output is None else output.output,
                    "is_error": None if output is None else output.is_error,
                }
            )
        self.items.append({"type": "function_tools_executed"})

    def server_event(self, event: dict) -> None:
        self.server_events.append(_without_audio(event))

    def client_event(self, event: dict) -> None:
        self.client_events.append(_without_audio(event))

    def messages(self, role: str) -> list[str]:
        return [i["text"] for i in self.items if i["type"] == "message" and i["role"] == role]


def _without_audio(event: dict) -> dict:
    """``event`` with its base64 audio emptied (``input_audio_buffer.append``, ``response.output_audio.delta``)."""
    if event.get("type") in ("input_audio_buffer.append", "response.output_audio.delta"):
        return {**event, "audio" if "audio" in event else "delta": ""}
    return event


class RecordingModel(RealtimeModel):
    """The plugin's model, unchanged, whose sessions report every event they send and receive."""

    recorder: Recorder

    def session(self, *args, **kwargs):
        realtime_session = super().session(*args, **kwargs)
        realtime_session.on("openai_server_event_received", self.recorder.server_event)
        realtime_session.on("openai_client_event_queued", self.recorder.client_event)
        return realtime_session


class LogRecords(logging.Handler):
    def __init__(self, recorder: Recorder) -> None:
        super().__init__(level=logging.WARNING)
        self.recorder = recorder

    def emit(self, record: logging.LogRecord) -> None:
        self.recorder.log.append(f"{record.levelname} {record.name}: {record.getMessage()}")


class PhaseTimeout(Exception):
    """A phase's results did not all arrive in time."""


async def until(what: str, done: Callable[[], bool], timeout: float) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not done():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise PhaseTimeout(f"{what} did not happen within {timeout:g} s") from None


def speech_frames(path: str) -> list[rtc.AudioFrame]:
    with wave.open(path) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (SAMPLE_RATE, 1, 2), path
        pcm = wav.readframes(wav.getnframes())
    pcm += bytes(int(TRAILING_SILENCE_S * SAMPLE_RATE) * 2)
    step = FRAME_SAMPLES * 2
    return [
        rtc.AudioFrame(pcm[i : i + step], SAMPLE_RATE, 1, FRAME_SAMPLES) for i in range(0, len(pcm) - step + 1, step)
    ]


@dataclass
class Harness:
    """A started session with its in-memory audio I/O and its recorder; ``timeout``: seconds per phase."""

    session: AgentSession
    audio_in: PushedAudio
    audio_out: InstantPlayback
    recorder: Recorder
    timeout: float


async def greeting(h: Harness) -> dict:
    handle = h.session.generate_reply(instructions=GREETING)
    await until("the greeting's playout", handle.done, h.timeout)
    await until("the greeting's message", lambda: h.recorder.messages("assistant"), h.timeout)
    return {"assistant": h.recorder.messages("assistant"), "segments": list(h.audio_out.segments)}


async def spoken_turn(h: Harness, speech: str) -> dict:
    assistant_before, segments_before = len(h.recorder.messages("assistant")), len(h.audio_out.segments)
    for frame in speech_frames(speech):
        h.audio_in.frames.put_nowait(frame)
    await until(
        "the spoken turn's reply and the user's transcript",
        lambda: len(h.recorder.messages("assistant")) > assistant_before and h.recorder.messages("user"),
        h.timeout,
    )
    return {
        "assistant": h.recorder.messages("assistant")[assistant_before:],
        "user": h.recorder.messages("user"),
        "segments": h.audio_out.segments[segments_before:],
    }


async def tool_round_trip(h: Harness, question: str) -> dict:
    items_before, segments_before = len(h.recorder.items), len(h.audio_out.segments)
    h.session.generate_reply(user_input=question)

    def answered() -> bool:
        after = h.recorder.items[items_before:]
        executed = [i for i, item in enumerate(after) if item["type"] == "function_tools_executed"]
        return bool(executed) and any(item.get("role") == "assistant" for item in after[executed[0] :])

    await until("the tool's spoken answer", answered, h.timeout)
    await until("the answer's playout", lambda: len(h.audio_out.segments) >= segments_before + 2, h.timeout)
    return {"items": h.recorder.items[items_before:], "segments": h.audio_out.segments[segments_before:]}


async def history_edit(h: Harness, first_message: str, edited_greeting: str, follow_up: str) -> dict:
    agent = h.session.current_agent
    edited = agent.chat_ctx.copy()
    edited.items.insert(0, llm.ChatMessage(role="user", content=[first_message]))
    greeting_item = next(i for i in edited.items if i.type == "message" and i.role == "assistant")
    greeting_item.content = [edited_greeting]
    await agent.update_chat_ctx(edited)
    items_before = len(h.recorder.items)
    h.session.generate_reply(user_input=follow_up)
    await until(
        "the reply after the edit",
        lambda: any(item.get("role") == "assistant" for item in h.recorder.items[items_before:]),
        h.timeout,
    )
    mirror = agent.realtime_llm_session.chat_ctx.items
    return {
        "greeting_id": greeting_item.id,
        "remote": [{"id": i.id, "type": i.type, "text": getattr(i, "text_content", None)} for i in mirror],
        "items": h.recorder.items[items_before:],
    }


async def run(args: argparse.Namespace, recorder: Recorder, phases: dict[str, dict]) -> None:
    """The four phases (module docstring), in order; each one's results go into ``phases`` as it completes."""
    calls = recorder.tool_calls

    @function_tool
    async def get_weather(city: str) -> str:
        """The weather in a city, now.

        Args:
            city: The city's name.
        """
        calls.append({"city": city})
        return json.dumps(WEATHER)

    model = RecordingModel(base_url=args.base_url, api_key=args.api_key)
    model.recorder = recorder
    session = AgentSession(llm=model)
    h = Harness(session, PushedAudio(), InstantPlayback(), recorder, args.phase_timeout)
    session.input.audio, session.output.audio = h.audio_in, h.audio_out
    recorder.attach(session)
    try:
        await session.start(agent=Agent(instructions=INSTRUCTIONS, tools=[get_weather]))
        phases["greeting"] = await greeting(h)
        phases["spoken"] = await spoken_turn(h, args.speech)
        phases["tool"] = await tool_round_trip(h, args.question)
        phases["history"] = await history_edit(h, args.first_message, args.edited_greeting, args.follow_up)
    finally:
        await session.aclose()
        await model.aclose()


def summary(phases: dict, recorder: Recorder, failure: str | None) -> dict:
    """The JSON the test reads: why the run stopped early (``failure``, else None), each completed phase's messages
    and audio segments (samples each), the tool's calls (from inside the function) and LiveKit's view of their
    execution, the user transcripts it got, its error events and log lines (WARNING and up), and every Realtime API
    event it sent and received (base64 audio emptied)."""
    return {
        "failure": failure,
        "phases": phases,
        "tool_calls": recorder.tool_calls,
        "tools_executed": recorder.tools_executed,
        "transcripts": recorder.transcripts,
        "items": recorder.items,
        "errors": recorder.errors,
        "log": recorder.log,
        "server_events": recorder.server_events,
        "client_events": recorder.client_events,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the server's http://HOST:PORT/v1")
    parser.add_argument("--api-key", default="x")
    parser.add_argument("--speech", required=True, help="a 24 kHz mono pcm16 WAV file: the spoken turn")
    parser.add_argument("--question", required=True, help="the typed user input that leads to the tool call")
    parser.add_argument("--first-message", required=True, help="the user message the history edit puts first")
    parser.add_argument("--edited-greeting", required=True, help="the greeting's text after the history edit")
    parser.add_argument("--follow-up", required=True, help="the typed user input after the history edit")
    parser.add_argument("--phase-timeout", type=float, default=60.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    recorder = Recorder()
    logging.getLogger().addHandler(LogRecords(recorder))
    phases: dict[str, dict] = {}
    failure = None
    try:
        asyncio.run(run(args, recorder, phases))
    except PhaseTimeout as exc:
        failure = str(exc)
    gc.collect()  # an unclosed client session is reported (logged) when it is collected
    print(json.dumps(summary(phases, recorder, failure)), flush=True)
    sys.exit(1 if failure else 0)


if __name__ == "__main__":
    main()

"""LiveKit Agents, unmodified, against the real server: ``livekit-agents`` and ``livekit-plugins-openai`` 1.8.9 in a
venv of their own (tests/helpers/venv.py), running tests/integration/frameworks/livekit_agent.py: an
``AgentSession`` over the plugin's ``RealtimeModel`` with its default settings (voice ``marin``, ``semantic_vad``,
input transcription on) and a ``function_tool``, with no room. It holds the quickstart greeting, a spoken turn (real
speech into the session's audio input, ended by the server's turn detection), a tool round trip (the model speaks,
then calls the tool; LiveKit runs it, sends its output and asks for the spoken answer) and an edit of its history (a
message inserted at ``root``, the greeting replaced where it stands) followed by a reply.

The server runs here, over the real engine on a tiny checkpoint of each model family whose thinker replays scripts
(the scripted test families), one per reply in the order LiveKit asks for them (:class:`ScriptedTurns`). The test
reads the agent's JSON summary (what LiveKit saw: its session events, every Realtime API event both ways, its log)
and checks the server's own view: no ``error`` event sent, the engine got the tool's output as a
``function_call_output`` item, and nothing of the session is left once LiveKit closes it."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from asyncio.subprocess import PIPE
from pathlib import Path

import pydantic
import pytest
from toy_family.scripted import ScriptedThinker

from pipeline.engine import OmniEngine
from pipeline.response_events import ResponseDone, ResponseStatus
from tests.helpers.scripted import openai_voice_aliases, scripted_family
from tests.helpers.scripted import scripted_engine as make_scripted_engine
from tests.helpers.server import assert_clean, served
from tests.helpers.speech import SPEECH_DIR
from tests.helpers.venv import FrameworkVenv

openai = pytest.importorskip("openai")
from openai.types.realtime import RealtimeServerEvent  # noqa: E402

pytestmark = pytest.mark.slow

SERVER_EVENT = pydantic.TypeAdapter(RealtimeServerEvent)
LIVEKIT = ("livekit-agents==1.8.9", "livekit-plugins-openai==1.8.9")
INSTALL_TIMEOUT_S = 600
VENV = FrameworkVenv("venv-livekit-1.8.9", LIVEKIT, timeout_s=INSTALL_TIMEOUT_S)
AGENT = Path(__file__).with_name("livekit_agent.py")
SPEECH = "capital_of_france.wav"
QUESTION = "What is the weather in Paris?"
WEATHER = {"sky": "clear", "celsius": 21}
"""What the agent's ``get_weather`` returns (livekit_agent.py)."""
GREETING = "Hello! How can I help you today?"
SPOKEN_REPLY = "Paris is the capital of France."
BEFORE_CALL = "Let me check."
ANSWER = "It is clear and 21 degrees in Paris."
FIRST_MESSAGE = "My name is Ada."
EDITED_GREETING = "Hello, Ada!"
FOLLOW_UP = "What is my name?"
FOLLOW_UP_REPLY = "Your name is Ada."
AGENT_TIMEOUT_S = 240
OWN_OUTPUT_WARNING = "resume_false_interruption is enabled but audio output does not support pause"
"""LiveKit's warning that the agent's in-memory audio output (which plays each segment at once) cannot pause."""


@pytest.fixture(scope="session")
def livekit_python(request) -> Path:
    """The interpreter of a venv with LiveKit Agents (in pytest's cache folder when the cache is on)."""
    return VENV.python(request.config)


@pytest.fixture(scope="module")
def scripted_engine(family_model_dir):
    with make_scripted_engine(family_model_dir) as engine:
        yield engine


class ScriptedTurns:
    """The engine, as the server sees it, with the scripted thinker driven reply by reply: each reply of a client's
    conversation plays the next of ``scripts`` (queued as the reply starts; one that does not complete, such as a
    tentative reply cancelled by more speech, is replayed by the next), and an input transcription's side request
    (which runs on the same thinker) waits until no script is playing, so that it never takes a script's tokens.
    Records the replies that completed (:attr:`completed`: their text), the function outputs the conversations got
    (:attr:`function_outputs`), the texts they got and the items they deleted, in order (:attr:`edits`), and any
    reply that started while a transcription ran (:attr:`overlaps`: the script would have been shared)."""

    def __init__(self, engine: OmniEngine, scripts: list[list[int]]) -> None:
        self._engine = engine
        self.scripted: ScriptedThinker = scripted_family(engine)
        self.scripts = scripts
        self.completed: list[str] = []
        self.function_outputs: list[tuple[str, str]] = []
        self.edits: list[tuple] = []
        self.overlaps: list[str] = []
        self.transcribing = False

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def conversation(self, *, instructions: str | None = None):
        conversation = self._engine.conversation(instructions=instructions)
        if instructions == self._engine.transcription_prompt.instructions:
            return _SideConversation(conversation, self)
        return _Conversation(conversation, self)


class _Conversation:
    def __init__(self, conversation, turns: ScriptedTurns) -> None:
        self._conversation = conversation
        self._turns = turns

    def __getattr__(self, name: str):
        return getattr(self._conversation, name)

    async def add_function_output(self, item_id: str, output: str) -> None:
        self._turns.function_outputs.append((item_id, output))
        await self._conversation.add_function_output(item_id, output)

    async def add_text(self, item_id: str, text: str, role: str = "user", *, previous_item_id: str | None = None):
        self._turns.edits.append(("add_text", item_id, role, text, previous_item_id))
        await self._conversation.add_text(item_id, text, role, previous_item_id=previous_item_id)

    async def delete_item(self, item_id: str) -> None:
        self._turns.edits.append(("delete_item", item_id))
        await self._conversation.delete_item(item_id)

    def respond(self, **kwargs):
        turns = self._turns
        if turns.transcribing:
            turns.overlaps.append(kwargs["item_id"])
        turns.scripted.reset()
        if len(turns.completed) < len(turns.scripts):
            turns.scripted.play(turns.scripts[len(turns.completed)])
        return _Response(self._conversation.respond(**kwargs), turns)


class _Response:
    def __init__(self, handle, turns: ScriptedTurns) -> None:
        self._handle = handle
        self._turns = turns

    def __getattr__(self, name: str):
        return getattr(self._handle, name)

    async def __aiter__(self):
        async for event in self._handle:
            if isinstance(event, ResponseDone) and event.status is ResponseStatus.COMPLETED:
                self._turns.completed.append(event.text)
            yield event


class _SideConversation:
    def __init__(self, conversation, turns: ScriptedTurns) -> None:
        self._conversation = conversation
        self._turns = turns

    def __getattr__(self, name: str):
        return getattr(self._conversation, name)

    async def add_text(self, *args, **kwargs) -> None:
        """The transcription request, which its side reply follows: first, no script plays nor waits."""
        head = self._turns.scripted.head
        while head.playing is not None or head.scripts:
            await asyncio.sleep(0.005)
        self._turns.transcribing = True
        await self._conversation.add_text(*args, **kwargs)

    async def close(self) -> None:
        try:
            await self._conversation.close()
        finally:
            self._turns.transcribing = False


async def run_agent(python: Path, base_url: str) -> tuple[int, dict | None, str]:
    """The agent's exit status, its summary (None when it printed none) and its stderr."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")}
    process = await asyncio.create_subprocess_exec(
        str(python),
        str(AGENT),
        "--base-url",
        base_url,
        "--speech",
        str(SPEECH_DIR / SPEECH),
        "--question",
        QUESTION,
        "--first-message",
        FIRST_MESSAGE,
        "--edited-greeting",
        EDITED_GREETING,
        "--follow-up",
        FOLLOW_UP,
        stdout=PIPE,
        stderr=PIPE,
        env=env | {"OMP_NUM_THREADS": "1"},
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), AGENT_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    lines = stdout.decode().splitlines()
    return process.returncode, json.loads(lines[-1]) if lines else None, stderr.decode(errors="replace")


def of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


@pytest.mark.background(VENV)
@pytest.mark.timeout(AGENT_TIMEOUT_S + 120)
async def test_livekit_agents_holds_a_greeting_a_spoken_turn_a_tool_round_trip_and_a_history_edit(
    livekit_python, scripted_engine, caplog
):
    caplog.set_level(logging.INFO, logger="realtime.observe.error_log")
    renderer = scripted_engine.core.renderer
    turns = ScriptedTurns(
        scripted_engine,
        [
            renderer.text(GREETING),
            renderer.text(SPOKEN_REPLY),
            renderer.text(BEFORE_CALL + "\n") + renderer.tools.call("get_weather", json.dumps({"city": "Paris"})),
            renderer.text(ANSWER),
            renderer.text(FOLLOW_UP_REPLY),
        ],
    )
    # LiveKit's default voice reaches a speaker through the server's aliases (the toy's voices need their own)
    aliases = openai_voice_aliases(scripted_engine)
    async with served(turns, vad_factory=None, voice_aliases=aliases) as (_, app):
        returncode, summary, stderr = await run_agent(livekit_python, app.state.base_url + "/v1")
        await assert_clean(app)
        errors_sent = [
            line
            for line in app.state.realtime.metrics.render().decode().splitlines()
            if line.startswith("omni_realtime_errors_total{") and float(line.rsplit(" ", 1)[1]) > 0
        ]
    turns.scripted.reset()
    assert summary is not None and summary["failure"] is None and returncode == 0, (summary, stderr[-4000:])

    # the server's view: no error event, every event valid for the openai SDK, each reply played its script
    assert not [r.getMessage() for r in caplog.records if r.name == "realtime.observe.error_log"] and not errors_sent
    assert not of(summary["server_events"], "error")
    for event in summary["server_events"]:
        SERVER_EVENT.validate_python(event)
    assert turns.completed == [GREETING, SPOKEN_REPLY, BEFORE_CALL + "\n", ANSWER, FOLLOW_UP_REPLY]
    assert not turns.overlaps

    # LiveKit's view: no error event, nothing logged at WARNING or above but what it says of the test's own output
    assert summary["errors"] == []
    assert [line for line in summary["log"] if OWN_OUTPUT_WARNING not in line] == []
    check_defaults_applied(summary)
    check_greeting_and_spoken_turn(summary)
    check_tool_round_trip(summary, turns)
    check_history_edit(summary, turns)


def check_defaults_applied(summary: dict) -> None:
    """LiveKit's default settings were sent (its first session.update) and applied in full."""
    setup = of(summary["client_events"], "session.update")[0]["session"]
    audio_in, audio_out = setup["audio"]["input"], setup["audio"]["output"]
    assert audio_in["turn_detection"]["type"] == "semantic_vad" and audio_out["voice"] == "marin"
    assert audio_in["transcription"]["model"]
    applied = of(summary["server_events"], "session.updated")[0]["session"]["audio"]
    assert applied["input"]["turn_detection"]["type"] == "semantic_vad" and applied["output"]["voice"] == "marin"
    assert applied["input"]["transcription"]["model"] == audio_in["transcription"]["model"]


def check_greeting_and_spoken_turn(summary: dict) -> None:
    """The greeting's transcript and audio arrived; the server's turn detection committed the spoken turn, and
    LiveKit got its reply and the user's transcript."""
    phases, server_events = summary["phases"], summary["server_events"]
    assert phases["greeting"]["assistant"] == [GREETING] and len(phases["greeting"]["segments"]) == 1
    assert phases["greeting"]["segments"][0] > 0
    (committed,) = of(server_events, "input_audio_buffer.committed")
    assert of(server_events, "input_audio_buffer.speech_started")
    assert of(server_events, "input_audio_buffer.speech_stopped")
    (transcribed,) = of(server_events, "conversation.item.input_audio_transcription.completed")
    assert transcribed["item_id"] == committed["item_id"] and transcribed["transcript"]
    assert phases["spoken"]["user"] == [transcribed["transcript"]]
    assert phases["spoken"]["assistant"] == [SPOKEN_REPLY] and phases["spoken"]["segments"][0] > 0


def check_tool_round_trip(summary: dict, turns: ScriptedTurns) -> None:
    """The tool was called with the scripted arguments, its output reached the engine, the answer was spoken."""
    assert summary["tool_calls"] == [{"city": "Paris"}]
    (executed,) = summary["tools_executed"]
    assert executed == {
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
        "output": json.dumps(WEATHER),
        "is_error": False,
    }
    (call_done,) = of(summary["server_events"], "response.function_call_arguments.done")
    (output_item,) = [
        e["item"] for e in of(summary["client_events"], "conversation.item.create") if e["item"]["type"] != "message"
    ]
    assert output_item["type"] == "function_call_output" and output_item["call_id"] == call_done["call_id"]
    assert [output for _, output in turns.function_outputs] == [json.dumps(WEATHER)]
    tool = summary["phases"]["tool"]
    assert [(i["type"], i.get("role"), i.get("text")) for i in tool["items"]] == [
        ("message", "user", QUESTION),
        ("message", "assistant", BEFORE_CALL + "\n"),
        ("function_tools_executed", None, None),
        ("message", "assistant", ANSWER),
    ]
    assert len(tool["segments"]) == 2 and all(samples > 0 for samples in tool["segments"])


def check_history_edit(summary: dict, turns: ScriptedTurns) -> None:
    """The new message went in at root, the greeting was deleted and created again where it stood (in LiveKit's
    mirror of the server's conversation and in the engine), and the next reply came."""
    history = summary["phases"]["history"]
    greeting_id, remote = history["greeting_id"], history["remote"]
    first_id = remote[0]["id"]
    assert (remote[0]["text"], remote[1]["id"], remote[1]["text"]) == (FIRST_MESSAGE, greeting_id, EDITED_GREETING)
    (inserted,) = [e for e in of(summary["client_events"], "conversation.item.create") if e["item"]["id"] == first_id]
    assert inserted["previous_item_id"] == "root"
    assert [e["item_id"] for e in of(summary["server_events"], "conversation.item.deleted")] == [greeting_id]
    edits = turns.edits[turns.edits.index(("add_text", first_id, "user", FIRST_MESSAGE, "root")) :]
    assert edits[1:3] == [
        ("delete_item", greeting_id),
        ("add_text", greeting_id, "assistant", EDITED_GREETING, first_id),
    ]
    assert [(i.get("role"), i.get("text")) for i in history["items"]] == [
        ("user", FOLLOW_UP),
        ("assistant", FOLLOW_UP_REPLY),
    ]

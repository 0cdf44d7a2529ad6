"""OpenAI's Agents SDK for realtime in Node (``@openai/agents-realtime``), unmodified and with its defaults, against
the real server and engine: a ``RealtimeAgent`` with instructions and a ``tool()`` in a ``RealtimeSession`` over
WebSocket holds a greeting, a spoken turn (real speech, ended by the server's turn detection) and a tool round trip
with no ``error``. The engine's thinker replays scripts (the scripted test family), queued here as the Node script
(node/agents_realtime_session.mjs) reaches each phase; the SDK's view comes back as the script's JSON summary, the
server's from its metrics and the engine's conversation."""

from __future__ import annotations

import asyncio
import json
import shutil
from asyncio.subprocess import PIPE
from pathlib import Path

import pydantic
import pytest
from toy_family.scripted import SCRIPTED

from pipeline.core.conversation_state import ItemKind
from tests.helpers.npm import NpmPackages, installed_version
from tests.helpers.paths import TESTS
from tests.helpers.scripted import call, text
from tests.helpers.scripted import scripted_engine as make_scripted_engine
from tests.helpers.server import served
from tests.helpers.speech import SPEECH_DIR

openai = pytest.importorskip("openai")
from openai.types.realtime import RealtimeServerEvent  # noqa: E402

pytestmark = pytest.mark.slow

SERVER_EVENT = pydantic.TypeAdapter(RealtimeServerEvent)
NODE_SCRIPT = TESTS / "integration" / "frameworks" / "node" / "agents_realtime_session.mjs"
PACKAGES = ("@openai/agents-realtime@0.20.0", "zod@4.6.7")
NPM = NpmPackages("npm-agents-realtime", PACKAGES, "@openai/agents-realtime")
SUMMARY_LIMIT = 16 * 1024 * 1024
"""Bytes the summary line may take (every event, audio included)."""
SPEECH = SPEECH_DIR / "capital_of_france.wav"
INSTRUCTIONS = "You are a weather assistant. Greet the caller, then answer questions about the weather."
GREETING = "Hello! Ask me about the weather."
SPOKEN_REPLY = "Paris."  # short: its script is played before the transcription of the turn starts
SPOKEN_ANSWER = "It is sunny in Paris."


@pytest.fixture(scope="session")
def agents_npm(request) -> Path:
    """A folder with the pinned ``PACKAGES`` installed (skips when npm cannot install them)."""
    folder = NPM.folder(request.config)
    assert installed_version(folder, "@openai/agents-realtime") == "0.20.0"
    return folder


@pytest.fixture(scope="module")
def scripted_engine(tiny_model_dir):
    with make_scripted_engine(tiny_model_dir) as engine:
        yield engine


async def engine_view(engine) -> dict:
    """The one open engine conversation: its instructions, tool names, item kinds (in order) and tool outputs."""

    def view(core) -> dict:
        (state,) = core.scheduler.conversations.values()
        return {
            "instructions": state.instructions,
            "tools": [tool.name for tool in state.tools],
            "items": [item.kind for item in state.items],
            "tool_outputs": [item.text for item in state.items if item.kind is ItemKind.FUNCTION_OUTPUT],
        }

    return await engine._call(view)


async def drive(engine, node) -> tuple[dict, dict] | None:
    """Answer the Node script's phases (queue the scripts each needs; read the engine before it closes); its
    summary and the engine's view, or None when it ends before its summary."""
    scripts = {
        "greeting": [text(engine, GREETING)],
        "spoken": [text(engine, SPOKEN_REPLY)],
        "tool": [call(engine, "get_weather", {"city": "Paris"}), text(engine, SPOKEN_ANSWER)],
    }
    view = None
    while line := await node.stdout.readline():
        message = json.loads(line)
        if "summary" in message:
            assert view is not None, "the summary came before the inspect phase"
            return message["summary"], view
        phase = message["ready"]
        if phase == "inspect":
            view = await engine_view(engine)
        else:
            SCRIPTED.play(*scripts[phase])
        node.stdin.write(b"go\n")
        await node.stdin.drain()
    return None  # it ended early: its exit status and stderr say why


def errors_sent(app) -> float:
    metric = app.state.realtime.metrics.errors
    return sum(
        sample.value for family in metric.collect() for sample in family.samples if sample.name.endswith("_total")
    )


async def run_session(engine, folder: Path) -> tuple[dict, dict, float]:
    """The Node script against a server on ``engine`` with the server's own turn detection (silero); its summary,
    the engine's view and the number of ``error`` events the server sent."""
    script = folder / NODE_SCRIPT.name
    shutil.copyfile(NODE_SCRIPT, script)  # beside its node_modules, where its imports resolve
    SCRIPTED.reset()
    try:
        async with served(engine, vad_factory=None) as (url, app):
            node = await asyncio.create_subprocess_exec(
                "node", str(script), url, str(SPEECH), stdin=PIPE, stdout=PIPE, stderr=PIPE, limit=SUMMARY_LIMIT
            )
            try:
                outcome = await asyncio.wait_for(drive(engine, node), 120)
                await asyncio.wait_for(node.wait(), 10)
            finally:
                if node.returncode is None:
                    node.kill()
                err = (await node.stderr.read()).decode()
                await node.wait()
            assert node.returncode == 0 and outcome is not None, f"node exited with {node.returncode}:\n{err}"
            return *outcome, errors_sent(app)
    finally:
        SCRIPTED.reset()


@pytest.mark.background(NPM)
@pytest.mark.timeout(300)
async def test_a_realtime_session_with_the_sdk_defaults_holds_a_greeting_a_spoken_turn_and_a_tool_round_trip(
    scripted_engine, agents_npm
):
    summary, view, sent = await run_session(scripted_engine, agents_npm)
    assert summary["errors"] == [] and sent == 0, summary["errors"]
    for event in summary["events"]:
        SERVER_EVENT.validate_python(event)
    types = [event["type"] for event in summary["events"]]
    # the SDK's defaults applied in full: the agent's instructions and tool, semantic_vad, input transcription
    session = summary["session"]
    assert session["instructions"] == INSTRUCTIONS
    assert session["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    assert session["audio"]["input"]["transcription"]["model"] == "gpt-4o-mini-transcribe"
    assert [t["name"] for t in session["tools"]] == ["get_weather"]
    assert view["instructions"] == INSTRUCTIONS and view["tools"] == ["get_weather"]

    greeting, spoken, calling, answer = summary["responses"]
    assert all(r["status"] == "completed" for r in summary["responses"]), summary["responses"]
    assert greeting["transcript"] == GREETING and greeting["audioBytes"] > 0
    # the spoken turn: committed by the server's turn detection, transcribed, answered with speech
    assert types.count("input_audio_buffer.speech_stopped") == 1
    assert types.count("input_audio_buffer.committed") == 1
    assert spoken["transcript"] == SPOKEN_REPLY and spoken["audioBytes"] > 0
    # the tool round trip: the SDK ran the tool with the scripted arguments, its output reached the engine,
    # and the answer was spoken
    assert calling["output"] == ["function_call"] and calling["audioBytes"] == 0
    assert summary["toolCalls"] == [{"city": "Paris"}]
    assert summary["toolEnds"] == [{"name": "get_weather", "result": "Sunny and 21 degrees in Paris."}]
    assert answer["transcript"] == SPOKEN_ANSWER and answer["audioBytes"] > 0
    # the SDK's history: the user's spoken turn carries our transcript, the call its tool's output
    (heard,) = summary["inputTranscripts"]
    assert summary["history"] == [
        {"type": "message", "role": "assistant", "content": [["output_audio", GREETING]], "output": None},
        {"type": "message", "role": "user", "content": [["input_audio", heard]], "output": None},
        {"type": "message", "role": "assistant", "content": [["output_audio", SPOKEN_REPLY]], "output": None},
        {
            "type": "message",
            "role": "user",
            "content": [["input_text", "What is the weather in Paris?"]],
            "output": None,
        },
        {"type": "function_call", "role": None, "content": [], "output": "Sunny and 21 degrees in Paris."},
        {"type": "message", "role": "assistant", "content": [["output_audio", SPOKEN_ANSWER]], "output": None},
    ]
    assert view["items"] == [
        ItemKind.REPLY,
        ItemKind.AUDIO,
        ItemKind.REPLY,
        ItemKind.TEXT,
        ItemKind.FUNCTION_CALL,
        ItemKind.FUNCTION_OUTPUT,
        ItemKind.REPLY,
    ]
    assert view["tool_outputs"] == ["Sunny and 21 degrees in Paris."]

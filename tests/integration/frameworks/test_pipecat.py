"""pipecat (``pipecat-ai`` 1.14.0) unmodified against the real server: its ``OpenAIRealtimeLLMService`` in a pipeline
with no transport (tests/integration/frameworks/pipecat_agent.py, run by the interpreter of a venv of its own),
configured with an OpenAI voice name, input transcription and a tool, holds a greeting, a spoken turn and a tool
round trip with no ``error`` event.

The server runs here, in-process, on the real engine over a tiny checkpoint of each model family with the scripted
thinker (tests/toy_family/scripted.py), so the model says exactly what the test needs: a greeting, then, to the
spoken turn, a few words and a call of the tool, then an answer once the tool's result is in. The transcription side
conversations (one per committed spoken turn) are served by a second engine (the plain tiny one of the family): the
scripted head replays its scripts for whichever conversation asks next, and a transcription running beside a reply
would take the reply's tokens. The server's transcription path (commit, side request, the three events) is the real one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys

import pytest

from tests.helpers.paths import TESTS
from tests.helpers.scripted import openai_voice_aliases, scripted_family
from tests.helpers.scripted import scripted_engine as make_scripted_engine
from tests.helpers.server import served
from tests.helpers.speech import SPEECH_DIR
from tests.helpers.venv import FrameworkVenv

pytestmark = pytest.mark.slow

AGENT = TESTS / "integration" / "frameworks" / "pipecat_agent.py"
SPOKEN_TURN = SPEECH_DIR / "weather_today.wav"
GREETING = "Hello! How can I help?"
BEFORE_CALL = "Let me check.\n"
ANSWER = "It is sunny in Paris."
WEATHER_CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
WEATHER_RESULT = {"sky": "clear", "temperature_c": 21}  # what the agent's tool returns
AGENT_TIMEOUT_S = 150
PIPECAT = ("pipecat-ai[openai]==1.14.0",)
INSTALL_TIMEOUT_S = 600
VENV = FrameworkVenv("venv-pipecat-1.14.0", PIPECAT, timeout_s=INSTALL_TIMEOUT_S)


class Routed:
    """The scripted engine, whose transcription side conversations go to ``transcriber`` instead (see the module
    docstring); records the function outputs and truncations the server hands the scripted engine."""

    def __init__(self, engine, transcriber) -> None:
        self._engine = engine
        self._transcriber = transcriber
        self.function_outputs: list[str] = []
        self.truncations: list[int] = []
        self.transcriptions = 0

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def conversation(self, *, instructions: str | None = None):
        if instructions == self._engine.transcription_prompt.instructions:
            self.transcriptions += 1
            return self._transcriber.conversation(instructions=instructions)
        return _Watched(self._engine.conversation(instructions=instructions), self)


class _Watched:
    def __init__(self, conversation, routed: Routed) -> None:
        self._conversation = conversation
        self._routed = routed

    def __getattr__(self, name: str):
        return getattr(self._conversation, name)

    async def truncate_item(self, item_id: str, audio_end_ms: int) -> None:
        self._routed.truncations.append(audio_end_ms)
        await self._conversation.truncate_item(item_id, audio_end_ms)

    async def add_function_output(self, item_id: str, output: str) -> None:
        self._routed.function_outputs.append(output)
        await self._conversation.add_function_output(item_id, output)


@pytest.fixture(scope="module")
def scripted_engine(family_model_dir):
    with make_scripted_engine(family_model_dir, greedy_talker=False) as engine:
        yield engine


@pytest.fixture(scope="module")
def pipecat(request):
    return VENV.python(request.config)


def script(engine) -> list[list[int]]:
    """One token script per response pipecat will ask for, in order."""
    text = engine.core.renderer.text
    call = engine.core.renderer.tools.call(WEATHER_CALL["name"], json.dumps(WEATHER_CALL["arguments"]))
    return [text(GREETING), text(BEFORE_CALL) + call, text(ANSWER)]


async def run_agent(python, url: str) -> tuple[dict, str]:
    agent = await asyncio.create_subprocess_exec(
        str(python),
        str(AGENT),
        "--url",
        url,
        "--wav",
        str(SPOKEN_TURN),
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(agent.communicate(), AGENT_TIMEOUT_S)
    log = err.decode()
    assert agent.returncode == 0, f"the pipecat agent exited with {agent.returncode}:\n{log[-6000:]}"
    return json.loads(out.decode().strip().splitlines()[-1]), log


@pytest.mark.background(VENV)
@pytest.mark.timeout(600)
async def test_pipecat_holds_a_greeting_a_spoken_turn_and_a_tool_round_trip(
    scripted_engine, family_engine, pipecat, caplog
):
    caplog.set_level(logging.INFO, logger="realtime.observe.error_log")
    scripted = scripted_family(scripted_engine)
    scripted.reset()
    scripted.play(*script(scripted_engine))
    routed = Routed(scripted_engine, family_engine)
    try:
        # pipecat's OpenAI voice name reaches a speaker through the server's aliases (the toy's voices need their own,
        # as an operator would set them for a checkpoint whose speakers are not Qwen's)
        aliases = openai_voice_aliases(scripted_engine)
        async with served(routed, vad_factory=None, voice_aliases=aliases) as (url, _app):
            summary, log = await run_agent(pipecat, url)
    finally:
        scripted.reset()
    print(log[-4000:], file=sys.stderr)
    # the server sent no error event
    assert [r.getMessage() for r in caplog.records if r.name == "realtime.observe.error_log"] == []
    assert summary["errors"] == [] and not summary["timed_out"], summary
    greeting, before_call, answer = summary["responses"][:3]
    assert greeting["transcript"] == GREETING and greeting["audio_bytes"] > 0
    # the spoken turn: its reply speaks, then calls the tool; pipecat runs it and the answer is spoken
    assert before_call["transcript"] == BEFORE_CALL and before_call["audio_bytes"] > 0
    assert summary["calls"] == [WEATHER_CALL]
    assert [json.loads(output) for output in routed.function_outputs] == [WEATHER_RESULT]
    assert answer["transcript"] == ANSWER and answer["audio_bytes"] > 0
    # on speech_started pipecat truncates its last reply (without a transport it never learns the greeting was
    # played out); the server applies it, also when the turn's own reply has begun by the time it arrives
    assert len(routed.truncations) == 1 and routed.truncations[0] >= 0
    # the user's side of pipecat's history comes from the server's input transcription
    assert routed.transcriptions == 1
    (transcript,) = summary["transcriptions"]
    users = [m for m in summary["context"] if m.get("role") == "user"]
    assert transcript.strip() and [m["content"] for m in users] == [transcript.strip()], summary["context"]
    # and its history holds the call and the tool's result
    (tool,) = [m for m in summary["context"] if m.get("role") == "tool"]
    assert json.loads(tool["content"]) == WEATHER_RESULT, summary["context"]
    calls = [c["function"] for m in summary["context"] for c in m.get("tool_calls", [])]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [tuple(WEATHER_CALL.values())]

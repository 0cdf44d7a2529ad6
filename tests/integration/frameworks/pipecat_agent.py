"""A pipecat voice agent against a Realtime server, run by the interpreter of a venv with ``pipecat-ai[openai]``
(never imported by the test suite itself: pipecat is not installed in the project's environment).

``OpenAIRealtimeLLMService`` sits in a ``Pipeline`` with no transport, between the aggregators of an ``LLMContext``;
frames are injected into the pipeline's worker. The service is configured as a pipecat user would configure it: an
OpenAI voice name, input audio transcription on, server VAD, and one tool (a ``ToolsSchema`` in the context, its
handler registered with ``register_function``). The agent holds:

1. a greeting: an ``LLMRunFrame`` on a context that holds no message (the system instruction is a setting);
2. a spoken turn: the WAV file's speech (with trailing silence, so the server's VAD ends the turn) as 20 ms
   ``InputAudioRawFrame`` frames at the pipeline's input rate; the server answers on its own (``create_response``);
3. whatever the model does then: the test's scripted model speaks, calls the tool, and speaks again once the tool's
   result is in.

It stops once ``--responses`` responses have ended, the tool ran ``--calls`` times and the context holds a user
message (built by pipecat from the server's input transcription), or after ``--timeout`` seconds, and prints one JSON
object on stdout: the responses (their spoken transcript and audio bytes, split at pipecat's response ends), the
tool calls, the input transcripts pipecat was given, its context's messages and every pipeline error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import wave

import numpy as np
from loguru import logger
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    EndFrame,
    Frame,
    InputAudioRawFrame,
    LLMFullResponseEndFrame,
    LLMRunFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams
from pipecat.services.openai.realtime import events
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

INPUT_RATE = 16000  # pipecat's default pipeline input rate (PipelineParams.audio_in_sample_rate)
FRAME_MS = 20
TRAILING_SILENCE_MS = 1000
WEATHER = FunctionSchema(
    name="get_weather",
    description="The weather in a city, now.",
    properties={"city": {"type": "string"}},
    required=["city"],
)
WEATHER_RESULT = {"sky": "clear", "temperature_c": 21}


class Summary:
    """What the agent saw, and an event set whenever it changes."""

    def __init__(self, context: LLMContext) -> None:
        self.context = context
        self.responses: list[dict] = [{"transcript": "", "audio_bytes": 0}]
        self.calls: list[dict] = []
        self.transcriptions: list[str] = []
        self.errors: list[str] = []
        self.changed = asyncio.Event()

    @property
    def ended(self) -> int:
        return len(self.responses) - 1

    def touch(self) -> None:
        self.changed.set()

    async def until(self, ready, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not ready():
                self.changed.clear()
                await self.changed.wait()

    def as_json(self, timed_out: bool) -> dict:
        return {
            "responses": self.responses[:-1],
            "calls": self.calls,
            "transcriptions": self.transcriptions,
            "context": [m for m in self.context.get_messages() if isinstance(m, dict)],
            "errors": self.errors,
            "timed_out": timed_out,
        }


class Recorder(FrameProcessor):
    """Passes every frame on; notes those flowing ``direction`` that the summary keeps."""

    def __init__(self, summary: Summary, direction: FrameDirection) -> None:
        super().__init__()
        self.summary = summary
        self.direction = direction

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == self.direction:
            self._note(frame)
        await self.push_frame(frame, direction)

    def _note(self, frame: Frame) -> None:
        current = self.summary.responses[-1]
        if isinstance(frame, TTSAudioRawFrame):
            current["audio_bytes"] += len(frame.audio)
        elif isinstance(frame, TTSTextFrame):
            current["transcript"] += frame.text
        elif isinstance(frame, LLMFullResponseEndFrame):
            self.summary.responses.append({"transcript": "", "audio_bytes": 0})
        elif isinstance(frame, TranscriptionFrame):
            self.summary.transcriptions.append(frame.text)
        else:
            return
        self.summary.touch()


def speech_frames(path: str) -> list[InputAudioRawFrame]:
    """The WAV file (pcm16 mono) and trailing silence, at :data:`INPUT_RATE`, in 20 ms frames."""
    with wave.open(path) as wav:
        rate, pcm = wav.getframerate(), np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16)
    times = np.arange(int(len(pcm) * INPUT_RATE / rate)) / INPUT_RATE
    audio = np.interp(times, np.arange(len(pcm)) / rate, pcm.astype(np.float32)).astype(np.int16)
    audio = np.concatenate([audio, np.zeros(INPUT_RATE * TRAILING_SILENCE_MS // 1000, dtype=np.int16)])
    step = INPUT_RATE * FRAME_MS // 1000
    return [
        InputAudioRawFrame(audio=audio[i : i + step].tobytes(), sample_rate=INPUT_RATE, num_channels=1)
        for i in range(0, len(audio), step)
    ]


def realtime_service(args: argparse.Namespace) -> OpenAIRealtimeLLMService:
    session = events.SessionProperties(
        audio=events.AudioConfiguration(
            input=events.AudioInput(
                transcription=events.InputAudioTranscription(),
                turn_detection=events.TurnDetection(),
            ),
            output=events.AudioOutput(voice=args.voice),
        ),
    )
    settings = OpenAIRealtimeLLMService.Settings(
        model=args.model, system_instruction=args.instructions, session_properties=session
    )
    return OpenAIRealtimeLLMService(api_key=args.api_key, base_url=args.url, settings=settings)


async def run(args: argparse.Namespace) -> dict:
    context = LLMContext(tools=ToolsSchema(standard_tools=[WEATHER]))
    summary = Summary(context)
    llm = realtime_service(args)

    async def get_weather(params: FunctionCallParams) -> None:
        summary.calls.append({"name": params.function_name, "arguments": params.arguments})
        summary.touch()
        await params.result_callback(WEATHER_RESULT)

    llm.register_function("get_weather", get_weather)
    aggregators = LLMContextAggregatorPair(context)
    pipeline = Pipeline(
        [
            aggregators.user(),
            Recorder(summary, FrameDirection.UPSTREAM),
            llm,
            Recorder(summary, FrameDirection.DOWNSTREAM),
            aggregators.assistant(),
        ]
    )
    worker = PipelineWorker(
        pipeline, params=PipelineParams(audio_in_sample_rate=INPUT_RATE), idle_timeout_secs=None, enable_rtvi=False
    )

    @worker.event_handler("on_pipeline_error")
    async def on_pipeline_error(_worker, frame) -> None:
        summary.errors.append(str(frame.error))
        summary.touch()

    def user_heard() -> bool:
        return any(m.get("role") == "user" for m in summary.as_json(False)["context"])

    async def drive() -> None:
        await worker.queue_frame(LLMRunFrame())
        await summary.until(lambda: summary.ended >= 1 or summary.errors, args.timeout)
        await worker.queue_frames(speech_frames(args.wav))
        await summary.until(
            lambda: (
                summary.errors
                or (summary.ended >= args.responses and len(summary.calls) >= args.calls and user_heard())
            ),
            args.timeout,
        )

    runner = WorkerRunner(handle_sigint=False)
    running = asyncio.create_task(runner.run(worker))
    timed_out = False
    try:
        await drive()
    except TimeoutError:
        timed_out = True
    await worker.queue_frame(EndFrame())
    await asyncio.wait_for(running, 30)
    return summary.as_json(timed_out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the server's ws://HOST:PORT/v1/realtime")
    parser.add_argument("--wav", required=True, help="the spoken turn: a pcm16 mono WAV file")
    parser.add_argument("--api-key", default="pipecat-test")
    parser.add_argument("--model", default="gpt-realtime")
    parser.add_argument("--voice", default="alloy")
    parser.add_argument("--instructions", default="You are a helpful voice assistant. Greet the user briefly.")
    parser.add_argument("--responses", type=int, default=3, help="responses to wait for, the greeting included")
    parser.add_argument("--calls", type=int, default=1, help="tool calls to wait for")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait at each step")
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="DEBUG")
    print(json.dumps(asyncio.run(run(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

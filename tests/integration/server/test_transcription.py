"""Input audio transcription over a WebSocket on the tiny engine, with the real VAD: every committed turn of a
two-turn spoken conversation gets its transcription events, and no transcription side request starts between a
reply's request and its first audio (the engine's own moments, recorded in order by a wrapper)."""

from __future__ import annotations

import base64
import json

import pytest

from pipeline.response_events import AudioChunk
from tests.helpers.server import assert_clean, connect, served
from tests.helpers.speech import FRAME_BYTES, SPEECH_DIR, b64, wav_pcm

pytestmark = pytest.mark.slow

MANIFEST = json.loads((SPEECH_DIR / "manifest.json").read_text())
TURNS = ("pair_turn1_name.wav", "pair_turn2_recall.wav")
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"
FAILED = "conversation.item.input_audio_transcription.failed"


class Timeline:
    """Wraps an engine and records, in order, ``("reply", n)`` when a reply is requested, ``("first_audio", n)`` at
    its first audio chunk, and ``("transcription", k)`` when a transcription side conversation opens."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.log: list[tuple[str, int]] = []

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def conversation(self, *, instructions: str | None = None):
        conversation = self._engine.conversation(instructions=instructions)
        if instructions == self._engine.transcription_prompt.instructions:
            self.log.append(("transcription", self.count("transcription")))
            return conversation
        return _Conversation(conversation, self)

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.log if k == kind)


class _Conversation:
    def __init__(self, conversation, timeline: Timeline) -> None:
        self._conversation = conversation
        self._timeline = timeline

    def __getattr__(self, name: str):
        return getattr(self._conversation, name)

    def respond(self, **kwargs):
        n = self._timeline.count("reply")
        self._timeline.log.append(("reply", n))
        return _Response(self._conversation.respond(**kwargs), self._timeline, n)


class _Response:
    def __init__(self, handle, timeline: Timeline, n: int) -> None:
        self._handle = handle
        self._timeline = timeline
        self._n = n

    def __getattr__(self, name: str):
        return getattr(self._handle, name)

    async def __aiter__(self):
        heard = False
        async for event in self._handle:
            if isinstance(event, AudioChunk) and not heard:
                heard = True
                self._timeline.log.append(("first_audio", self._n))
            yield event


async def spoken_conversation(url: str, transcription: dict | None) -> list[dict]:
    """Two spoken turns (the VAD ends each), each answered; returns every event the client read."""
    async with connect(url) as client:
        audio_input: dict = {"transcription": transcription}
        session = {"type": "realtime", "max_output_tokens": 24, "audio": {"input": audio_input}}
        await client.send({"type": "session.update", "session": session})
        await client.until("session.updated")
        for name in TURNS:
            pcm = wav_pcm(name) + bytes(800 * 48)  # the turn, then silence past the VAD's window
            for i in range(0, len(pcm), FRAME_BYTES):
                await client.send({"type": "input_audio_buffer.append", "audio": b64(pcm[i : i + FRAME_BYTES])})
            await client.until("response.done", timeout=120)
        if transcription is not None:
            while len(client.of_type(COMPLETED)) + len(client.of_type(FAILED)) < len(TURNS):
                await client.next(timeout=120)
        return client.events


@pytest.mark.timeout(300)
async def test_every_spoken_turn_is_transcribed_and_no_reply_waits_for_it(tiny_engine):
    timeline = Timeline(tiny_engine)
    async with served(timeline, vad_factory=None) as (url, app):
        events = await spoken_conversation(url, {"model": "whisper-1", "language": "en"})
        await assert_clean(app)
        types = [e["type"] for e in events]
        assert "error" not in types and FAILED not in types
        committed = [e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed"]
        completed = [e for e in events if e["type"] == COMPLETED]
        assert len(committed) == len(TURNS) and [e["item_id"] for e in completed] == committed
        for done in completed:
            deltas = [e["delta"] for e in events if e["type"] == DELTA and e["item_id"] == done["item_id"]]
            assert "".join(deltas) == done["transcript"] and done["transcript"]
            assert done["usage"]["input_token_details"]["audio_tokens"] > 0
            assert 0 < done["usage"]["output_tokens"] <= 16 + 10 * MANIFEST[TURNS[0]]["duration_ms"] / 1000 + 1
        # each turn's transcription started after its reply's first audio, and none between a reply's request
        # and its first audio
        log = timeline.log
        assert timeline.count("transcription") == len(TURNS) and timeline.count("reply") == len(TURNS)
        for k in range(len(TURNS)):
            request, first_audio = log.index(("reply", k)), log.index(("first_audio", k))
            assert first_audio < log.index(("transcription", k))
            assert not [entry for entry in log[request:first_audio] if entry[0] == "transcription"]
        # the client saw each reply's first audio before that turn's transcription
        for k, item_id in enumerate(committed):
            reply = [e for e in events if e["type"] == "response.created"][k]["response"]["id"]
            first_audio = next(
                i
                for i, e in enumerate(events)
                if e["type"] == "response.output_audio.delta" and e["response_id"] == reply
            )
            first_delta = next(i for i, e in enumerate(events) if e["type"] == DELTA and e["item_id"] == item_id)
            assert first_audio < first_delta
            assert base64.b64decode(events[first_audio]["delta"])

        # the same conversation without transcription: no side request, no transcription event
        timeline.log.clear()
        events = await spoken_conversation(url, None)
        await assert_clean(app)
        assert timeline.count("transcription") == 0 and timeline.count("reply") == len(TURNS)
        assert not [e for e in events if e["type"].startswith("conversation.item.input_audio_transcription")]
        assert "error" not in [e["type"] for e in events]

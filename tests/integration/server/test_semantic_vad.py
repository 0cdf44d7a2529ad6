"""``semantic_vad`` through the real server (WebSocket, silero VAD, the turn scorer on its thread): a turn the model
judges complete ends after the short silence, an incomplete one waits up to the eagerness's limit, a model that
fails to load leaves silence-based detection (one warning, the metric), preemptive replies shown and withdrawn, and
the real Smart Turn v3.2 on one clear fixture; and a WebRTC call whose turn the model ends.

The scripted models answer by call order, so each test's outcome follows from the audio and the answers alone: the
clients send their audio faster than real time, and the detector waits for a pending answer before the silence
would end the turn without it (realtime/turns/semantic_detector.py)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence

import numpy as np
import pytest

from realtime.config import ServerConfig
from realtime.server.app import create_app, serve_in_background
from realtime.turns.semantic import HIGH, MEDIUM, SemanticVadConfig
from realtime.turns.smart_turn import TurnModelUnavailable
from tests.fakes import FakeEngine, Script
from tests.helpers.server import Client, connect
from tests.helpers.speech import FRAME_BYTES, b64, wav_pcm

FIXTURE = "short_joke.wav"  # Smart Turn v3.2 scores it ~0.99 complete with 200 ms of silence
FRAME_MS = 32  # silero's frame: the detector decides at frame ends
SCORE_AFTER_MS = SemanticVadConfig().score_after_ms


class Scripted:
    """A turn model answering ``answers`` in call order (the last one from then on); counts its calls."""

    def __init__(self, *answers: float) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, audios: Sequence[np.ndarray]) -> np.ndarray:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        assert all(len(a) > 0 for a in audios), "the model hears the turn's audio"
        return np.full(len(audios), answer)


@contextlib.asynccontextmanager
async def served(engine, turn_model) -> AsyncIterator[tuple[str, object]]:
    """A real server on loopback whose turn model ``turn_model()`` loads; yields its /v1/realtime URL and the app."""
    cfg = ServerConfig(port=0, webrtc=False)
    app = create_app(cfg, engine=engine, turn_model=turn_model)
    async with serve_in_background(app, cfg) as url:
        yield url.replace("http://", "ws://") + "/v1/realtime", app


def silence(ms: int) -> bytes:
    """``ms`` of 24 kHz pcm16 silence."""
    return bytes(ms * 48)


async def append(client: Client, pcm: bytes) -> None:
    """Send ``pcm`` as ``input_audio_buffer.append`` events, one 20 ms frame each, as fast as the socket takes them."""
    for i in range(0, len(pcm), FRAME_BYTES):
        await client.send({"type": "input_audio_buffer.append", "audio": b64(pcm[i : i + FRAME_BYTES])})


def scripted(*answers: float):
    return lambda: Scripted(*answers)


def semantic(eagerness: str) -> dict:
    return {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": eagerness}}},
        },
    }


async def turn_end_ms(turn_model, eagerness: str) -> tuple[int, str]:
    """Where ``speech_stopped`` put the end of the fixture turn (followed by 3 s of silence), and the metrics."""
    engine = FakeEngine(Script(text=("Ha.",), audio_chunks=1))
    async with served(engine, turn_model) as (url, app), connect(url) as client:
        await client.send(semantic(eagerness))
        await client.until("session.updated")
        await append(client, wav_pcm(FIXTURE) + silence(3000))
        stopped = await client.until("input_audio_buffer.speech_stopped")
        await client.until("response.done")
        types = [e["type"] for e in client.events]
        assert types.count("input_audio_buffer.speech_stopped") == 1 and "error" not in types
        return stopped["audio_end_ms"], app.state.realtime.metrics.render().decode()


def ends_early(end_ms: int, unscored_end_ms: int, limits) -> bool:
    """``end_ms`` lies where an answer "complete" puts it: from the short silence (an answer landing at once) to
    before the silence that ends a turn without an answer (one landing as late as the detector lets it)."""
    earliest = unscored_end_ms - (limits.unscored_wait_ms - SCORE_AFTER_MS) - FRAME_MS
    return earliest <= end_ms < unscored_end_ms


async def test_a_complete_turn_ends_at_the_short_silence_an_incomplete_one_at_the_eagerness_limit():
    unscored, _ = await turn_end_ms(None, "auto")  # no model: the turn ends after medium's unscored wait
    complete, metrics = await turn_end_ms(scripted(1.0), "auto")
    incomplete, _ = await turn_end_ms(scripted(0.0), "auto")
    assert ends_early(complete, unscored, MEDIUM)
    assert abs((incomplete - unscored) - (MEDIUM.max_wait_ms - MEDIUM.unscored_wait_ms)) <= FRAME_MS
    assert "omni_realtime_turn_model_latency_seconds_count 1.0" in metrics
    assert "omni_realtime_turn_model_fallback_turns_total 0.0" in metrics


async def test_high_eagerness_answers_sooner_and_waits_less():
    unscored, _ = await turn_end_ms(None, "high")
    incomplete, _ = await turn_end_ms(scripted(0.0), "high")
    assert abs((incomplete - unscored) - (HIGH.max_wait_ms - HIGH.unscored_wait_ms)) <= FRAME_MS
    # 0.9 is "complete" to high, not to medium (which ends a turn at once only on a near-certain answer)
    assert ends_early((await turn_end_ms(scripted(0.9), "high"))[0], unscored, HIGH)
    medium_unscored, _ = await turn_end_ms(None, "medium")
    medium, _ = await turn_end_ms(scripted(0.9), "medium")
    assert abs((medium - medium_unscored) - (MEDIUM.max_wait_ms - MEDIUM.unscored_wait_ms)) <= FRAME_MS


async def test_a_model_that_fails_to_load_leaves_silence_detection_with_one_warning_and_the_metric(caplog):
    def broken():
        raise TurnModelUnavailable("no model here")

    unscored, _ = await turn_end_ms(None, "auto")
    with caplog.at_level(logging.WARNING, logger="realtime.turns.smart_turn"):
        fallback, metrics = await turn_end_ms(broken, "auto")
    warnings = [r for r in caplog.records if r.name == "realtime.turns.smart_turn" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no model here" in warnings[0].getMessage()
    assert "omni_realtime_turn_model_failures_total 1.0" in metrics
    assert "omni_realtime_turn_model_fallback_turns_total 1.0" in metrics
    assert fallback == unscored  # the turn ends on silence alone, after medium's unscored wait


async def test_a_preemptive_reply_withdrawn_at_a_judged_incomplete_pause_then_shown_when_complete():
    from realtime.bench.speech import DEFAULT_FOLDER, load_speech_folder, with_pause

    (speech,) = [s for s in load_speech_folder(DEFAULT_FOLDER) if s.name == "capital_of_france.wav"]
    paused = with_pause(speech, 600)  # the user stops 600 ms mid-sentence, then goes on
    pcm = (np.clip(paused.pcm, -1, 1) * 32767).astype("<i2").tobytes() + silence(1500)
    model = Scripted(0.1, 1.0)  # the pause sounds incomplete, the end complete
    engine = FakeEngine(Script(text=("Paris.",), audio_chunks=2, delay_s=0.02))
    async with served(engine, lambda: model) as (url, app), connect(url) as client:
        await client.send(semantic("auto"))
        await client.until("session.updated")
        await append(client, pcm)
        done = await client.until("response.done")
        assert done["response"]["status"] == "completed"
        types = [e["type"] for e in client.events]
        assert types.count("input_audio_buffer.speech_stopped") == types.count("response.created") == 1
        assert "error" not in types and model.calls == 2
        conversation = engine.conversations[0]
        first, answer = conversation.responses
        assert first.cancel_reason == "turn_detected" and answer.cancel_reason is None
        metrics = app.state.realtime.metrics.render().decode()
        assert 'omni_realtime_preemptive_replies_total{outcome="withdrawn"} 1.0' in metrics
        assert 'omni_realtime_preemptive_replies_total{outcome="shown"} 1.0' in metrics


@pytest.mark.timeout(120)
async def test_the_bundled_smart_turn_model_ends_a_clear_complete_turn_at_the_short_silence():
    from tests.helpers.turn_model import turn_model

    turn_model()  # skips without the turn extra
    from realtime.server.turn_model import bundled_turn_model

    real, metrics = await turn_end_ms(bundled_turn_model, "high")
    unscored, _ = await turn_end_ms(None, "high")
    assert ends_early(real, unscored, HIGH)  # judged complete: the turn ends before the silence alone would end it
    assert "omni_realtime_turn_model_latency_seconds_count 1.0" in metrics
    assert "omni_realtime_turn_model_failures_total 0.0" in metrics


@pytest.mark.timeout(60)
async def test_a_webrtc_call_ends_its_turn_through_the_turn_model():
    """The other transport: a WebRTC call (aiortc client, loopback, its microphone paced in real time) whose session
    asks for ``semantic_vad`` ends the turn where the model's "complete" puts it, well before low eagerness's
    silence-only window would, and the model was asked once."""
    pytest.importorskip("aiortc")
    import soxr

    from realtime.observe.metrics import ServerMetrics
    from realtime.protocol.turn_detection import ServerVadParams
    from realtime.server.turn_model import TurnModelService
    from realtime.transports.webrtc import WebRTCCalls
    from realtime.turns.semantic import LOW
    from realtime.turns.server_vad import SpeechStarted, SpeechStopped, TurnDetector
    from realtime.turns.vad import SileroVad
    from tests.helpers.webrtc_peer import ClientPeer, speech

    fixture = "capital_of_france"
    # where silero puts the fixture's speech (16 kHz, as the call's detector hears it), and that the model is asked
    # once, at its end: no pause inside it reaches score_after_ms
    pcm16k = soxr.resample(speech(fixture), 24_000, 16_000).astype(np.float32)
    offline = TurnDetector(ServerVadParams(silence_duration_ms=LOW.unscored_wait_ms), SileroVad(), pause_ms=0)
    events = offline.feed(np.concatenate([pcm16k, np.zeros(16_000, np.float32)]))
    (started,) = [e for e in events if isinstance(e, SpeechStarted)]
    (stopped,) = [e for e in events if isinstance(e, SpeechStopped)]
    speech_ms = stopped.speech_end_ms - started.speech_start_ms

    model = Scripted(1.0)
    metrics = ServerMetrics()
    service = TurnModelService(lambda: model, metrics)

    def detection():
        vad = SileroVad()
        return lambda params: service.detector(params, vad) if params.eagerness else TurnDetector(params, vad)

    engine = FakeEngine(Script(text=("Paris.",), audio_chunks=1))
    calls = WebRTCCalls(engine, turn_detector_factory=detection, ice_host_addresses=("127.0.0.1",))
    client = ClientPeer()
    try:
        overrides = semantic("low")["session"]
        await client.call(calls, session_overrides=overrides)
        _, updated = await client.wait_for("session.updated")
        assert updated["session"]["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
        client.say(fixture)
        _, speech_started = await client.wait_for("input_audio_buffer.speech_started")
        _, speech_stopped = await client.wait_for("input_audio_buffer.speech_stopped")
        _, done = await client.wait_for("response.done")
        assert done["response"]["status"] == "completed"
        # the call's clock began before the fixture: anchor it on the speech start (prefix padding included)
        speech_start_ms = speech_started["audio_start_ms"] + ServerVadParams().prefix_padding_ms
        silence_ms = speech_stopped["audio_end_ms"] - (speech_start_ms + speech_ms)
        assert SCORE_AFTER_MS - 2 * FRAME_MS <= silence_ms < LOW.unscored_wait_ms - 4 * FRAME_MS, silence_ms
        assert model.calls == 1 and client.types().count("input_audio_buffer.speech_stopped") == 1
        rendered = metrics.render().decode()
        assert "omni_realtime_turn_model_latency_seconds_count 1.0" in rendered
        assert "omni_realtime_turn_model_fallback_turns_total 0.0" in rendered
    finally:
        await client.close()
        await calls.close()
        await service.close()

"""realtime.turns.vad_batch: every session's VAD frames scored in shared silero calls, equal to one model per
session."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from realtime.protocol.turn_detection import ServerVadParams
from realtime.turns.server_vad import TurnDetector
from realtime.turns.vad import BatchedSpeechProbability, SileroVad
from realtime.turns.vad_batch import SileroBatchModel, VadBatcher
from tests.helpers.speech import load_16k

CLIPS = ["capital_of_france.wav", "short_joke.wav", "count_to_five.wav"]
N = SileroBatchModel.frame_samples
TOL = 1e-4
"""Batched and one-row calls of the same float32 network take different CPU kernel paths (blocking of the convolutions
and the LSTM's products), so the probabilities agree to float rounding, not bit for bit: 1.8e-5 apart at most on an
AVX-512 host, below 1e-5 on an older one. The VAD's decisions compare against thresholds."""


@pytest.fixture(scope="module")
def model() -> SileroBatchModel:
    return SileroBatchModel()


def frames_of(name: str, count: int) -> np.ndarray:
    x = load_16k(name)
    return np.stack([x[i * N : (i + 1) * N] for i in range(count)])


def test_a_batch_scores_each_stream_as_its_own_model_would(model):
    clips = [frames_of(name, 40) for name in CLIPS]
    alone = []
    for clip in clips:
        vad = SileroVad()
        alone.append([vad(frame) for frame in clip])
    states = [model.new_state() for _ in clips]
    together = [model.run(states, np.stack([clip[t] for clip in clips])) for t in range(40)]
    np.testing.assert_allclose(np.array(together).T, np.array(alone), atol=TOL)
    assert max(max(p) for p in alone) > 0.5  # speech is in there: the comparison is not of zeros


def test_streams_join_and_reset_independently(model):
    a, b = frames_of("capital_of_france.wav", 12), frames_of("short_joke.wav", 12)
    sa, sb = model.new_state(), model.new_state()
    for t in range(6):
        model.run([sa], a[t][None])
    late = model.run([sa, sb], np.stack([a[6], b[0]]))  # b joins mid-stream
    vad_a, vad_b = SileroVad(), SileroVad()
    expected_a = [vad_a(frame) for frame in a[:7]][-1]
    assert late == pytest.approx([expected_a, vad_b(b[0])], abs=TOL)
    with pytest.raises(ValueError, match="shape"):
        model.run([sa], np.stack([a[0], b[0]]))


async def test_concurrent_sessions_share_calls_and_keep_their_order(model):
    batcher = VadBatcher(model, window_s=0.002)
    clips = [frames_of(name, 20) for name in CLIPS]

    async def session(stream, clip: np.ndarray) -> list[float]:
        assert isinstance(stream, BatchedSpeechProbability)
        return [await stream.probability(frame) for frame in clip]

    streams = [batcher.stream() for _ in clips]  # the sessions are live before their audio flows
    batched = await asyncio.gather(*(session(stream, clip) for stream, clip in zip(streams, clips, strict=True)))
    alone = []
    for clip in clips:
        vad = SileroVad()
        alone.append([vad(frame) for frame in clip])
    np.testing.assert_allclose(batched, alone, atol=TOL)
    assert batcher.calls == 20  # three sessions' frames per call, not 60 calls


async def test_a_failed_call_fails_the_frames_that_wait_on_it():
    class Broken(SileroBatchModel):
        def __init__(self) -> None:
            self.context_samples = 64

        def run(self, states, frames):
            raise RuntimeError("model failed")

    batcher = VadBatcher(Broken(), window_s=0.001)
    results = await asyncio.gather(
        *(batcher.stream().probability(np.zeros(N, np.float32)) for _ in range(2)), return_exceptions=True
    )
    assert [str(r) for r in results] == ["model failed", "model failed"]


async def test_turns_detected_on_a_shared_vad_equal_those_on_a_session_vad(model):
    pcm = np.concatenate([load_16k("count_to_five.wav"), np.zeros(16_000, np.float32)])
    params = ServerVadParams()
    alone = TurnDetector(params, SileroVad())
    shared = TurnDetector(params, VadBatcher(model, window_s=0.001).stream())
    expected, got = [], []
    for start in range(0, len(pcm), 320):  # 20 ms chunks, as a microphone sends them
        expected += alone.feed(pcm[start : start + 320])
        got += await shared.afeed(pcm[start : start + 320])
    assert got == expected and len(expected) == 2  # speech started, speech stopped


async def test_a_call_runs_once_every_active_stream_has_a_frame(model):
    batcher = VadBatcher(model, window_s=60.0)  # the window never ends within the test
    a, b = batcher.stream(), batcher.stream()
    frame = frames_of("capital_of_france.wav", 1)[0]
    first = asyncio.ensure_future(a.probability(frame))
    await asyncio.sleep(0.05)
    assert not first.done() and batcher.calls == 0  # b is active (just made): its frame is awaited
    second = await asyncio.wait_for(b.probability(frame), 5.0)
    assert await first == pytest.approx(second) and batcher.calls == 1


async def test_a_lone_or_quiet_stream_does_not_wait_for_the_window(model):
    batcher = VadBatcher(model, window_s=60.0, active_s=0.05)
    a, _quiet = batcher.stream(), batcher.stream()
    await asyncio.sleep(0.1)  # the second stream sent nothing within active_s: no longer awaited
    frame = frames_of("capital_of_france.wav", 1)[0]
    await asyncio.wait_for(a.probability(frame), 5.0)
    await asyncio.wait_for(a.probability(frame), 5.0)
    assert batcher.calls == 2


async def test_a_frame_waits_at_most_the_window_for_the_others(model):
    batcher = VadBatcher(model, window_s=0.02)
    a, _silent = batcher.stream(), batcher.stream()
    frame = frames_of("capital_of_france.wav", 1)[0]
    await asyncio.wait_for(a.probability(frame), 5.0)
    assert batcher.calls == 1


async def test_batches_run_on_the_vad_thread_not_the_event_loop(model):
    class Where(SileroBatchModel):
        def __init__(self) -> None:
            self._inner, self.context_samples, self.threads = model, model.context_samples, []

        def new_state(self):
            return self._inner.new_state()

        def run(self, states, frames):
            self.threads.append(threading.current_thread())
            return self._inner.run(states, frames)

    where = Where()
    batcher = VadBatcher(where, window_s=0.001)
    clip = frames_of("short_joke.wav", 3)
    stream = batcher.stream()
    probs = [await stream.probability(frame) for frame in clip]
    alone = SileroVad()
    assert probs == pytest.approx([alone(frame) for frame in clip], abs=TOL)
    assert len(where.threads) == 3 and all(t is not threading.current_thread() for t in where.threads)
    assert {t.name.split("_")[0] for t in where.threads} == {"vad"}

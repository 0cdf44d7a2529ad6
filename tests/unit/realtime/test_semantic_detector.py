"""``SemanticTurnDetector`` over scripted speech probabilities and a scripted turn scorer: its events follow the audio
and the answers, never the chunking; a pending answer is cancelled by ``reset``/``aclose`` and never lands after; a
scorer that breaks leaves silence-based turns for the rest of the session; an answer for an earlier silence run is
ignored; ``SpeechResumed`` only follows a reported ``SpeechPaused``.

The feeding loops do not yield to the event loop between chunks (a client sending faster than real time) unless a
test says so: a scoring task then first runs when the detector waits for it, on the frame before the silence would
end the turn without it, so each outcome is fixed by the audio and the answers alone."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from realtime.protocol.turn_detection import ServerVadParams
from realtime.turns.semantic import HIGH, LOW, MEDIUM, EagernessLimits, SemanticVadConfig
from realtime.turns.semantic_detector import SemanticTurnDetector, TurnModelHooks
from realtime.turns.server_vad import SpeechPaused, SpeechResumed, SpeechStarted, SpeechStopped, TurnEvent
from realtime.turns.smart_turn import TurnModelFailed, TurnModelUnavailable
from tests.helpers.scripted_vad import FRAME, ScriptedVad, script

FRAME_MS = 32
SCORE_AFTER_MS = SemanticVadConfig().score_after_ms
LIMITS = {"low": LOW, "medium": MEDIUM, "auto": MEDIUM, "high": HIGH}

Answer = float | None | BaseException


class ScriptedScorer:
    """Answers its calls in order from ``answers`` (a float, ``None`` for "saturated", or an exception to raise); the
    last answer repeats. ``gate`` set: every call waits for it first. Records each call's audio length and whether
    it was cancelled."""

    def __init__(self, *answers: Answer, gate: asyncio.Event | None = None) -> None:
        self.answers = list(answers)
        self.gate = gate
        self.heard: list[int] = []
        self.cancelled = 0
        self.answered = 0

    async def score(self, audio: np.ndarray) -> float | None:
        answer = self.answers[min(len(self.heard), len(self.answers) - 1)]
        self.heard.append(len(audio))
        try:
            if self.gate is not None:
                await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if isinstance(answer, BaseException):
            raise answer
        self.answered += 1
        return answer


class UncooperativeScorer(ScriptedScorer):
    """A scorer that answers at once when its caller is cancelled (it swallows the cancellation), and otherwise
    after ``gate``: the detector must ignore an answer for a silence run that is over, and keep waiting for the
    current run's."""

    async def score(self, audio: np.ndarray) -> float | None:
        answer = self.answers[min(len(self.heard), len(self.answers) - 1)]
        self.heard.append(len(audio))
        assert self.gate is not None and isinstance(answer, float)
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
        self.answered += 1
        return answer


def detector(scorer: ScriptedScorer | None, eagerness: str = "auto", hooks: TurnModelHooks | None = None):
    return SemanticTurnDetector(ServerVadParams.semantic(eagerness), ScriptedVad(), scorer, hooks=hooks)


async def feed(det: SemanticTurnDetector, audio: np.ndarray, chunk: int | None = None, *, yields: bool = False):
    """Every event of ``audio`` fed ``chunk`` samples at a time (None: in one piece), in the order a runner sees
    them: those the listener takes while a chunk is fed (an answer landed) come before what that chunk returns."""
    events: list[TurnEvent] = []
    det.listen(lambda: events.extend(det.take()))
    step = chunk or len(audio)
    for i in range(0, len(audio), step):
        events.extend(await det.afeed(audio[i : i + step]))
    return events


def stops(events: list[TurnEvent]) -> list[SpeechStopped]:
    return [e for e in events if isinstance(e, SpeechStopped)]


def silence_of(stop: SpeechStopped) -> int:
    """The silence the turn ended after (ms)."""
    return stop.audio_end_ms - stop.speech_end_ms


# speech 640 ms, a 224 ms mid-sentence pause (past score_after_ms, short of every silence limit), speech 320 ms,
# 3.2 s of silence (past every limit), then a second turn and 3.2 s of silence
TWO_TURNS = script((0.0, 5), (0.9, 20), (0.0, 7), (0.9, 10), (0.0, 100), (0.9, 15), (0.0, 100))


@pytest.mark.parametrize("eagerness", ["auto", "high", "low"])
@pytest.mark.parametrize("answers", [(1.0,), (0.0,), (None,), (0.0, 1.0, 0.0)])
async def test_events_do_not_depend_on_chunking(eagerness, answers):
    runs = []
    for chunk in (320, 1600, None):  # 20 ms, 100 ms, one piece
        scorer = ScriptedScorer(*answers)
        runs.append((await feed(detector(scorer, eagerness), TWO_TURNS, chunk), scorer.heard))
    assert runs[0] == runs[1] == runs[2]
    events, heard = runs[0]
    types = [type(e) for e in events]
    # the pause was scored (its task cancelled before it ran: never asked), then each turn's end
    assert types == [
        SpeechStarted,
        SpeechPaused,
        SpeechResumed,
        SpeechPaused,
        SpeechStopped,
        SpeechStarted,
        SpeechPaused,
        SpeechStopped,
    ]
    assert len(heard) == 2 and all(n > 0 for n in heard)
    limits = LIMITS[eagerness]
    for stop, answer in zip(stops(events), answers if len(answers) > 1 else answers * 2, strict=False):
        end = expected_limit(limits, answer)
        assert end <= silence_of(stop) < end + FRAME_MS


def expected_limit(limits: EagernessLimits, answer: float | None) -> int:
    """Where the turn's end lies (to the frame) when the answer is awaited only as late as the detector lets it: a
    "complete" on the last frame short of the silence-only limit, otherwise at the limit the answer sets."""
    if answer is None:
        return limits.unscored_wait_ms
    if answer >= limits.complete_at:
        return limits.unscored_wait_ms - FRAME_MS
    return limits.max_wait_ms


async def test_an_answer_that_lands_between_chunks_ends_the_turn_at_once_through_the_listener():
    scorer = ScriptedScorer(1.0)
    det = detector(scorer)
    late: list[list[TurnEvent]] = []
    det.listen(lambda: late.append(det.take()))
    events = await det.afeed(script((0.9, 20), (0.0, 7)))  # 224 ms of silence: the model is asked
    assert [type(e) for e in events] == [SpeechStarted, SpeechPaused]
    await asyncio.sleep(0)  # the answer lands before the next chunk
    assert len(late) == 1 and [type(e) for e in late[0]] == [SpeechStopped]
    (stop,) = stops(late[0])
    assert stop.speech_end_ms == 20 * FRAME_MS and silence_of(stop) == 7 * FRAME_MS
    assert await det.afeed(script((0.0, 60))) == [] and det.take() == []


async def test_reset_while_an_answer_is_pending_cancels_it_and_nothing_arrives_after():
    gate = asyncio.Event()
    scorer = ScriptedScorer(1.0, gate=gate)
    det = detector(scorer)
    woken = []
    det.listen(lambda: woken.append(det.take()))
    assert [type(e) for e in await det.afeed(script((0.9, 20), (0.0, 8)))] == [SpeechStarted, SpeechPaused]
    await asyncio.sleep(0)
    assert scorer.heard and scorer.cancelled == 0  # the model is being asked
    det.reset()
    await asyncio.sleep(0)
    assert scorer.cancelled == 1
    gate.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert woken == [] and det.take() == [] and scorer.answered == 0
    assert await det.afeed(script((0.0, 60))) == []  # the reset forgot the turn: silence ends nothing
    # the next turn is detected afresh and asks the model again
    events = await feed(det, script((0.9, 10), (0.0, 20)))
    assert [type(e) for e in events] == [SpeechStarted, SpeechPaused, SpeechStopped] and len(scorer.heard) == 2


async def test_aclose_while_an_answer_is_pending_cancels_it_and_nothing_arrives_after():
    gate = asyncio.Event()
    scorer = ScriptedScorer(1.0, gate=gate)
    det = detector(scorer)
    woken = []
    det.listen(lambda: woken.append(det.take()))
    await det.afeed(script((0.9, 20), (0.0, 8)))
    await asyncio.sleep(0)
    assert scorer.heard and scorer.cancelled == 0
    await det.aclose()
    assert scorer.cancelled == 1
    gate.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert woken == [] and det.take() == [] and scorer.answered == 0


async def test_a_scorer_that_breaks_leaves_the_silence_limit_for_that_turn_and_the_later_ones():
    fallbacks = []
    scorer = ScriptedScorer(1.0, TurnModelFailed("boom"), TurnModelUnavailable("broken"))
    det = detector(scorer, hooks=TurnModelHooks(fallback=lambda: fallbacks.append(1)))
    turn = script((0.9, 15), (0.0, 40))
    first = stops(await feed(det, turn))
    assert det.model_available and silence_of(first[0]) < MEDIUM.unscored_wait_ms  # answered "complete"
    second = await feed(det, turn)  # the model raises: this turn ends on silence alone
    assert not det.model_available
    assert MEDIUM.unscored_wait_ms <= silence_of(stops(second)[0]) < MEDIUM.unscored_wait_ms + FRAME_MS
    det.reset()  # a model found broken stays so
    for _ in range(2):
        later = await feed(det, turn)
        assert [type(e) for e in later] == [SpeechStarted, SpeechPaused, SpeechStopped]
        assert MEDIUM.unscored_wait_ms <= silence_of(stops(later)[0]) < MEDIUM.unscored_wait_ms + FRAME_MS
        # the reply may still start early: the pause is reported at the same silence as with the model
        assert SCORE_AFTER_MS <= later[1].audio_end_ms - later[1].speech_end_ms < SCORE_AFTER_MS + FRAME_MS
    assert len(scorer.heard) == 2  # never asked after it broke
    assert len(fallbacks) == 3


async def test_a_scorer_unavailable_from_the_start_ends_turns_like_one_that_broke():
    broken = detector(ScriptedScorer(TurnModelUnavailable("not loaded")))
    none = detector(None)
    turn = script((0.9, 15), (0.0, 40))
    assert await feed(broken, turn) == await feed(none, turn)


async def test_an_answer_for_an_earlier_silence_run_is_ignored():
    gate = asyncio.Event()
    scorer = UncooperativeScorer(1.0, 0.0, gate=gate)
    det = detector(scorer)
    events = await feed(det, script((0.9, 20), (0.0, 8)))  # run 1: asked, the answer pending
    await asyncio.sleep(0)
    events += await feed(det, script((0.9, 5), (0.0, 8)))  # the user goes on; run 2 is asked
    for _ in range(5):
        await asyncio.sleep(0)
    # run 1's "complete" landed when its caller was cancelled; run 2's "incomplete" waits for the gate
    assert len(scorer.heard) == 2 and scorer.cancelled == 1 and scorer.answered == 1
    assert [type(e) for e in events] == [SpeechStarted, SpeechPaused, SpeechResumed, SpeechPaused]
    asyncio.get_running_loop().call_later(0.05, gate.set)  # while the detector waits for run 2's answer
    events += await feed(det, script((0.0, 50)))
    assert scorer.answered == 2
    assert [type(e) for e in events][4:] == [SpeechStopped]
    assert MEDIUM.max_wait_ms <= silence_of(stops(events)[0]) < MEDIUM.max_wait_ms + FRAME_MS  # run 2's answer


@pytest.mark.parametrize("scorer", [ScriptedScorer(0.0), None], ids=["model", "no-model"])
async def test_speech_resumed_only_after_a_reported_pause(scorer):
    det = detector(scorer)
    short = script((0.9, 20), (0.0, 4), (0.9, 5))  # 128 ms: short of score_after_ms, no pause reported
    assert [type(e) for e in await feed(det, short)] == [SpeechStarted]
    long_pause = script((0.0, 7), (0.9, 5))  # 224 ms: the pause is reported, and its end
    events = await feed(det, long_pause)
    assert [type(e) for e in events] == [SpeechPaused, SpeechResumed]
    paused, resumed = events
    assert paused.speech_end_ms == 29 * FRAME_MS and resumed.speech_start_ms == 36 * FRAME_MS
    assert [type(e) for e in await feed(det, short[20 * FRAME :])] == []  # a short pause again: nothing
    # after the turn ended, speech is a new turn, never a resumption
    events = await feed(det, script((0.0, 50), (0.9, 5)))
    assert [type(e) for e in events] == [SpeechPaused, SpeechStopped, SpeechStarted]


def test_semantic_settings_are_required():
    with pytest.raises(ValueError, match="semantic_vad"):
        SemanticTurnDetector(ServerVadParams(), ScriptedVad(), None)


async def test_audio_that_is_not_mono_is_refused():
    det = detector(None)
    with pytest.raises(ValueError, match="mono"):
        await det.afeed(np.zeros((2, FRAME), np.float32))

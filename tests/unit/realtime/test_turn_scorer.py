"""realtime.turns.smart_turn.TurnScorer: every session's turns scored in shared batches on the scorer's own thread;
a bounded queue, cancellation, and the fallback when the model cannot load or raises. A scripted model stands in
for Smart Turn: each turn's answer is its last sample, and the model can be held mid-batch."""

from __future__ import annotations

import asyncio
import logging
import threading

import numpy as np
import pytest

from pipeline.errors import InvalidAudioError
from realtime.turns.smart_turn import TurnModelFailed, TurnModelUnavailable, TurnScorer

WAIT_S = 5.0


class ScriptedModel:
    """Answers each turn's last sample; records each batch's answers; while ``gate`` is clear, a batch waits in
    the scorer's thread (``started`` is set once it does)."""

    def __init__(self) -> None:
        self.batches: list[list[float]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()

    def __call__(self, audios):
        self.started.set()
        assert self.gate.wait(WAIT_S), "the test never released the model"
        answers = [float(a[-1]) for a in audios]
        self.batches.append(answers)
        return np.array(answers)

    async def running(self) -> None:
        """Until a batch is in the model."""
        assert await asyncio.to_thread(self.started.wait, WAIT_S)
        self.started.clear()


def turn(answer: float) -> np.ndarray:
    return np.full(1600, answer, dtype=np.float32)


@pytest.fixture
def model():
    model = ScriptedModel()
    yield model
    model.gate.set()  # never leave the scorer's thread waiting


async def held(scorer: TurnScorer, model: ScriptedModel, answer: float) -> asyncio.Task:
    """A request whose batch is in the (held) model."""
    model.gate.clear()
    task = asyncio.create_task(scorer.score(turn(answer)))
    await model.running()
    return task


async def queued(scorer: TurnScorer, *answers: float) -> list[asyncio.Task]:
    tasks = [asyncio.create_task(scorer.score(turn(a))) for a in answers]
    await asyncio.sleep(0)  # each task runs up to its await: its request is waiting
    return tasks


async def test_a_lone_request_is_scored_at_once(model):
    scorer = TurnScorer(lambda: model)
    try:
        assert await asyncio.wait_for(scorer.score(turn(0.25)), WAIT_S) == 0.25
        assert model.batches == [[0.25]] and scorer.calls == 1
    finally:
        scorer.close()


async def test_requests_that_arrive_during_a_batch_share_the_next_one(model):
    scorer = TurnScorer(lambda: model, max_batch=3)
    try:
        first = await held(scorer, model, 0.125)
        rest = await queued(scorer, 0.25, 0.375, 0.5, 0.625, 0.75)
        model.gate.set()
        answers = await asyncio.wait_for(asyncio.gather(first, *rest), WAIT_S)
        assert answers == [0.125, 0.25, 0.375, 0.5, 0.625, 0.75]
        assert model.batches == [[0.125], [0.25, 0.375, 0.5], [0.625, 0.75]]  # oldest first, max_batch a call
    finally:
        scorer.close()


async def test_a_full_queue_answers_unknown_at_once(model):
    shed = []
    scorer = TurnScorer(lambda: model, max_batch=8, max_waiting=2, on_shed=lambda: shed.append(1))
    try:
        first = await held(scorer, model, 0.125)
        waiting = await queued(scorer, 0.25, 0.375)
        assert await asyncio.wait_for(scorer.score(turn(0.875)), 0.5) is None  # answered without the model
        assert scorer.shed == 1 and shed == [1]
        model.gate.set()
        assert await asyncio.wait_for(asyncio.gather(first, *waiting), WAIT_S) == [0.125, 0.25, 0.375]
        assert await asyncio.wait_for(scorer.score(turn(0.5)), WAIT_S) == 0.5  # room again
        assert model.batches == [[0.125], [0.25, 0.375], [0.5]]
    finally:
        scorer.close()


async def test_a_cancelled_waiting_request_costs_no_model_time(model):
    scorer = TurnScorer(lambda: model)
    try:
        first = await held(scorer, model, 0.125)
        cancelled, kept = await queued(scorer, 0.25, 0.375)
        cancelled.cancel()
        model.gate.set()
        assert await asyncio.wait_for(asyncio.gather(first, kept), WAIT_S) == [0.125, 0.375]
        assert model.batches == [[0.125], [0.375]]
        with pytest.raises(asyncio.CancelledError):
            await cancelled
    finally:
        scorer.close()


async def test_a_caller_cancelled_mid_batch_holds_no_one_up(model):
    scorer = TurnScorer(lambda: model)
    try:
        cancelled = await held(scorer, model, 0.125)
        (waiting,) = await queued(scorer, 0.25)
        cancelled.cancel()
        await asyncio.sleep(0)
        assert cancelled.cancelled()  # at once, while its batch is still in the model
        model.gate.set()
        assert await asyncio.wait_for(waiting, WAIT_S) == 0.25
        assert model.batches == [[0.125], [0.25]]  # the running batch ran; its answer was dropped
    finally:
        scorer.close()


async def test_a_model_that_cannot_load_falls_back_once(caplog):
    loads, failures = [], []

    def load():
        loads.append(1)
        raise TurnModelUnavailable("no model here")

    scorer = TurnScorer(load, on_failure=failures.append)
    try:
        with caplog.at_level(logging.WARNING, logger="realtime.turns.smart_turn"):
            results = await asyncio.gather(*(scorer.score(turn(0.625)) for _ in range(3)), return_exceptions=True)
            with pytest.raises(TurnModelUnavailable):
                await scorer.score(turn(0.625))  # at once: the scorer is broken for good
        assert all(isinstance(r, TurnModelUnavailable) for r in results), results
        assert loads == [1] and len(failures) == 1 and isinstance(scorer.broken, TurnModelUnavailable)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "no model here" in warnings[0].getMessage()
    finally:
        scorer.close()


async def test_a_model_that_raises_breaks_the_scorer(model, caplog):
    failures = []

    def failing(audios):
        raise RuntimeError("onnxruntime exploded")

    scorer = TurnScorer(lambda: failing, on_failure=failures.append)
    try:
        with caplog.at_level(logging.WARNING, logger="realtime.turns.smart_turn"):
            with pytest.raises(TurnModelUnavailable) as raised:
                await asyncio.wait_for(scorer.score(turn(0.625)), WAIT_S)
            with pytest.raises(TurnModelUnavailable):
                await scorer.score(turn(0.625))
        (failure,) = failures
        assert raised.value.__cause__ is failure
        assert isinstance(failure, TurnModelFailed) and isinstance(failure.__cause__, RuntimeError)
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    finally:
        scorer.close()


async def test_a_loader_that_raises_anything_is_unavailable():
    def load():
        raise OSError("disk gone")

    scorer = TurnScorer(load)
    try:
        with pytest.raises(TurnModelUnavailable) as raised:
            await scorer.start()
        assert isinstance(raised.value.__cause__.__cause__, OSError)
    finally:
        scorer.close()


async def test_start_loads_the_model_before_the_first_request(model):
    made = []
    scorer = TurnScorer(lambda: made.append(threading.current_thread().name) or model)
    try:
        await asyncio.wait_for(scorer.start(), WAIT_S)
        assert len(made) == 1 and made[0].startswith("turn-model")  # on the scorer's thread, not the loop's
        assert await asyncio.wait_for(scorer.score(turn(0.75)), WAIT_S) == 0.75
        assert len(made) == 1
    finally:
        scorer.close()


async def test_close_fails_waiting_and_later_requests(model):
    scorer = TurnScorer(lambda: model)
    first = await held(scorer, model, 0.125)
    (waiting,) = await queued(scorer, 0.25)
    scorer.close()
    model.gate.set()
    for task in (first, waiting):
        with pytest.raises(TurnModelUnavailable, match="closed"):
            await asyncio.wait_for(task, WAIT_S)
    with pytest.raises(TurnModelUnavailable, match="closed"):
        await scorer.score(turn(0.375))


async def test_bad_audio_is_refused_before_it_is_queued(model):
    scorer = TurnScorer(lambda: model)
    try:
        with pytest.raises(InvalidAudioError):
            await scorer.score(np.array([np.inf], np.float32))
        assert scorer.calls == 0 and scorer.broken is None
    finally:
        scorer.close()


@pytest.mark.parametrize("setting", [{"max_batch": 0}, {"max_waiting": -1}, {"max_batch": 2.0}])
def test_limits_must_be_positive_integers(setting):
    with pytest.raises(ValueError):
        TurnScorer(lambda: ScriptedModel(), **setting)

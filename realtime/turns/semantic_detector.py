"""The speech detector of ``semantic_vad``: server VAD's speech and silence, the turn model's judgement of when the turn
is over (:mod:`realtime.turns.semantic`), as the same events server VAD reports.

It wraps a :class:`~realtime.turns.server_vad.TurnDetector` that reports every silence run from its first frame
(``pause_ms=0``), a :class:`~realtime.turns.turn_audio.TurnAudio` of the turn so far and a
:class:`~realtime.turns.semantic.SemanticTurnTracker`. What it reports (times on the detector's audio clock, as
:class:`~realtime.turns.detection.SpeechDetector` defines it):

- ``SpeechStarted`` as server VAD hears it (or when speech comes back after a turn this detector ended);
- ``SpeechPaused`` when the turn model is asked (``score_after_ms`` into a silence run; at the same silence when the
  model is unavailable): the session may start its reply now, unseen (``realtime.session.preemptive``);
- ``SpeechResumed`` when speech comes back in a run that reported a pause (that reply is withdrawn);
- ``SpeechStopped`` when the tracker ends the turn: at once on a "complete" answer, after the eagerness's
  ``max_wait_ms`` on an "incomplete" one, after ``unscored_wait_ms`` without an answer.

Time: decisions follow the audio clock, frame by frame (server VAD's frames), never the wall clock, so a chunk of any
size gives the events it would give fed frame by frame. The model's answer comes from a task this detector owns;
it is applied the moment it lands, at the clock of the last frame heard, and the detector calls its listener
(:meth:`SemanticTurnDetector.listen`) so that the runner hands the ``SpeechStopped`` to the session at once rather
than with the next chunk. Audio that would carry a run past ``unscored_wait_ms`` while the answer is still pending
waits for it (:meth:`SemanticTurnDetector.afeed`): the outcome depends on the audio and the answer, not on how fast
the client sends (a live client is ~50 ms ahead of that point; the scorer's bounded queue bounds the wait).

Ownership: the one scoring task is cancelled when speech resumes, on :meth:`reset`, and on :meth:`close` (the
session ended); its answer for an earlier run is ignored by the tracker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from realtime.protocol.turn_detection import ServerVadParams
from realtime.turns.semantic import EndTurn, ScoreTurn, SemanticPolicy, SemanticTurnTracker, SemanticVadConfig
from realtime.turns.server_vad import (
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
    TurnEvent,
)
from realtime.turns.smart_turn import TurnModelError
from realtime.turns.turn_audio import TurnAudio
from realtime.turns.vad import VAD_SAMPLE_RATE, BatchedSpeechProbability, SpeechProbability


class TurnScoring(Protocol):
    """What the detector asks (``realtime.turns.smart_turn.TurnScorer`` is it): P(the turn is complete), ``None``
    when saturated; raises :class:`~realtime.turns.smart_turn.TurnModelError` when the model is unavailable."""

    async def score(self, audio: np.ndarray) -> float | None: ...


@dataclass(frozen=True)
class TurnModelHooks:
    """Where the detector reports its use of the model (the server's metrics); each is called on the event loop."""

    answered: Callable[[float], None] = lambda seconds: None
    """A request was answered with a probability after ``seconds`` (queueing and the batch)."""
    fallback: Callable[[], None] = lambda: None
    """A turn ended on silence alone because the model is unavailable."""


class SemanticTurnDetector:
    """``semantic_vad`` over one session's 16 kHz audio (see the module docstring). ``scorer`` ``None``: the model is
    unavailable from the start (turns end after ``unscored_wait_ms`` of silence, ``params.silence_duration_ms``).

    Calling order: :meth:`listen` once (optional), then :meth:`afeed` (or :meth:`feed`) chunk by chunk on the event
    loop, calls never overlapping; :meth:`take` drains the events decided between chunks; :meth:`close` at the end."""

    def __init__(
        self,
        params: ServerVadParams,
        vad: SpeechProbability,
        scorer: TurnScoring | None,
        *,
        config: SemanticVadConfig | None = None,
        hooks: TurnModelHooks | None = None,
    ) -> None:
        if params.eagerness is None:
            raise ValueError("a semantic detector needs semantic_vad settings (ServerVadParams.semantic)")
        self.params = params
        self.policy = SemanticPolicy(params.eagerness, config)
        limits = self.policy.limits
        # server VAD's own end of a silence run: never before the tracker's (it ends the run on the same frame at
        # the latest), so that the next speech after it is a clean start with its prefix padding
        window = max(limits.max_wait_ms, limits.unscored_wait_ms, self.policy.score_after_ms)
        self._vad = TurnDetector(dataclasses.replace(params, silence_duration_ms=window), vad, pause_ms=0)
        self._batched = isinstance(vad, BatchedSpeechProbability)
        self._frame = vad.frame_samples
        self._scorer = scorer
        self._hooks = hooks or TurnModelHooks()
        self._audio = TurnAudio(lookback_ms=params.prefix_padding_ms)
        self._tracker = self._new_tracker()
        self._pending = np.zeros(0, dtype=np.float32)  # a partial frame, kept for the next chunk
        self._clock_samples = 0  # samples of the frames heard so far
        self._silence_start_ms: int | None = None  # where the current silence run began (None: no run)
        self._paused = False  # the current run reported SpeechPaused
        self._ended = False  # the tracker ended the turn; server VAD may still be in its silence run
        self._task: asyncio.Task[None] | None = None
        self._outbox: list[TurnEvent] = []
        self._ready: Callable[[], None] | None = None

    def _new_tracker(self) -> SemanticTurnTracker:
        tracker = SemanticTurnTracker(self.policy)
        if self._scorer is None:
            tracker.unavailable()
        return tracker

    @property
    def clock_ms(self) -> int:
        """The end of the last frame heard (ms of the detector's audio clock)."""
        return self._clock_samples * 1000 // VAD_SAMPLE_RATE

    @property
    def model_available(self) -> bool:
        return self._tracker.model_available

    def listen(self, ready: Callable[[], None]) -> None:
        """``ready()`` is called when events were decided between chunks (the model's answer landed): :meth:`take`
        them."""
        self._ready = ready

    def take(self) -> list[TurnEvent]:
        """The events decided and not yet returned, in order."""
        events, self._outbox = self._outbox, []
        return events

    def feed(self, pcm16k: np.ndarray) -> list[TurnEvent]:
        """Hear a chunk; the events decided so far, in order (the answer may come later: :meth:`listen`). Call on the
        event loop: the model is asked in a task. Never waits for a pending answer."""
        for frame in self._frames(pcm16k):
            self._heard(frame, self._vad.feed(frame))
        return self.take()

    async def afeed(self, pcm16k: np.ndarray) -> list[TurnEvent]:
        """:meth:`feed` with a VAD shared with other sessions, and waiting for a pending answer before a frame that
        would end the run on silence alone. Cancelling it leaves the scoring task running (:meth:`close` ends it)."""
        for frame in self._frames(pcm16k):
            await self._answer_due()
            events = await self._vad.afeed(frame) if self._batched else self._vad.feed(frame)
            self._heard(frame, events)
        return self.take()

    def reset(self) -> None:
        """Forget the turn, the silence run and a pending answer (the clock goes on; a partial frame is kept). A model
        found unavailable stays so."""
        available = self._tracker.model_available
        self._cancel()
        self._vad.reset()
        self._audio.end()
        self._tracker = SemanticTurnTracker(self.policy)
        if not available or self._scorer is None:
            self._tracker.unavailable()
        self._silence_start_ms, self._paused, self._ended = None, False, False
        self._outbox.clear()

    def close(self) -> None:
        """The session ended (or restarted its detection): cancel the scoring task; no event is reported after."""
        self._cancel()
        self._ready = None

    async def aclose(self) -> None:
        """:meth:`close`, then wait for the scoring task to finish cancelling."""
        task = self._task
        self.close()
        if task is not None:
            await asyncio.wait({task})

    # --- frames -----------------------------------------------------------------------------------------------
    def _frames(self, pcm16k: np.ndarray) -> list[np.ndarray]:
        chunk = np.asarray(pcm16k, dtype=np.float32)
        if chunk.ndim != 1:
            raise ValueError(f"expected mono 1-D audio, got an array of shape {chunk.shape}")
        buffered = np.concatenate([self._pending, chunk]) if len(self._pending) else chunk
        n = len(buffered) // self._frame
        self._pending = buffered[n * self._frame :].copy()
        return [buffered[i * self._frame : (i + 1) * self._frame] for i in range(n)]

    def _heard(self, frame: np.ndarray, events: list[TurnEvent]) -> None:
        """One frame and server VAD's events for it."""
        self._audio.append(frame)
        self._clock_samples += len(frame)
        for event in events:
            if isinstance(event, SpeechStarted):
                self._speech_started(event)
            elif isinstance(event, SpeechResumed):
                self._speech_resumed(event)
            elif isinstance(event, SpeechPaused):  # pause_ms=0: the first frame of a silence run
                self._silence_start_ms = event.speech_end_ms
            elif isinstance(event, SpeechStopped) and not self._ended:
                self._silence(event.audio_end_ms)  # the tracker ends the turn here at the latest
                if not self._ended:  # the model's limits all lie within server VAD's window: not reached
                    self._end_turn()
        if self._silence_start_ms is not None and not self._ended and self._vad.speaking:
            self._silence(self.clock_ms)
        if not self._vad.speaking:
            self._silence_start_ms = None

    def _speech_started(self, event: SpeechStarted) -> None:
        self._cancel()
        self._ended, self._paused, self._silence_start_ms = False, False, None
        self._audio.begin()
        self._tracker.speech()
        self._outbox.append(event)

    def _speech_resumed(self, event: SpeechResumed) -> None:
        if self._ended:  # speech after a turn this detector ended: a new turn, server VAD never saw one end
            start = event.speech_start_ms
            self._speech_started(SpeechStarted(max(0, start - self.params.prefix_padding_ms), start))
            return
        self._cancel()
        self._tracker.speech()
        self._silence_start_ms = None
        if self._paused:
            self._paused = False
            self._outbox.append(event)

    def _silence(self, now_ms: int) -> None:
        assert self._silence_start_ms is not None
        silence_ms = now_ms - self._silence_start_ms
        self._apply(self._tracker.silence(silence_ms))
        if not self._ended and not self._paused and not self._tracker.model_available:
            if silence_ms >= self.policy.score_after_ms:  # the reply may start as early as with the model
                self._pause()

    # --- the tracker's decisions --------------------------------------------------------------------------------
    def _apply(self, actions: list[ScoreTurn | EndTurn]) -> None:
        for action in actions:
            if isinstance(action, ScoreTurn):
                self._score(action.run)
            else:
                self._end_turn()

    def _pause(self) -> None:
        assert self._silence_start_ms is not None
        self._paused = True
        self._outbox.append(SpeechPaused(audio_end_ms=self.clock_ms, speech_end_ms=self._silence_start_ms))

    def _score(self, run: int) -> None:
        self._cancel()
        self._pause()
        scorer = self._scorer
        assert scorer is not None, "a tracker without a model never asks"
        self._task = asyncio.get_running_loop().create_task(self._ask(scorer, run, self._audio.audio()))

    def _end_turn(self) -> None:
        assert self._silence_start_ms is not None
        self._cancel()
        if not self._tracker.model_available:
            self._hooks.fallback()
        self._ended, self._paused = True, False
        self._audio.end()
        self._outbox.append(SpeechStopped(audio_end_ms=self.clock_ms, speech_end_ms=self._silence_start_ms))

    async def _ask(self, scorer: TurnScoring, run: int, audio: np.ndarray) -> None:
        """The scoring task: ask, then apply the answer at the clock of the last frame heard."""
        started = time.monotonic()
        try:
            probability = await scorer.score(audio)
        except TurnModelError:  # logged once and counted by the scorer; this session decides on silence from now on
            self._forget_task()
            self._deliver(self._tracker.unavailable())
            return
        self._forget_task()
        if probability is not None:
            self._hooks.answered(time.monotonic() - started)
        self._deliver(self._tracker.scored(run, probability))

    def _forget_task(self) -> None:
        """The running scoring task is done. A cancelled one that answered anyway (a scorer that swallowed the
        cancellation) must not forget the task of the run that replaced it."""
        if self._task is asyncio.current_task():
            self._task = None

    def _deliver(self, ended: list[EndTurn]) -> None:
        if ended and not self._ended:
            self._end_turn()
        if self._outbox and self._ready is not None:
            self._ready()

    async def _answer_due(self) -> None:
        """Wait for a pending answer before the frame that would end the run without it."""
        task, start = self._task, self._silence_start_ms
        if task is None or start is None:
            return
        next_end_ms = (self._clock_samples + self._frame) * 1000 // VAD_SAMPLE_RATE
        if next_end_ms - start >= self.policy.limits.unscored_wait_ms:
            await asyncio.wait({task})

    def _cancel(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

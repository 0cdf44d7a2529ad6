"""The reference served as a queue: transformers' non-streaming ``generate`` on the bench's inputs, one at a time.

The generate call itself, per model family, is :mod:`realtime.bench.reference_generate`'s: it returns audio only when
everything is done, so its time to first audio is its whole run (:class:`Served`).

:func:`serve_one_worker` measures the reference under load the way it would serve it: every user of
a concurrency level speaks the same turns as in the streaming sweep, each request joins one queue,
and one worker serves the queue in arrival order. Every request is really run; only the worker's
idle time (no request waiting) is skipped on a virtual clock, which changes no figure of a
one-worker FIFO queue. A user's next request arrives after it heard the whole reply (its audio
duration), then spoke its next file up to the end of speech, plus the server's VAD silence window.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from realtime.bench.client import UserPlan
from realtime.bench.metrics import ResponseOutcome, TurnMetrics
from realtime.bench.speech import Speech


@dataclass(frozen=True)
class Served:
    """One reference run: wall time (s), the reply audio's duration (s), and the tokens it
    generated (thinker reply tokens; talker codec tokens handed to token2wav)."""

    seconds: float
    audio_s: float
    thinker_tokens: int = 0
    talker_tokens: int = 0


@dataclass(frozen=True)
class QueuedTurn:
    """One request of the one-worker queue (seconds from the level's start, virtual clock)."""

    user: int
    turn: int
    wav: str
    arrival_s: float
    start_s: float
    done_s: float
    audio_s: float
    silence_window_s: float
    thinker_tokens: int = 0
    talker_tokens: int = 0

    @property
    def service_s(self) -> float:
        return self.done_s - self.start_s

    def metrics(self) -> TurnMetrics:
        """As a streaming turn's metrics: audio and transcript both come at the end of the run; the
        player gets the whole reply at once (no underrun); RTF is run time / audio duration."""
        ttfa = 1000.0 * (self.done_s - self.arrival_s)
        return TurnMetrics(
            self.user,
            self.turn,
            self.wav,
            ResponseOutcome.COMPLETED.value,
            ttfa_ms=ttfa,
            voice_to_voice_ms=ttfa + 1000.0 * self.silence_window_s,
            first_transcript_ms=ttfa,
            end_of_turn_ms=1000.0 * self.silence_window_s,
            rtf=self.service_s / self.audio_s if self.audio_s > 0 else None,
            audio_ms=1000.0 * self.audio_s,
            underruns=0,
            starved_ms=0.0,
        )


def serve_one_worker(
    plans: Sequence[UserPlan],
    serve: Callable[[Speech], Served],
    *,
    silence_window_s: float,
    on_done: Callable[[QueuedTurn], None] | None = None,
) -> list[QueuedTurn]:
    """Run every plan's turns through ``serve`` on one worker, first come first served (module
    docstring). A user's first request arrives at its start delay + its first file's end of speech
    + ``silence_window_s``. Returns the turns in the order they were served."""
    queue: list[tuple[float, int, int]] = []
    for plan in plans:
        if plan.speeches:
            heapq.heappush(queue, (_arrival(plan.start_delay_s, plan.speeches[0], silence_window_s), plan.user, 0))
    by_user = {plan.user: plan for plan in plans}
    clock, served = 0.0, []
    while queue:
        arrival, user, turn = heapq.heappop(queue)
        speech = by_user[user].speeches[turn]
        start = max(clock, arrival)
        result = serve(speech)
        clock = start + result.seconds
        done = QueuedTurn(
            user,
            turn,
            speech.name,
            arrival,
            start,
            clock,
            result.audio_s,
            silence_window_s,
            result.thinker_tokens,
            result.talker_tokens,
        )
        served.append(done)
        if on_done is not None:
            on_done(done)
        if turn + 1 < len(by_user[user].speeches):
            heard = clock + result.audio_s
            heapq.heappush(queue, (_arrival(heard, by_user[user].speeches[turn + 1], silence_window_s), user, turn + 1))
    return served


def _arrival(speech_start_s: float, speech: Speech, silence_window_s: float) -> float:
    return speech_start_s + speech.speech_end_ms / 1000.0 + silence_window_s

"""Observation of the engine in one place: work counters, the optional timeline, the stall watch, slow steps.

:class:`EngineObserver` is told what happened (tokens accepted, chunks sent, jobs run, responses' milestones, each
step) and keeps the counters that :meth:`pipeline.core.engine_core.EngineCore.stats` reports and ``/metrics`` exports.
It never
changes what the engine does. Engine thread only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pipeline.observe.stall_watch import StallWatch
from pipeline.observe.timeline import EngineTimeline

__all__ = ["COUNTERS", "EngineObserver"]

log = logging.getLogger("pipeline.core.engine_core")  # operators grep the engine's warnings under one logger

COUNTERS = (
    "thinker_tokens_total",
    "talker_tokens_total",
    "audio_samples_total",
    "decode_steps_total",
    "talker_chains_total",
    "audio_underruns_total",
    "audio_starved_ms_total",
    "audio_start_holds_total",
    "audio_start_held_ms_total",
)
"""Cumulative work counters (:class:`pipeline.response_events.EngineStats` fields): tokens per stage, audio samples
sent,
decode steps and talker chains, and the underruns of a real-time player of each reply."""


class EngineObserver:
    def __init__(self, timeline_path: str | None, *, slow_step_ms: float) -> None:
        self.slow_step_ms = slow_step_ms
        """A step longer than this (milliseconds) is logged: every live response waited that long for its next
        token."""
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.finished = 0
        """Responses ended so far (any status)."""
        self.timeline = EngineTimeline(timeline_path) if timeline_path else None
        """Every step, token2wav job, chunk and response with its time (None: not kept)."""
        self.stall_watch = StallWatch()
        """Reports a live engine that made no token, audio or finished response for a while."""

    def count(self, counter: str, n: int = 1) -> None:
        self.counters[counter] += n

    def tokens(self) -> tuple[int, int]:
        """(thinker, talker) tokens accepted so far: a step that changed them progressed."""
        return self.counters["thinker_tokens_total"], self.counters["talker_tokens_total"]

    # -- timeline -----------------------------------------------------------------------------------
    def milestone(self, response_id: str, event: str, t: float | None = None) -> None:
        if self.timeline is not None:
            self.timeline.response(time.perf_counter() if t is None else t, response_id, event)

    def job(self, started: float, *, streams: int, first: bool) -> None:
        if self.timeline is not None:
            self.timeline.job(started, time.perf_counter(), streams=streams, first=first)

    def chunk_sent(
        self, t: float, response_id: str, index: int, audio_ms: float, waited_ms: float, samples: int
    ) -> None:
        """A chunk left the engine; ``waited_ms`` > 0: the reply's player ran dry that long before it."""
        self.counters["audio_samples_total"] += samples
        if waited_ms > 0:
            self.counters["audio_underruns_total"] += 1
            self.counters["audio_starved_ms_total"] += round(waited_ms)
        if self.timeline is not None:
            self.timeline.chunk(t, response_id, index, audio_ms, waited_ms)

    def hold_released(self, held_ms: float) -> None:
        self.counters["audio_start_holds_total"] += 1
        self.counters["audio_start_held_ms_total"] += round(held_ms)

    # -- steps --------------------------------------------------------------------------------------
    def step_done(
        self,
        started: float,
        *,
        progressed: bool,
        live: int,
        describe: Callable[[], list[str]],
        decoding: int,
        prefills: int,
        thinker_rows: int,
        talker_rows: int,
        codes_before: int,
        chains_before: int,
        ready: int,
        background: int,
    ) -> None:
        """After each step: the slow-step warning, the stall watch, the timeline's step event."""
        ended = time.perf_counter()
        elapsed = (ended - started) * 1000
        if elapsed > self.slow_step_ms:
            log.warning(
                "slow engine step: %.0f ms (%d responses decoding, %d token2wav chunks, %d background prefills, "
                "%d responses)",
                elapsed,
                decoding,
                ready,
                background,
                live,
            )
        marks = (*self.tokens(), self.counters["audio_samples_total"], self.finished)
        stalled = self.stall_watch.check(marks, live=bool(live), now=time.monotonic())
        if stalled is not None:
            log.warning(
                "engine stalled: no token, audio or finished response for %.0f s with %d responses live\n%s",
                stalled,
                live,
                "\n".join(describe()),
            )
        if self.timeline is not None and progressed:
            self.timeline.step(
                started,
                ended,
                prefills=prefills,
                thinker_rows=thinker_rows,
                talker_rows=talker_rows,
                codes=self.counters["talker_tokens_total"] - codes_before,
                chains=self.counters["talker_chains_total"] - chains_before,
            )

    def close(self) -> None:
        """Write the timeline, if one is kept."""
        if self.timeline is not None:
            self.timeline.write()

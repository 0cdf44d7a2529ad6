"""The engine's model of a client's real-time player of one reply: how much audio it has in hand, and when it ran dry.

Pure arithmetic over a caller-supplied clock (seconds, ``time.perf_counter()`` in the engine). The player starts on
the reply's first chunk, plays continuously at real time, and when it runs out waits for the next chunk and resumes
on its arrival: the WebSocket player of the benchmark (``realtime/bench/metrics.py``, without its jitter buffer), and
what a browser's audio queue does. The engine schedules token2wav by it (a stream's playout deadline,
``pipeline/scheduler/token2wav_jobs.py``) and counts its underruns: what a client would hear if the network added
nothing, so an operator can tell the engine's lateness from the network's. For each chunk that came late it also
keeps where the chunk's time went (:class:`LateChunk`): its codes came late (decode), it waited for the token2wav
worker (schedule), or its job was long.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["LateChunk", "Playout"]

MAX_LATE_CHUNKS = 16
"""Late chunks a player keeps the account of (the counts go on): a reply's log line stays one line."""


@dataclass(frozen=True)
class LateChunk:
    """A chunk that arrived after its player ran dry, and where its time went, all in ms. ``codes_after_dry_ms``: when
    its last code was in (the engine saw the chunk ready) relative to the moment the player ran dry (positive: the
    talker was late; then no schedule could have saved it); ``queued_ms``: ready to handed to a token2wav job;
    ``job_ms``: job start to emission. ``index``: the chunk's number in the reply (0 = the first audio)."""

    index: int
    waited_ms: float
    codes_after_dry_ms: float
    queued_ms: float
    job_ms: float

    def __str__(self) -> str:
        return (
            f"#{self.index} {self.waited_ms:.0f} ms late (codes {self.codes_after_dry_ms:+.0f} ms from dry, "
            f"queued {self.queued_ms:.0f}, job {self.job_ms:.0f})"
        )


@dataclass
class Playout:
    """One reply's player. ``ends_at``: when it will have played everything delivered (None before the first chunk);
    ``underruns``: chunks that arrived after it ran dry; ``starved_ms``: how long it waited for them in all; ``late``:
    the first :data:`MAX_LATE_CHUNKS` of those chunks, with where their time went (the engine reports, per chunk, when
    its codes were ready, :meth:`chunk_ready`, and when its job started, :meth:`job_started`). ``wanted_at``: when
    its client wants the first audio (the response's start plus the first-audio target; None: as soon as it can be
    made); with ``ends_at`` it gives the stream's :meth:`deadline`."""

    ends_at: float | None = None
    wanted_at: float | None = None
    underruns: int = 0
    starved_ms: float = 0.0
    chunks: int = 0
    late: list[LateChunk] = field(default_factory=list)
    _ready_at: float | None = None
    _job_at: float | None = None

    def chunk_ready(self, now: float) -> None:
        """The next chunk's codes are all in at ``now`` (the first call per chunk counts)."""
        if self._ready_at is None:
            self._ready_at = now

    def job_started(self, now: float) -> None:
        """The next chunk was handed to a token2wav job at ``now``."""
        self._job_at = now

    def deliver(self, now: float, duration_s: float) -> float:
        """A chunk of ``duration_s`` seconds arrives at ``now``: returns how long (ms) the player had been waiting for
        it (0 when it arrived in time, and for the first chunk, which starts the player)."""
        if duration_s < 0:
            raise ValueError(f"duration_s must be >= 0, got {duration_s}")
        waited_ms = 0.0
        if self.ends_at is None:
            self.ends_at = now
        elif self.ends_at < now:
            waited_ms = (now - self.ends_at) * 1000.0
            self.underruns += 1
            self.starved_ms += waited_ms
            self.ends_at = now
            self._note_late(now, waited_ms)
        self.ends_at += duration_s
        self.chunks += 1
        self._ready_at = self._job_at = None
        return waited_ms

    def _note_late(self, now: float, waited_ms: float) -> None:
        if len(self.late) >= MAX_LATE_CHUNKS:
            return
        dry = now - waited_ms / 1000.0
        ready = self._ready_at if self._ready_at is not None else now  # not reported: counted as ready on arrival
        job = self._job_at if self._job_at is not None else ready
        self.late.append(
            LateChunk(
                index=self.chunks,
                waited_ms=waited_ms,
                codes_after_dry_ms=(ready - dry) * 1000.0,
                queued_ms=(job - ready) * 1000.0,
                job_ms=(now - job) * 1000.0,
            )
        )

    @property
    def started(self) -> bool:
        """Whether a chunk was delivered (the player has started)."""
        return self.ends_at is not None

    def deadline(self, now: float) -> float:
        """The playout deadline (clock seconds): when the client runs out of audio. Once started, :attr:`ends_at` (the
        first chunk's arrival plus the audio delivered plus the time spent waiting for late chunks); before,
        :attr:`wanted_at`, or ``now`` when none is set (the first audio is wanted at every moment)."""
        if self.ends_at is not None:
            return self.ends_at
        return self.wanted_at if self.wanted_at is not None else now

    def ahead_ms(self, now: float) -> float:
        """Audio delivered and not yet played at ``now`` (ms; negative: the player has been waiting that long)."""
        if self.ends_at is None:
            raise ValueError("the player has not started: no chunk delivered yet")
        return (self.ends_at - now) * 1000.0

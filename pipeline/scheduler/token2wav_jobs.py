"""Which token2wav chunks to make next: first chunks before steady ones, and among steady ones the streams closest to
running dry. Pure logic, no torch and no clock: the engine passes in how much audio each stream has ahead.

Why a policy at all: one token2wav job (a batched DiT solve plus its vocoder calls) runs at a time, and a batch costs
about as much as its longest window times its rows. Mixed into a batch of steady chunks, a first chunk (72-frame
window) would be padded to the steady 144 frames and wait for every steady stream's chunk, while the steady streams
usually have audio in hand. So:

- A job holds only first chunks or only later chunks, never both.
- A job holds at most ``max_streams`` streams (one batched pass), so a first chunk that becomes ready while a job
  runs waits for one pass, not for every stream in the engine.
- The most urgent candidate decides the kind of job. A first chunk has 0 ms of audio ahead (someone is waiting for
  the first sample); a later chunk has the audio its stream sent minus what a real-time player has played since
  its first sample, less ``starving_margin_ms``. A steady stream with less than the margin ahead (0 by default: one
  already starving) outranks first chunks; otherwise first chunks go first. Why a margin: the policy runs when the
  worker is free, and a later chunk that lets a first-chunk job go first waits for that job and then its own, so
  with less audio in hand than the two take its player runs dry. Ties keep the callers' order (responses in the
  order they started).
- A job of later chunks may be split (``later_job_ms``, a model of such a job's time by its streams): when the most
  urgent streams would starve waiting for a job of every candidate, the job takes only the first ``k`` of them, the
  ``k`` by which the two jobs (these ``k``, then the rest) leave the fewest players running dry; ties keep one job
  (a batch of 16 costs far less than two of 8). Why: once a burst's replies all speak, every job holds all 16 streams
  and takes 260-300 ms on the H100, longer than a ramp chunk that was late to its job has in hand.
- How long the two take depends on the load (on the H100 a job of first chunks takes ~40 ms alone and 100-250 ms
  beside 16 users' decode steps), so the margin can follow it: :class:`RecentJobs` keeps the last jobs' durations
  and gives the longest recent first-chunk job plus the longest recent later-chunk job, never less than the
  configured floor.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

__all__ = ["ChunkCandidate", "RecentJobs", "Token2WavJob", "pick_job", "split_later_job"]


@dataclass(frozen=True)
class ChunkCandidate:
    """A stream with its next chunk ready. ``audio_ahead_ms``: audio sent minus audio played at real time since
    its first sample (ms; negative = a player would be starving); ignored for a first chunk (counted as 0)."""

    key: Hashable
    first: bool
    audio_ahead_ms: float = 0.0

    def urgency_ms(self, starving_margin_ms: float = 0.0) -> float:
        """Sort key: less audio ahead = more urgent; a later chunk counts ``starving_margin_ms`` less."""
        return 0.0 if self.first else self.audio_ahead_ms - starving_margin_ms


@dataclass(frozen=True)
class Token2WavJob:
    """The streams of one job, most urgent first; ``urgent``: a job of first chunks (it runs on the CUDA stream that
    outranks decode)."""

    keys: tuple[Hashable, ...]
    urgent: bool


def pick_job(candidates: Sequence[ChunkCandidate], max_streams: int, *, starving_margin_ms: float = 0.0,
             later_job_ms: Callable[[int], float | None] | None = None) -> Token2WavJob | None:  # fmt: skip
    """The next job among ``candidates`` (None when there is none): see the module docstring. ``later_job_ms(n)``:
    how long a job of ``n`` later chunks would take (ms; None: not known, the job is not split)."""
    if max_streams < 1:
        raise ValueError(f"max_streams must be >= 1, got {max_streams}")
    if starving_margin_ms < 0:
        raise ValueError(f"starving_margin_ms must be >= 0, got {starving_margin_ms}")
    # stable sort: equal urgency keeps the callers' order; a first chunk beats a later chunk at the margin
    ranked = sorted(candidates, key=lambda c: (c.urgency_ms(starving_margin_ms), not c.first))
    if not ranked:
        return None
    first = ranked[0].first
    chosen = [c for c in ranked if c.first == first][:max_streams]
    if not first and later_job_ms is not None:
        chosen = chosen[:split_later_job([c.audio_ahead_ms for c in chosen], later_job_ms)]
    return Token2WavJob(tuple(c.key for c in chosen), urgent=first)


def split_later_job(ahead_ms: Sequence[float], job_ms: Callable[[int], float | None]) -> int:
    """How many of these later chunks (audio ahead of each stream's player, ms, most urgent first) the next job
    should take: the ``k`` whose two jobs (the first ``k``, then the rest) leave the fewest players running dry by
    ``job_ms(n)``, the time of a job of ``n``; the largest such ``k``, and all of them unless a split leaves strictly
    fewer dry (a split that only moves the starving from some streams to others costs another job's fixed time, which
    delays everything after it) or when a time is not known."""
    n = len(ahead_ms)
    times = [job_ms(k) for k in range(1, n + 1)]
    if n < 2 or any(t is None for t in times):
        return n

    def starved(k: int) -> int:
        first, rest = times[k - 1], times[k - 1] + (times[n - k - 1] if k < n else 0.0)
        return sum((first if i < k else rest) > a for i, a in enumerate(ahead_ms))

    best = n
    for k in range(n - 1, 0, -1):  # fewer streams only when strictly better
        if starved(k) < starved(best):
            best = k
    return best


class RecentJobs:
    """The durations of the last ``window`` token2wav jobs of each kind (first chunks / later chunks), in ms from
    the job's hand-over to its chunks' emission: what a later chunk that lets a first-chunk job go first waits; and
    of the last ``fit_window`` later-chunk jobs with their sizes, for :meth:`later_job_ms`."""

    def __init__(self, window: int = 8, fit_window: int = 32) -> None:
        if window < 1 or fit_window < 1:
            raise ValueError(f"window and fit_window must be >= 1, got {window}, {fit_window}")
        self._ms: dict[bool, deque[float]] = {True: deque(maxlen=window), False: deque(maxlen=window)}
        self._later: deque[tuple[int, float]] = deque(maxlen=fit_window)

    def record(self, first: bool, ms: float, streams: int = 1) -> None:
        """A job of ``streams`` first chunks (``first``) or later chunks took ``ms``."""
        if ms < 0:
            raise ValueError(f"ms must be >= 0, got {ms}")
        if streams < 1:
            raise ValueError(f"streams must be >= 1, got {streams}")
        self._ms[first].append(ms)
        if not first:
            self._later.append((streams, ms))

    def later_job_ms(self, streams: int) -> float | None:
        """How long a job of ``streams`` later chunks takes (ms): the least-squares line through the recent
        later-chunk jobs' (streams, ms), never falling with size nor below 0; None until jobs of two sizes were seen.
        Why a line: a job is one batched DiT solve and vocoder call per chunk length, a fixed cost plus a cost per
        stream."""
        sizes = {n for n, _ in self._later}
        if len(sizes) < 2:
            return None
        count = len(self._later)
        mean_n = sum(n for n, _ in self._later) / count
        mean_ms = sum(ms for _, ms in self._later) / count
        var = sum((n - mean_n) ** 2 for n, _ in self._later)
        slope = max(0.0, sum((n - mean_n) * (ms - mean_ms) for n, ms in self._later) / var)
        return max(0.0, mean_ms + slope * (streams - mean_n))

    def starving_margin_ms(self, floor_ms: float) -> float:
        """The longest recent first-chunk job plus the longest recent later-chunk job (a kind not seen yet counts
        0), or ``floor_ms`` when that is more: a later chunk with less audio ahead than this would starve behind a
        first-chunk job."""
        longest = sum(max(times, default=0.0) for times in self._ms.values())
        return max(float(floor_ms), longest)

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
  its first sample, less ``starving_margin_ms``. A steady stream with less than the margin ahead (with 0: only one
  already starving) outranks first chunks; otherwise first chunks go first. Why a margin: the policy runs when the
  worker is free, and a later chunk that lets a first-chunk job go first waits for that job and then its own, so
  with less audio in hand than the two take its player runs dry. Ties keep the callers' order (responses in the
  order they started).
- How long the two take depends on the load (on the H100 a job of first chunks takes ~40 ms alone and 100-250 ms
  beside 16 users' decode steps), so the margin can follow it: :class:`RecentJobs` keeps the last jobs' durations
  and gives the longest recent first-chunk job plus the longest recent later-chunk job, never less than the
  configured floor.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

__all__ = ["ChunkCandidate", "RecentJobs", "Token2WavJob", "pick_job"]


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


def pick_job(
    candidates: Sequence[ChunkCandidate], max_streams: int, *, starving_margin_ms: float = 0.0
) -> Token2WavJob | None:
    """The next job among ``candidates`` (None when there is none): see the module docstring."""
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
    return Token2WavJob(tuple(c.key for c in chosen), urgent=first)


class RecentJobs:
    """The durations of the last ``window`` token2wav jobs of each kind (first chunks / later chunks), in ms from
    the job's hand-over to its chunks' emission: what a later chunk that lets a first-chunk job go first waits."""

    def __init__(self, window: int = 8) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._ms: dict[bool, deque[float]] = {True: deque(maxlen=window), False: deque(maxlen=window)}

    def record(self, first: bool, ms: float) -> None:
        """A job of first chunks (``first``) or later chunks took ``ms``."""
        if ms < 0:
            raise ValueError(f"ms must be >= 0, got {ms}")
        self._ms[first].append(ms)

    def starving_margin_ms(self, floor_ms: float) -> float:
        """The longest recent first-chunk job plus the longest recent later-chunk job (a kind not seen yet counts
        0), or ``floor_ms`` when that is more: a later chunk with less audio ahead than this would starve behind a
        first-chunk job."""
        longest = sum(max(times, default=0.0) for times in self._ms.values())
        return max(float(floor_ms), longest)

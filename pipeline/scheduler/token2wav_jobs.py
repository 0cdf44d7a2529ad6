"""Which token2wav chunks to make next: earliest playout deadline first. Pure logic, no torch and no clock: the
engine passes in how long each stream has until its deadline, read off its own clock.

A stream's **playout deadline** is the moment its client runs out of audio: for a reply whose audio is playing, its
first sample's time plus the audio sent (a real-time player; one that ran dry resumes on the next chunk, so the time
it waited counts too); for a reply whose audio has not started (its first chunk, or a first audio the start buffer
holds), the moment its first audio is wanted: the response's start plus ``token2wav.first_audio_target_ms``. A
candidate carries the time from the pick to its deadline (``audio_ahead_ms``).

Why a policy at all: one token2wav job (a batched DiT solve plus its vocoder calls) runs at a time, and a batch costs
about as much as its longest window times its rows. Mixed into a batch of steady chunks, a first chunk (72-frame
window) would be padded to the steady 144 frames and wait for every steady stream's chunk. The rule
(:func:`pick_job`), in order:

1. **Due or not.** With a lead (``lead_ms``, from ``token2wav.deadline_lead_s``), a candidate whose deadline is more
   than the lead away is not due. No due candidate, no job: the step's GPU time goes to decode and the worker stays
   free for the streams that will need it. A first chunk is always due when the first-audio target is within the lead
   (the typed config requires it). Without a lead every candidate is due. The scheduler gives a step a lead only when
   it decodes or prefills (:meth:`pipeline.scheduler.scheduler.Scheduler.audio_rule`): in a step with nothing else to
   do, waiting would only leave the GPU idle (and, on a clock that stands still, never end).
2. **Earliest deadline first.** A candidate's urgency is its time to deadline; a later chunk's counts
   ``starving_margin_ms`` less, because the time it has must cover its own job and possibly a job of first chunks
   that goes before it. The most urgent due candidate decides the kind of job: first chunks only, or later chunks
   only, never both. At equal urgency a first chunk goes first, then the stream that started earlier
   (``arrival``), then the callers' order.
3. **One full batch.** The job takes the candidates of that kind, due or not, most urgent first, at most
   ``max_streams`` (one batched pass): the due ones come first, since a due candidate is more urgent than any that
   is not. Why fill the batch with streams that could wait: a pass costs far less per stream in a batch than alone
   (fixed costs per pass: launches, the hand-over, the host reading the audio), and streams that become due one by
   one would otherwise each get a pass of their own. A first chunk that becomes ready while a job runs waits for
   one pass, not for every stream.

Nothing starves: a waiting candidate's deadline does not move, while each job moves the deadlines of the streams it
serves later (their audio grows) and a newly started reply's first chunk is wanted later than an earlier one's, so
with a fixed margin every due candidate becomes the most urgent after finitely many jobs.

How long a job takes depends on the load (on the H100 a job of first chunks takes ~40 ms alone and 100-250 ms beside
16 users' decode steps), so the margin can follow it: :class:`RecentJobs` keeps the last jobs' durations and gives
the longest recent first-chunk job plus the longest recent later-chunk job, never less than the configured floor.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

__all__ = ["ChunkCandidate", "RecentJobs", "Token2WavJob", "pick_job"]


@dataclass(frozen=True)
class ChunkCandidate:
    """A stream with its next chunk ready. ``audio_ahead_ms``: ms from the pick to the stream's playout deadline (for
    a reply whose audio plays, the audio its player has in hand; negative: it has been waiting that long; for a reply
    whose audio has not started, the time until its first audio is wanted; 0: wanted now). ``first``: the chunk is
    the reply's first. ``arrival``: the stream's place in the order the responses started (lower: earlier)."""

    key: Hashable
    first: bool
    audio_ahead_ms: float = 0.0
    arrival: int = 0

    def urgency_ms(self, starving_margin_ms: float = 0.0) -> float:
        """Sort key: nearer deadline = more urgent; a later chunk counts ``starving_margin_ms`` less."""
        return self.audio_ahead_ms if self.first else self.audio_ahead_ms - starving_margin_ms

    def due(self, lead_ms: float | None) -> bool:
        """Whether it runs now rather than wait: its deadline is within ``lead_ms`` (None: always)."""
        return lead_ms is None or self.audio_ahead_ms <= lead_ms


@dataclass(frozen=True)
class Token2WavJob:
    """The streams of one job, most urgent first; ``urgent``: a job of first chunks (it runs on the CUDA stream that
    outranks decode)."""

    keys: tuple[Hashable, ...]
    urgent: bool


def pick_job(
    candidates: Sequence[ChunkCandidate],
    max_streams: int,
    *,
    starving_margin_ms: float = 0.0,
    lead_ms: float | None = None,
) -> Token2WavJob | None:
    """The next job among ``candidates`` (None when none is due, i.e. has its deadline within ``lead_ms``; None: every
    candidate is due): the candidates of the kind of the most urgent due one, the due ones first, then by deadline, at
    most ``max_streams``; see the module docstring for the whole rule."""
    if max_streams < 1:
        raise ValueError(f"max_streams must be >= 1, got {max_streams}")
    if starving_margin_ms < 0:
        raise ValueError(f"starving_margin_ms must be >= 0, got {starving_margin_ms}")
    if lead_ms is not None and lead_ms < 0:
        raise ValueError(f"lead_ms must be >= 0 or None, got {lead_ms}")
    # stable sort: a first chunk beats a later chunk at equal urgency, then the earlier start, then the callers' order
    ranked = sorted(candidates, key=lambda c: (c.urgency_ms(starving_margin_ms), not c.first, c.arrival))
    trigger = next((c for c in ranked if c.due(lead_ms)), None)
    if trigger is None:
        return None
    # due candidates of the trigger's kind first (a later chunk's margin can rank one that is not due above them)
    kind = [c for c in ranked if c.first == trigger.first]
    chosen = ([c for c in kind if c.due(lead_ms)] + [c for c in kind if not c.due(lead_ms)])[:max_streams]
    return Token2WavJob(tuple(c.key for c in chosen), urgent=trigger.first)


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

"""The latency goal a level of users is served at, and the most users served at it (admission's calibration).

A level **meets the goal** when every one of its turns that was not talked over got a reply with sound
(``completed``, or ``incomplete`` at a forced length), the p95 of their time to first audio after
``speech_stopped`` is within ``p95_ttfa_ms``, and no reply played to its end had an underrun. **Users at the
goal** is the largest level that meets it with every smaller level of the run meeting it too: a level that misses the
goal below a higher one that meets it is noise in the higher one's favour, not headroom.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from realtime.bench.metrics import Distribution, TurnMetrics

DEFAULT_P95_TTFA_MS = 600.0
REPLIED = ("completed", "incomplete")


@dataclass(frozen=True)
class LatencyGoal:
    p95_ttfa_ms: float = DEFAULT_P95_TTFA_MS

    def __post_init__(self) -> None:
        if not self.p95_ttfa_ms > 0:
            raise ValueError(f"the goal's p95 time to first audio must be > 0 ms, got {self.p95_ttfa_ms}")

    def describe(self) -> str:
        return f"p95 first audio ≤ {self.p95_ttfa_ms:g} ms after speech_stopped, no turn with underruns"

    def meets(self, turns: Sequence[TurnMetrics]) -> bool:
        """Whether one level's turns meet the goal (module docstring)."""
        measured = [t for t in turns if t.barge_in_kind is None]
        if not measured or any(t.status not in REPLIED or t.ttfa_ms is None for t in measured):
            return False
        if Distribution.of(t.ttfa_ms for t in measured).p95 > self.p95_ttfa_ms:
            return False
        return not any(t.underruns for t in measured)

    def users_at_goal(self, levels: Sequence[tuple[int, Sequence[TurnMetrics]]]) -> int:
        """The most users served at the goal over ``(users, turns)`` levels; 0 when the smallest level misses it."""
        best = 0
        for users, turns in sorted(levels, key=lambda level: level[0]):
            if not self.meets(turns):
                break
            best = users
        return best

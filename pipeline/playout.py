"""The engine's model of a client's real-time player of one reply: how much audio it has in hand, and when it ran dry.

Pure arithmetic over a caller-supplied clock (seconds, ``time.perf_counter()`` in the engine). The player starts on
the reply's first chunk, plays continuously at real time, and when it runs out waits for the next chunk and resumes
on its arrival: the WebSocket player of the benchmark (``realtime/bench/metrics.py``, without its jitter buffer), and
what a browser's audio queue does. The engine schedules token2wav by it (a stream's audio ahead,
``pipeline/stages/token2wav_schedule.py``) and counts its underruns: what a client would hear if the network added
nothing, so an operator can tell the engine's lateness from the network's.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Playout"]


@dataclass
class Playout:
    """One reply's player. ``ends_at``: when it will have played everything delivered (None before the first chunk);
    ``underruns``: chunks that arrived after it ran dry; ``starved_ms``: how long it waited for them in all."""

    ends_at: float | None = None
    underruns: int = 0
    starved_ms: float = 0.0

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
        self.ends_at += duration_s
        return waited_ms

    def ahead_ms(self, now: float) -> float:
        """Audio delivered and not yet played at ``now`` (ms; negative: the player has been waiting that long)."""
        if self.ends_at is None:
            raise ValueError("the player has not started: no chunk delivered yet")
        return (self.ends_at - now) * 1000.0

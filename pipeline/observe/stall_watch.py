"""Notices an engine that has live responses but produces nothing, so that the log says where they wait.

Pure logic (no torch, no clock of its own): the engine core calls :meth:`StallWatch.check` after each step with
its work marks (token and sample counters, responses finished) and ``time.monotonic()``; a report is due when
the marks have not changed for ``after_s`` while responses were live, then again every ``after_s`` while the
stall lasts. What goes into the report is the caller's (:meth:`pipeline.core.engine_core.EngineCore.describe`).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

DEFAULT_STALL_S = 10.0
"""No token, sample or finished response for this long, with responses live, is a stall worth a log record:
the slowest legitimate wait (a token2wav chunk of 8 streams on a busy GPU, a 7B prefill on the CPU) is seconds."""


@dataclass
class StallWatch:
    after_s: float = DEFAULT_STALL_S
    _marks: Hashable = None
    _since: float | None = None
    """monotonic seconds when the marks last changed (or responses became live)."""
    _reported_at: float | None = None

    def check(self, marks: Hashable, *, live: bool, now: float) -> float | None:
        """Seconds without progress when a report is due now, else None. ``live``: responses exist."""
        if not live:  # the clock starts again when responses become live
            self._since = None
            return None
        if marks != self._marks or self._since is None:
            self._marks, self._since, self._reported_at = marks, now, None
            return None
        stalled = now - self._since
        if stalled < self.after_s:
            return None
        if self._reported_at is not None and now - self._reported_at < self.after_s:
            return None
        self._reported_at = now
        return stalled

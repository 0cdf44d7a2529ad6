"""``turn_detection`` settings as the protocol carries them: validated values, no detector (that is
:mod:`realtime.turns.server_vad`)."""

from __future__ import annotations

from dataclasses import dataclass

from realtime.errors import RealtimeError

HYSTERESIS = 0.15
"""Speech ends below ``threshold - HYSTERESIS``: silero-vad's own gap, so a flickering probability
around the threshold does not split a turn."""

MIN_END_THRESHOLD = 0.01
"""Floor of the end threshold, so a low ``threshold`` still lets speech end."""


EAGERNESS = ("low", "medium", "auto", "high")
"""``semantic_vad``'s ``eagerness`` values. What each means (when the turn model is asked, how sure it must be, how
long a turn may pause, the silence that ends a turn it could not score) is the server's
(``realtime.turns.semantic.SemanticVadConfig``), not the protocol's."""


@dataclass(frozen=True)
class ServerVadParams:
    """``turn_detection`` settings of type ``server_vad`` (or ``semantic_vad``); invalid values raise
    ``RealtimeError``.

    ``create_response`` / ``interrupt_response`` are carried for the session layer (respond when
    speech stops; cancel a playing response when speech starts), and so is ``idle_timeout_ms`` (ask for a response
    after that much silence following the last response, :mod:`realtime.turns.idle`); the detector itself ignores them.
    ``eagerness`` is set when the client asked for ``semantic_vad`` (:meth:`semantic`): the session reports that
    type back and the server's semantic detector (``realtime.turns.semantic_detector``) reads it; that detector
    ignores ``silence_duration_ms`` (its silences come from the eagerness).
    """

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None
    eagerness: str | None = None

    @classmethod
    def semantic(cls, eagerness: str = "auto", **flags: bool) -> ServerVadParams:
        """``semantic_vad`` with this ``eagerness``: default threshold and padding; ``flags``: ``create_response`` /
        ``interrupt_response``."""
        return cls(eagerness=eagerness, **flags)

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)):
            _invalid("threshold", f"must be a number, got {self.threshold!r}")
        if not 0.0 <= self.threshold <= 1.0:
            _invalid("threshold", f"must be between 0.0 and 1.0, got {self.threshold}")
        for name in ("prefix_padding_ms", "silence_duration_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                _invalid(name, f"must be a non-negative integer number of milliseconds, got {value!r}")
        for name in ("create_response", "interrupt_response"):
            if not isinstance(getattr(self, name), bool):
                _invalid(name, f"must be a boolean, got {getattr(self, name)!r}")
        idle = self.idle_timeout_ms
        if idle is not None and (isinstance(idle, bool) or not isinstance(idle, int) or idle < 1):
            _invalid("idle_timeout_ms", f"must be null or a positive integer number of milliseconds, got {idle!r}")
        if self.eagerness is not None and self.eagerness not in EAGERNESS:
            _invalid("eagerness", f"must be one of {', '.join(EAGERNESS)}, got {self.eagerness!r}")
        if self.eagerness is not None and idle is not None:
            _invalid("idle_timeout_ms", "is a server_vad setting; semantic_vad has no idle timeout")

    @property
    def end_threshold(self) -> float:
        """Probability below which a frame counts as silence while speaking."""
        return max(self.threshold - HYSTERESIS, MIN_END_THRESHOLD)


def _invalid(name: str, problem: str) -> None:
    raise RealtimeError(f"turn_detection.{name} {problem}", param=f"session.turn_detection.{name}")

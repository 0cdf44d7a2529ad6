"""Server-side limits on what one client may send and how many clients may be served. Pure (no I/O).

- :class:`SessionSlots`: at most ``max_sessions`` concurrent sessions; a client beyond that is
  refused before any model work (the WebSocket endpoint answers with an ``error`` event of code
  :attr:`LimitCode.SESSION_LIMIT_REACHED`, then closes with 1013 "try again later").
- :class:`MessageGate`: per-message checks before a client message reaches the session: text
  frames only, at most ``max_message_bytes`` bytes (UTF-8), and a per-session event rate
  (:class:`TokenBucket`). A rejected message is dropped and answered with an ``error`` event;
  the connection stays open.

The input audio buffer limit is the session's own (``SessionLimits.max_buffer_ms``): the server
only passes the configured value on.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

from realtime.errors import LimitExceeded, ProtocolError, RealtimeError
from realtime.protocol.codes import ErrorCode


class LimitCode(str, enum.Enum):
    """Wire error codes of the server's limits (the ``error.code`` field); never change one."""

    MESSAGE_TOO_LARGE = "message_too_large"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    SESSION_LIMIT_REACHED = "session_limit_reached"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class RateLimit:
    """Per-session client event rate: a token bucket refilled at ``events_per_second`` holding
    at most ``burst`` events. Real-time audio in 20 ms chunks is 50 events per second; the burst
    lets a client upload buffered audio faster than real time."""

    events_per_second: float = 200.0
    burst: int = 1000

    def __post_init__(self) -> None:
        if not self.events_per_second > 0:
            raise ValueError(f"events_per_second must be positive, got {self.events_per_second}")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise ValueError(f"burst must be an integer >= 1, got {self.burst!r}")


class TokenBucket:
    """``burst`` tokens, refilled continuously at ``rate`` tokens per second (``clock`` in seconds).
    Starts full."""

    def __init__(self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate
        self._capacity = float(burst)
        self._tokens = float(burst)
        self._clock = clock
        self._last = clock()

    def take(self) -> bool:
        """Spend one token if there is one; ``False`` means over the limit (nothing is spent)."""
        now = self._clock()
        self._tokens = min(self._capacity, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class MessageGate:
    """Admission of one session's client messages, in arrival order (see the module docstring).

    Every message spends a rate token, even one rejected for its size or kind: a flood of bad
    messages is still a flood."""

    def __init__(self, *, max_message_bytes: int, rate: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_message_bytes = max_message_bytes
        self._bucket = TokenBucket(rate.events_per_second, rate.burst, clock=clock)
        self._rate = rate

    def check(self, message: str | bytes) -> RealtimeError | None:
        """``None`` when ``message`` may reach the session, else the error to answer it with."""
        if not self._bucket.take():
            return LimitExceeded(
                f"more than {self._rate.events_per_second:g} events per second (burst {self._rate.burst}): "
                "this event was dropped; slow down",
                code=LimitCode.RATE_LIMIT_EXCEEDED,
            )
        if isinstance(message, bytes):
            return ProtocolError(
                "binary WebSocket messages are not supported: send each event as a JSON text message",
                code=ErrorCode.INVALID_EVENT,
            )
        size = _utf8_size(message, self.max_message_bytes)
        if size > self.max_message_bytes:
            return LimitExceeded(
                f"message of {size} bytes is over the limit of {self.max_message_bytes} bytes: this event was "
                "dropped; send audio in smaller chunks",
                code=LimitCode.MESSAGE_TOO_LARGE,
            )
        return None


def _utf8_size(text: str, limit: int) -> int:
    """The UTF-8 size of ``text`` where it matters; when even 4 bytes per character stays within
    ``limit`` the character count stands in for it (the encoding of a large message is skipped)."""
    if 4 * len(text) <= limit:
        return len(text)
    return len(text.encode("utf-8"))


class SessionSlot:
    """One admitted session; :meth:`release` (or leaving the ``with`` block) frees it, once."""

    def __init__(self, slots: SessionSlots) -> None:
        self._slots = slots
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._slots._release()

    def __enter__(self) -> SessionSlot:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class SessionSlots:
    """A counter of live sessions with a ceiling. Not thread-safe: used from the event loop."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the session limit must be >= 1, got {limit}")
        self.limit = limit
        self._active = 0

    @property
    def active(self) -> int:
        return self._active

    def try_acquire(self) -> SessionSlot | None:
        """A slot, or ``None`` when ``limit`` sessions are live."""
        if self._active >= self.limit:
            return None
        self._active += 1
        return SessionSlot(self)

    def _release(self) -> None:
        self._active -= 1

    def refusal(self) -> LimitExceeded:
        """The error a refused client gets."""
        return LimitExceeded(
            f"the server is serving its maximum of {self.limit} concurrent sessions; try again later",
            code=LimitCode.SESSION_LIMIT_REACHED,
        )

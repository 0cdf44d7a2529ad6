"""Server-side limits on what one client may send and how many clients may be served. Pure (no I/O).

- :class:`SessionSlots`: at most ``max_sessions`` concurrent sessions; a client beyond that is
  refused before any model work (the WebSocket endpoint answers with an ``error`` event of code
  :attr:`LimitCode.SESSION_LIMIT_REACHED`, then closes with 1013 "try again later").
- :class:`MessageGate`: per-message checks before a client message reaches the session: text
  frames only, at most ``max_message_bytes`` bytes (UTF-8), and per-session rates (:class:`RateLimit`): input audio
  appends by their size in one :class:`TokenBucket`, every other event by its count in another, so audio sent faster
  than real time never starves the commit or ``response.create`` behind it. A rejected message is dropped and
  answered with an ``error`` event; the connection stays open.

The input audio buffer limit is the session's own (``SessionLimits.max_buffer_ms``): the server
only passes the configured value on; it bounds the memory an upload takes, the audio rate bounds its CPU.
"""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from realtime.errors import LimitExceeded, ProtocolError, RealtimeError
from realtime.protocol.codes import ErrorCode

AUDIO_BYTES_PER_SECOND = 64_000
"""Message bytes of one second of pcm16 audio at 24 kHz (48 000 bytes) in base64, the unit of the audio rate's
defaults (other formats take fewer bytes a second: g711 8 kHz 10 667)."""
_AUDIO_APPEND = re.compile(r'"type"\s*:\s*"input_audio_buffer\.append"')
"""An ``input_audio_buffer.append`` event (JSON text cannot hold an unescaped quote inside a string, so only a
``type`` key matches). A crafted message that evades or imitates it only moves its cost to the other bucket."""


class LimitCode(enum.StrEnum):
    """Wire error codes of the server's limits (the ``error.code`` field); never change one."""

    MESSAGE_TOO_LARGE = "message_too_large"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    SESSION_LIMIT_REACHED = "session_limit_reached"


@dataclass(frozen=True)
class RateLimit:
    """Per-session client rates, two token buckets.

    Events other than audio appends (commits, ``response.create``, ``session.update``, items, and any message
    rejected for its kind or size): refilled at ``events_per_second``, holding at most ``burst`` events.

    Audio appends (``input_audio_buffer.append``), charged their message size in bytes: refilled at
    ``audio_bytes_per_second``, holding at most ``audio_burst_bytes``. With pcm16 at 24 kHz
    (:data:`AUDIO_BYTES_PER_SECOND` bytes a second of audio) the defaults take 10 seconds of audio a second and an
    upload of a minute of recorded audio at once, in pieces of any size. An append larger than the burst passes when
    the bucket is full and leaves it in debt (later appends wait for the refill)."""

    events_per_second: float = 200.0
    burst: int = 1000
    audio_bytes_per_second: int = 10 * AUDIO_BYTES_PER_SECOND
    audio_burst_bytes: int = 60 * AUDIO_BYTES_PER_SECOND

    def __post_init__(self) -> None:
        if not self.events_per_second > 0:
            raise ValueError(f"events_per_second must be positive, got {self.events_per_second}")
        for name in ("burst", "audio_bytes_per_second", "audio_burst_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


class TokenBucket:
    """``burst`` tokens, refilled continuously at ``rate`` tokens per second (``clock`` in seconds).
    Starts full."""

    def __init__(self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate
        self._capacity = float(burst)
        self._tokens = float(burst)
        self._clock = clock
        self._last = clock()

    def take(self, cost: float = 1.0) -> bool:
        """Spend ``cost`` tokens if the bucket holds them (a cost above the burst: if it is full, leaving it in
        debt); ``False`` means over the limit (nothing is spent)."""
        now = self._clock()
        self._tokens = min(self._capacity, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens < min(cost, self._capacity):
            return False
        self._tokens -= cost
        return True


class MessageGate:
    """Admission of one session's client messages, in arrival order (see the module docstring).

    Every message spends from a bucket, even one rejected for its size or kind (an event of the control bucket): a
    flood of bad messages is still a flood."""

    def __init__(self, *, max_message_bytes: int, rate: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_message_bytes = max_message_bytes
        self._events = TokenBucket(rate.events_per_second, rate.burst, clock=clock)
        self._audio = TokenBucket(rate.audio_bytes_per_second, rate.audio_burst_bytes, clock=clock)
        self._rate = rate

    def check(self, message: str | bytes) -> RealtimeError | None:
        """``None`` when ``message`` may reach the session, else the error to answer it with."""
        if isinstance(message, bytes):
            return self._over_event_rate() or ProtocolError(
                "binary WebSocket messages are not supported: send each event as a JSON text message",
                code=ErrorCode.INVALID_EVENT,
            )
        size = _utf8_size(message, self.max_message_bytes)
        if size > self.max_message_bytes:
            return self._over_event_rate() or LimitExceeded(
                f"message of {size} bytes is over the limit of {self.max_message_bytes} bytes: this event was "
                "dropped; send audio in smaller chunks",
                code=LimitCode.MESSAGE_TOO_LARGE,
            )
        if _AUDIO_APPEND.search(message) is None:
            return self._over_event_rate()
        if self._audio.take(size):
            return None
        rate = self._rate
        return LimitExceeded(
            f"input audio faster than {rate.audio_bytes_per_second} bytes per second (burst {rate.audio_burst_bytes} "
            "bytes): this append was dropped; send audio no faster than that",
            code=LimitCode.RATE_LIMIT_EXCEEDED,
        )

    def _over_event_rate(self) -> RealtimeError | None:
        if self._events.take():
            return None
        return LimitExceeded(
            f"more than {self._rate.events_per_second:g} events per second (burst {self._rate.burst}) besides audio "
            "appends: this event was dropped; slow down",
            code=LimitCode.RATE_LIMIT_EXCEEDED,
        )


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


class SlotSource(Protocol):
    """Where a session takes its slot: :class:`SessionSlots`, or the engines' admission
    (:class:`realtime.engines.placement.EngineSlots`). Used from the event loop."""

    @property
    def limit(self) -> int:
        """Live sessions at most."""
        ...

    def try_acquire(self) -> SessionSlot | None:
        """A slot, or ``None`` when refused (:meth:`refusal` says why)."""
        ...

    def refusal(self) -> RealtimeError:
        """Why the last :meth:`try_acquire` returned ``None``."""
        ...

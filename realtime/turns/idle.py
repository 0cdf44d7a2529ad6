"""The idle timeout of ``server_vad`` (``turn_detection.idle_timeout_ms``): when it is due. Pure.

OpenAI's rule: the timeout runs from the end of the last response's audio *playback* (its ``response.done`` plus
the playback time of its audio) while the user says nothing; when it expires the server sends
``input_audio_buffer.timeout_triggered`` {audio_start_ms, audio_end_ms, item_id}, commits the (silent) input audio
as a user item and asks for a response.

Here every time is a point of the session's audio clock (milliseconds of input audio appended, the clock of
``audio_start_ms`` / ``audio_end_ms``), so the timeout advances while the client streams its microphone, which is
what voice-agent clients do, and never while it sends nothing. The end of playback is known on WebRTC (the output
track reports it); over a WebSocket the client plays the deltas, so it is estimated as the clock when the first
delta went out plus the audio's duration, and never before ``response.done``.
"""

from __future__ import annotations


class IdleTimer:
    """When the assistant last finished speaking, if the user has not spoken or been answered since.

    The session calls :meth:`start` when a response's audio has finished playing (or its response ended without
    audio), :meth:`stop` when speech starts or a response starts, and asks :meth:`due` on each appended chunk."""

    def __init__(self) -> None:
        self._since_ms: float | None = None

    @property
    def since_ms(self) -> float | None:
        """Where the idle stretch began on the audio clock; None while not idle."""
        return self._since_ms

    def start(self, at_ms: float) -> None:
        self._since_ms = at_ms

    def stop(self) -> None:
        self._since_ms = None

    def due(self, now_ms: float, timeout_ms: int | None) -> bool:
        """The idle stretch has lasted ``timeout_ms`` at ``now_ms`` (never when ``timeout_ms`` is None)."""
        return timeout_ms is not None and self._since_ms is not None and now_ms - self._since_ms >= timeout_ms


def playback_end_ms(done_ms: float, first_audio_ms: float | None, audio_ms: float) -> float:
    """Where a response's audio ends playing on the audio clock, for a client that plays the deltas as they come:
    ``audio_ms`` after its first delta went out (at ``first_audio_ms``; None: it had no audio), but not before the
    response ended (``done_ms``)."""
    if first_audio_ms is None:
        return done_ms
    return max(done_ms, first_audio_ms + audio_ms)

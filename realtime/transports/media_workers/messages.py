"""What crosses between the server and a media worker: one frozen dataclass per message.

Every message but :class:`Ready` and :class:`LogRecord` names its call (``call``, the server's call id). Messages of
one call keep their order in each direction (one stream per worker). Audio crosses as numpy arrays or wire bytes,
never as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# --- server → worker -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """Answer ``offer_sdp`` for a new call; the worker replies :class:`Answered` or :class:`AnswerFailed`.
    ``input_format``: the wire format (``realtime.media.audio.AudioFormat`` value) of the microphone chunks to send."""

    call: str
    offer_sdp: str
    input_format: str


@dataclass(frozen=True)
class InputFormat:
    """Send the microphone in this wire format from now on (the session changed ``audio.input.format``)."""

    call: str
    input_format: str


@dataclass(frozen=True)
class ChannelSend:
    """Send ``text`` (a JSON server event) on the call's data channel."""

    call: str
    text: str


@dataclass(frozen=True)
class PlayAudioMessage:
    """Reply audio to play: float32 mono at 24 kHz, after what the response already queued."""

    call: str
    response_id: str
    pcm: np.ndarray


@dataclass(frozen=True)
class EndAudio:
    """``response_id`` gets no more audio; the worker reports :class:`PlaybackFinished` once it has played it."""

    call: str
    response_id: str


@dataclass(frozen=True)
class ClearAudioMessage:
    """Drop ``response_id``'s unplayed audio now, and only that response's: audio of any other response queued before
    it arrives plays on (a clear that overtakes the next reply's audio does not silence it). The worker replies
    :class:`AudioCleared`."""

    call: str
    response_id: str


@dataclass(frozen=True)
class Hangup:
    """End the call (close its data channel and peer connection); the worker replies :class:`CallEnded`."""

    call: str


# --- worker → server -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Answered:
    call: str
    answer_sdp: str


@dataclass(frozen=True)
class AnswerFailed:
    """The offer could not be answered; ``param`` ``sdp`` marks the client's fault (HTTP 400), None the server's."""

    call: str
    message: str
    param: str | None


@dataclass(frozen=True)
class Connected:
    """ICE and DTLS are up."""

    call: str


@dataclass(frozen=True)
class ChannelOpen:
    """The ``oai-events`` data channel is open: :class:`ChannelSend` reaches the client from now on."""

    call: str


@dataclass(frozen=True)
class ChannelMessage:
    """A message the client sent on the data channel (not yet gated nor parsed)."""

    call: str
    data: str | bytes


@dataclass(frozen=True)
class ChannelBusy:
    """More than the high-water mark is unsent on the data channel: hold further sends until :class:`ChannelDrained`."""

    call: str


@dataclass(frozen=True)
class ChannelDrained:
    call: str


@dataclass(frozen=True)
class MicAudio:
    """Microphone audio in ``input_format`` (wire bytes, as ``input_audio_buffer.append`` carries), from one received
    frame with RTP time ``pts`` at ``rate`` Hz (None: the frame had none)."""

    call: str
    input_format: str
    audio: bytes
    pts: int | None
    rate: int


@dataclass(frozen=True)
class PlaybackFinished:
    """The last sample of ``response_id`` went out on the reply track."""

    call: str
    response_id: str


@dataclass(frozen=True)
class AudioCleared:
    """Answers :class:`ClearAudioMessage` (and :class:`EndAudio` of a response with nothing queued): how much of the
    response had been played (ms; None: nothing of it was queued). The server truncates the cleared reply to it."""

    call: str
    response_id: str
    played_ms: float | None


@dataclass(frozen=True)
class CallEnded:
    """The call is over on the worker's side (its peer connection is closed): the client left, the connection
    failed, the microphone sent audio that cannot be converted (``error`` set), or the server hung up."""

    call: str
    reason: str
    error: str | None = None


@dataclass(frozen=True)
class Ready:
    """The worker has started and takes calls."""

    pid: int


@dataclass(frozen=True)
class LogRecord:
    """A log record of the worker, re-logged by the server under the same logger name."""

    name: str
    level: int
    message: str

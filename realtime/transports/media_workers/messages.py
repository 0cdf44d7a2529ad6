"""What crosses between the server and a media worker: one frozen dataclass per message.

Every message but :class:`Ready`, :class:`LogRecord` and :class:`CameraTaken` names its call (``call``, the
server's call id). Messages of one call keep their order in each direction (one stream per worker). Audio crosses as
numpy arrays or wire bytes, camera frames as numpy arrays (:class:`CameraFrame`), never as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.api import VisionInfo
from realtime.media.video_settings import DEFAULT_CAMERA, CameraSettings

# --- server → worker -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """Answer ``offer_sdp`` for a new call; the worker replies :class:`Answered` or :class:`AnswerFailed`.
    ``input_format``: the wire format (``realtime.media.audio.AudioFormat`` value) of the microphone chunks to send;
    ``camera`` and ``vision``: how a camera track is sampled, and for which vision tower (None: the model cannot see;
    its frames are counted ``no_vision``, never converted)."""

    call: str
    offer_sdp: str
    input_format: str
    camera: CameraSettings = DEFAULT_CAMERA
    vision: VisionInfo | None = None


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


@dataclass(frozen=True)
class CameraTaken:
    """The server has read one :class:`CameraFrame` (of any call): the worker may send another
    (:mod:`.camera`, flow control of the camera frames)."""


# --- worker → server -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Answered:
    """The answer; ``refused_video``: the offer's video tracks it rejects (no codec aiortc decodes), each counted
    ``unsupported_codec`` by the server."""

    call: str
    answer_sdp: str
    refused_video: int = 0


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
class CameraFrame:
    """A camera frame the worker kept (:class:`realtime.media.video.CameraFeed`): uint8 RGB ``(height, width, 3)``
    already at the sampled size, and its time ``at`` on the host's ``time.monotonic`` clock. The server answers each
    with :class:`CameraTaken`.

    Raw pixels rather than JPEG: the engine takes uint8 RGB, so a JPEG would cost the server's process a decode per
    frame (the work the workers take off it) and change what the model sees; at the default budget a frame is at most
    ~300 kB, at 2 a second 0.6 MB/s a call, a trifle for a Unix socket pair (one copy each side)."""

    call: str
    pixels: np.ndarray
    at: float


@dataclass(frozen=True)
class CameraCounts:
    """Camera frames whose fate the worker decided since its last report (``skipped``, ``no_vision``, ``invalid``,
    ``overflow``; :data:`~realtime.media.video_settings.CAMERA_OUTCOMES`): ``(outcome, frames)`` pairs. Sent at most
    every :data:`~.camera.COUNTS_EVERY_S` while frames come, and before :class:`CallEnded`."""

    call: str
    outcomes: tuple[tuple[str, int], ...]


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

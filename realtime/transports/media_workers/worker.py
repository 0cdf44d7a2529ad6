"""A media worker process: its own event loop, owning the aiortc peer connections of the calls placed on it.

For each call (:class:`WorkerCall`) it answers the offer (:func:`~realtime.transports.peer.answer_offer`: host
candidates as configured, no STUN; a video track in a codec aiortc cannot decode rejected), runs ICE, DTLS, SRTP and
RTP, decodes the microphone's Opus and resamples it to the session's input format
(:class:`~realtime.transports.media.MicrophoneEncoder`), samples the camera (:class:`realtime.media.video.CameraFeed`:
the kept frames, converted to RGB at the sampled size, cross to the server), and plays the reply audio on the paced
outgoing track (:class:`~realtime.transports.media.PacedAudioTrack`, encoding its own Opus packets). The session
itself lives in the server's process: every data-channel message, microphone chunk and kept camera frame goes there
(:mod:`.messages`), and the server's events, reply audio and play/clear/end controls come back.

Flow control: microphone chunks are sent in arrival order and the call's microphone loop waits while the wire to the
server is over its high-water mark (aiortc then holds the received frames). Camera frames never hold up the
microphone: they wait in the worker's :class:`~.camera.CameraLane` (bounded; the oldest dropped). Data-channel text is
sent as it comes; the server holds further text while the worker reports :class:`~.messages.ChannelBusy`.

Lifetime: the worker runs until the server closes its end of the wire (server shutdown, or the server's process
died); it then closes every call's peer connection and exits. Its log records go to the server
(:class:`~.messages.LogRecord`); its stdout and stderr are the server's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import cast

import numpy as np
from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from pipeline.api import VisionInfo
from realtime.errors import RealtimeError
from realtime.media.video import CameraFeed
from realtime.media.video_settings import DEFAULT_CAMERA, CameraSettings
from realtime.protocol.audio_format import AudioFormat
from realtime.transports import sctp_teardown
from realtime.transports.media import MicrophoneEncoder, OutputAudioQueue, PacedAudioTrack, frame_to_mono
from realtime.transports.media_workers import messages as m
from realtime.transports.media_workers.camera import CameraLane, CameraTally
from realtime.transports.media_workers.wire import Wire
from realtime.transports.peer import EventsChannel, IceHostAddress, answer_offer, discard, watch_peer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSettings:
    index: int
    ice_host_addresses: tuple[str, ...]
    """As ``ServerConfig.ice_host_addresses`` (``ADDRESS`` or ``ANNOUNCED@BIND``; empty: aioice's choice)."""
    log_level: int


def run(connection: Connection, settings: WorkerSettings) -> None:
    """The worker process's entry point (``multiprocessing`` spawn target)."""
    # Ctrl-C reaches the whole process group; the server stops its workers as it shuts down (as on SIGTERM).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_main(connection, settings))


async def _main(connection: Connection, settings: WorkerSettings) -> None:
    wire = await Wire.open(connection)
    _forward_logs(wire, settings.log_level)
    sctp_teardown.install()
    worker = Worker(wire, tuple(IceHostAddress.parse(a) for a in settings.ice_host_addresses))
    wire.send(m.Ready(os.getpid()))
    await worker.serve()


class _ForwardLogs(logging.Handler):
    """Log records → :class:`~.messages.LogRecord` on the wire (from any thread)."""

    def __init__(self, wire: Wire, level: int) -> None:
        super().__init__(level)
        self._wire = wire
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()

    def emit(self, record: logging.LogRecord) -> None:
        message = m.LogRecord(record.name, record.levelno, self.format(record))
        if threading.get_ident() == self._thread:
            self._wire.send(message)
        else:
            self._loop.call_soon_threadsafe(self._wire.send, message)


def _forward_logs(wire: Wire, level: int) -> None:
    root = logging.getLogger()
    root.handlers[:] = [_ForwardLogs(wire, level)]
    root.setLevel(level)


class Worker:
    """The calls of one worker, driven by the server's messages."""

    def __init__(self, wire: Wire, hosts: tuple[IceHostAddress, ...]) -> None:
        self.wire = wire
        self.hosts = hosts
        self.calls: dict[str, WorkerCall] = {}
        self.camera = CameraLane(wire.send, self._overflow)
        """The calls' camera frames on their way to the server."""
        self._tasks: set[asyncio.Task] = set()

    async def serve(self) -> None:
        """Handle messages until the server closes the wire; then end every call."""
        try:
            while (message := await self.wire.receive()) is not None:
                self.handle(message)
        finally:
            for call in list(self.calls.values()):
                call.end("server gone")
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def spawn(self, coro: Coroutine, name: str) -> asyncio.Task:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def handle(self, message: object) -> None:
        if isinstance(message, m.Answer):
            new = WorkerCall(
                self, message.call, AudioFormat(message.input_format), camera=message.camera, vision=message.vision
            )
            self.calls[new.id] = new
            self.spawn(new.answer(message.offer_sdp), f"{new.id} answer")
            return
        if isinstance(message, m.CameraTaken):
            self.camera.taken()
            return
        call = self.calls.get(getattr(message, "call", ""))
        if call is None:
            return  # the call ended here while the message was on its way
        if isinstance(message, m.ChannelSend):
            call.send_text(message.text)
        elif isinstance(message, m.PlayAudioMessage):
            call.output.play(message.response_id, message.pcm)
        elif isinstance(message, m.EndAudio):
            call.output.end(message.response_id)
            if call.output.played_ms(message.response_id) is None:  # nothing of it queued: nothing will finish
                self.wire.send(m.AudioCleared(call.id, message.response_id, None))
        elif isinstance(message, m.ClearAudioMessage):
            played_ms = call.output.played_ms(message.response_id)
            call.output.clear(message.response_id)
            self.wire.send(m.AudioCleared(call.id, message.response_id, played_ms))
        elif isinstance(message, m.InputFormat):
            call.input_format = AudioFormat(message.input_format)
        elif isinstance(message, m.Hangup):
            call.end("hung up by the server")
        else:
            raise TypeError(f"unexpected message for a media worker: {message!r}")

    def _overflow(self, call_id: str) -> None:
        call = self.calls.get(call_id)
        if call is not None:
            call.camera_outcomes.count("overflow")


class WorkerCall:
    """One call's peer connection, microphone loop, camera feed and reply track. ``camera`` and ``vision``: how its
    camera track is sampled (:class:`~.messages.Answer`)."""

    def __init__(
        self,
        worker: Worker,
        call_id: str,
        input_format: AudioFormat,
        *,
        camera: CameraSettings = DEFAULT_CAMERA,
        vision: VisionInfo | None = None,
    ) -> None:
        self.worker = worker
        self.id = call_id
        self.input_format = input_format
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.output = OutputAudioQueue()
        self.track = PacedAudioTrack(self.output, self._finished)
        self.channel: EventsChannel | None = None
        self.camera_outcomes = CameraTally(call_id, worker.wire.send)
        """The outcomes of its camera frames decided here."""
        self._camera_settings = camera
        self._vision = vision
        self._tasks: set[asyncio.Task] = set()
        self._ended = False
        watch_peer(self.pc, self, self.id)

    @property
    def wire(self) -> Wire:
        return self.worker.wire

    async def answer(self, offer_sdp: str) -> None:
        """Answer the offer (:class:`~.messages.Answered`), or report why not (:class:`~.messages.AnswerFailed`, and
        the call ends)."""
        try:
            answer, refused = await answer_offer(self.pc, offer_sdp, self.track, self.worker.hosts, self.id)
        except RealtimeError as exc:
            self.wire.send(m.AnswerFailed(self.id, exc.message, exc.param))
            self.end("offer refused")
        except Exception as exc:
            logger.exception("%s: answering the offer failed", self.id)
            self.wire.send(m.AnswerFailed(self.id, f"answering the offer failed: {exc}", None))
            self.end("answer failed")
        else:
            self.wire.send(m.Answered(self.id, answer, len(refused)))

    def send_text(self, text: str) -> None:
        """Send ``text`` on the data channel; dropped when it is not open: the server sends only after
        :class:`~.messages.ChannelOpen`, so the channel closed since and the call is ending."""
        if self.channel is not None:
            self.channel.send(text)

    def end(self, reason: str, error: str | None = None) -> None:
        """End the call (idempotent): release everything, then report :class:`~.messages.CallEnded`."""
        if self._ended:
            return
        self._ended = True
        self.worker.spawn(self._close(reason, error), f"{self.id} close")

    async def _close(self, reason: str, error: str | None) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.track.stop()
        self.output.clear_all()
        try:
            await self.pc.close()
        except Exception:  # the peer is gone either way; the call must still be reported ended
            logger.exception("%s: closing the peer connection failed", self.id)
        self.worker.calls.pop(self.id, None)
        self.worker.camera.forget(self.id)
        self.camera_outcomes.flush()
        self.wire.send(m.CallEnded(self.id, reason, error))

    def _spawn(self, coro: Coroutine, role: str) -> None:
        task = asyncio.create_task(coro, name=f"{self.id} {role}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _finished(self, response_id: str) -> None:
        self.wire.send(m.PlaybackFinished(self.id, response_id))

    # --- the peer connection's events (realtime.transports.peer.PeerEvents) ---

    def data_channel(self, channel: RTCDataChannel) -> None:
        wire = self.wire
        self.channel = EventsChannel(
            channel,
            on_message=lambda data: wire.send(m.ChannelMessage(self.id, data)),
            on_close=lambda: self.end("data channel closed"),
            on_busy=lambda busy: wire.send(m.ChannelBusy(self.id) if busy else m.ChannelDrained(self.id)),
        )
        self.channel.when_open(lambda: wire.send(m.ChannelOpen(self.id)))

    def remote_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            pump = self._microphone(track)
        elif track.kind == "video":
            pump = self._camera_feed(track)
        else:
            pump = discard(track)
        self._spawn(pump, f"{track.kind} track")

    def connection_state(self, state: str) -> None:
        if state == "connected":
            self.wire.send(m.Connected(self.id))
        elif state in ("failed", "closed"):
            self.end(f"connection {state}")

    async def _microphone(self, track: MediaStreamTrack) -> None:
        """Send the microphone to the server until the track ends. Audio it cannot convert ends the call: a session
        that silently stopped hearing its user is worse."""
        encoder = MicrophoneEncoder()
        while True:
            try:
                frame = cast(AudioFrame, await track.recv())  # an audio track's frames
            except MediaStreamError:
                return
            fmt = self.input_format
            try:
                data = encoder.encode(frame_to_mono(frame), frame.sample_rate, fmt)
            except ValueError as exc:
                logger.exception("%s: unusable microphone audio: ending the call", self.id)
                self.end("unusable microphone audio", error=str(exc))
                return
            if data:
                self.wire.send(m.MicAudio(self.id, fmt.value, data, frame.pts, frame.sample_rate))
                await self.wire.drain()

    async def _camera_feed(self, track: MediaStreamTrack) -> None:
        """Sample the browser's camera and send the kept frames to the server until the track ends."""
        count = self.camera_outcomes.count
        feed = CameraFeed(self._vision, self._camera_settings, kept=self._camera_frame, count=count, label=self.id)
        try:
            await feed.run(track)
        finally:
            self.camera_outcomes.flush()

    def _camera_frame(self, pixels: np.ndarray, at: float) -> None:
        self.worker.camera.put(m.CameraFrame(self.id, pixels, at))

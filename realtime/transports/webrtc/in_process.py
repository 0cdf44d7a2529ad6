"""A call's media in the server's process: its aiortc ``RTCPeerConnection`` on the server's event loop.

:class:`InProcessMedia` answers the offer (:func:`~realtime.transports.peer.answer_offer`: host addresses as
configured, no STUN server; an offered video track this server cannot decode is rejected in the answer and the call
goes on without it); it decodes the microphone (Opus → s16 stereo 48 kHz → the session's input format,
:class:`~realtime.transports.media.MicrophoneEncoder`), plays the reply audio on the outgoing
:class:`~realtime.transports.media.PacedAudioTrack`, and carries the ``oai-events`` data channel. A camera track is
sampled (:class:`~realtime.media.video.CameraFeed`) and its kept frames go to the user's spoken messages
(:class:`~realtime.media.message_frames.MessageFrames`), as on a media worker. :class:`InProcessMediaHost` makes the
calls whose media run here and counts their open peer connections.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from collections.abc import Callable
from typing import cast

import numpy as np
from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from realtime.media.message_frames import MessageFrames
from realtime.media.video import CameraFeed
from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.names import Dialect
from realtime.runner import MediaSink, SessionRunner, Transport, TransportClosed
from realtime.server.limits import MessageGate, SessionSlot
from realtime.transports import sctp_teardown
from realtime.transports.media import MicrophoneEncoder, OutputAudioQueue, PacedAudioTrack, frame_to_mono
from realtime.transports.peer import EventsChannel, IceHostAddress, answer_offer, discard, watch_peer
from realtime.transports.video_codecs import SetAside
from realtime.transports.webrtc.call import Call
from realtime.transports.webrtc.camera import UNSUPPORTED_CODEC, CallCameras

logger = logging.getLogger(__name__)


class InProcessMedia:
    """A :class:`~.call.CallMedia` on peer connection ``pc`` of this process (module docstring). ``hosts``: the ICE
    host candidates to announce (empty: aioice's choice); ``cameras``: how a camera track is sampled and counted."""

    def __init__(
        self, call_id: str, pc: RTCPeerConnection, *, hosts: tuple[IceHostAddress, ...], cameras: CallCameras
    ) -> None:
        self.id = call_id
        self.pc = pc
        self.output = OutputAudioQueue()
        self.track = PacedAudioTrack(self.output, self._playback_finished)
        self.channel: EventsChannel | None = None
        self.refused_video: tuple[SetAside, ...] = ()
        """The offer's video sections refused for their codecs (rejected in the answer)."""
        self._hosts = hosts
        self._cameras = cameras
        self._call: Call | None = None

    @property
    def call(self) -> Call:
        assert self._call is not None, "attach() comes first"
        return self._call

    def attach(self, call: Call) -> None:
        self._call = call
        watch_peer(self.pc, self, f"webrtc {self.id}")

    async def answer(self, offer_sdp: str) -> str:
        answer, self.refused_video = await answer_offer(
            self.pc, offer_sdp, self.track, self._hosts, f"webrtc {self.id}"
        )
        for _ in self.refused_video:
            self._cameras.on_refused(UNSUPPORTED_CODEC)
        return answer

    # --- reply audio ---

    def play(self, response_id: str, pcm: np.ndarray) -> None:
        self.output.play(response_id, pcm)

    def end_audio(self, response_id: str) -> None:
        self.output.end(response_id)
        if self.output.played_ms(response_id) is None:  # nothing of it queued: nothing will finish
            self.call.audio_cleared(response_id, None)

    def clear_audio(self, response_id: str) -> None:
        played_ms = self.output.played_ms(response_id)
        self.output.clear(response_id)
        self.call.audio_cleared(response_id, played_ms)

    def use_input_format(self, input_format: AudioFormat) -> None:
        """Nothing to do: the microphone is encoded in the session's format of the moment (:meth:`_microphone`)."""

    def _playback_finished(self, response_id: str) -> None:
        self.call.playback_finished(response_id)

    # --- the data channel ---

    def channel_ready(self) -> bool:
        return self.channel is not None and self.channel.open

    async def send_text(self, text: str) -> None:
        if self.channel is None or not self.channel.send(text):
            raise TransportClosed("the data channel is closed")

    def close_channel(self) -> None:
        if self.channel is not None:
            self.channel.close()

    # --- the peer connection's events (realtime.transports.peer.PeerEvents) ---

    def data_channel(self, channel: RTCDataChannel) -> None:
        call = self.call
        self.channel = EventsChannel(
            channel, on_message=call.client_message, on_close=call.client_gone, on_busy=call.channel_busy
        )
        self.channel.when_open(call.channel_open)

    def remote_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            pump = self._microphone(track)
        elif track.kind == "video":
            pump = self._camera_feed(track)
        else:
            pump = discard(track)
        self.call.spawn(pump, f"{track.kind} track")

    def connection_state(self, state: str) -> None:
        if state == "connected":
            self.call.media_connected()
        elif state in ("failed", "closed"):
            self.call.client_gone()

    async def close(self) -> None:
        """Stop the reply track, drop its audio and close the peer connection."""
        self.track.stop()
        self.output.clear_all()
        try:
            await self.pc.close()
        except Exception:  # the peer is gone either way; the call must still be forgotten
            logger.exception("webrtc %s: closing the peer connection failed", self.id)

    async def _microphone(self, track: MediaStreamTrack) -> None:
        """Feed the browser's microphone to the call until the track ends. Audio it cannot convert ends the call: a
        session that silently stopped hearing its user is worse."""
        encoder = MicrophoneEncoder()
        call = self.call
        while True:
            try:
                frame = cast(AudioFrame, await track.recv())  # an audio track's frames
            except MediaStreamError:
                return
            fmt = call.session_input_format
            try:
                data = encoder.encode(frame_to_mono(frame), frame.sample_rate, fmt)
            except ValueError:
                logger.exception("webrtc %s: unusable microphone audio: ending the call", self.id)
                call.client_gone()
                return
            call.microphone(data, fmt, frame.pts, frame.sample_rate)

    async def _camera_feed(self, track: MediaStreamTrack) -> None:
        """Feed the browser's camera to the user's spoken messages until the track ends."""
        cameras, label = self._cameras, f"webrtc {self.id}"
        frames = MessageFrames(self.call.runner, count=cameras.on_frame, label=label)
        feed = CameraFeed(cameras.vision, cameras.settings, kept=frames.offer, count=cameras.on_frame, label=label)
        await feed.run(track)


class InProcessCall(Call[InProcessMedia]):
    """A call whose media run in this process; its peer connection, reply track and audio queue are its media's."""

    @property
    def pc(self) -> RTCPeerConnection:
        return self.media.pc

    @property
    def track(self) -> PacedAudioTrack:
        return self.media.track

    @property
    def output(self) -> OutputAudioQueue:
        return self.media.output

    @property
    def refused_video(self) -> tuple[SetAside, ...]:
        return self.media.refused_video


class InProcessMediaHost:
    """Makes the calls whose media run in this process (:class:`InProcessMedia`, answered with ``hosts``, cameras
    taken as ``cameras`` says)."""

    def __init__(self, *, hosts: tuple[IceHostAddress, ...], cameras: CallCameras) -> None:
        self._hosts = hosts
        self._cameras = cameras
        self._peers: weakref.WeakSet[RTCPeerConnection] = weakref.WeakSet()
        self._ids = itertools.count(1)

    @property
    def open_peers(self) -> int:
        """Peer connections made here that are not closed (a call being answered included); zero when no call is
        live, else one leaked."""
        return sum(1 for pc in self._peers if pc.connectionState != "closed")

    async def new_call(
        self,
        dialect: Dialect,
        make_runner: Callable[[Transport, MediaSink], SessionRunner],
        *,
        gate: MessageGate | None,
        slot: SessionSlot,
        on_input_delay: Callable[[float], None] | None,
    ) -> InProcessCall:
        """A call with its peer connection, not answered yet; on failure its peer connection is closed."""
        sctp_teardown.install()
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self._peers.add(pc)
        call_id = f"rtc_{next(self._ids)}"
        media = InProcessMedia(call_id, pc, hosts=self._hosts, cameras=self._cameras)
        try:
            return InProcessCall(
                call_id, media, dialect, make_runner, gate=gate, slot=slot, on_input_delay=on_input_delay
            )
        except BaseException:
            await pc.close()
            raise

    async def start(self) -> None:
        """Nothing to start: the media run in this process."""

    async def close(self) -> None:
        """Nothing to stop (the calls' teardown closed their peer connections)."""

"""A call's media in the server's process: its aiortc ``RTCPeerConnection`` on the server's event loop.

:class:`InProcessMedia` answers the offer once every ICE candidate is gathered (aiortc has no trickle ICE),
announcing only the configured host addresses and using no STUN server; it decodes the microphone (Opus → s16 stereo
48 kHz → the session's input format, :class:`~realtime.transports.media.MicrophoneEncoder`), plays the reply audio on
the outgoing :class:`~realtime.transports.media.PacedAudioTrack`, and carries the ``oai-events`` data channel. A
camera track feeds the user's spoken messages (:mod:`realtime.media.video`); an offered video track this server cannot
decode is rejected in the answer (:mod:`realtime.transports.video_codecs`) and the call goes on without it.
:class:`InProcessMediaHost` makes the calls whose media run here and counts their open peer connections.
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

from pipeline.api import VisionInfo
from realtime.media.video import CameraFeed
from realtime.media.video_settings import CameraSettings
from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.names import Dialect
from realtime.runner import MediaSink, SessionRunner, Transport, TransportClosed
from realtime.server.limits import MessageGate, SessionSlot
from realtime.transports import sctp_teardown
from realtime.transports.media import MicrophoneEncoder, OutputAudioQueue, PacedAudioTrack, frame_to_mono
from realtime.transports.peer import (
    CHANNEL_HIGH_WATER,
    CHANNEL_LOW_WATER,
    OAI_EVENTS_LABEL,
    IceHostAddress,
    accept_offer,
    announce_host_addresses,
    sends_opus,
)
from realtime.transports.video_codecs import SetAside, reject_in_answer, set_aside_undecodable_video
from realtime.transports.webrtc.call import Call

logger = logging.getLogger(__name__)


class InProcessMedia:
    """A :class:`~.call.CallMedia` on peer connection ``pc`` of this process (module docstring). ``hosts``: the ICE
    host candidates to announce (empty: aioice's choice); ``camera``, ``vision``, ``on_camera_frame(outcome)``: how a
    camera track is sampled, by which vision encoder, and counted; ``on_camera_refused(reason)``: each video track
    refused in the answer."""

    def __init__(
        self,
        call_id: str,
        pc: RTCPeerConnection,
        *,
        hosts: tuple[IceHostAddress, ...],
        camera: CameraSettings,
        vision: VisionInfo | None,
        on_camera_frame: Callable[[str], None],
        on_camera_refused: Callable[[str], None],
    ) -> None:
        self.id = call_id
        self.pc = pc
        self.output = OutputAudioQueue()
        self.track = PacedAudioTrack(self.output, self._playback_finished)
        self.channel: RTCDataChannel | None = None
        self.refused_video: tuple[SetAside, ...] = ()
        """The offer's video sections refused for their codecs (rejected in the answer)."""
        self._hosts = hosts
        self._camera = camera
        self._vision = vision
        self._on_camera_frame = on_camera_frame
        self._on_camera_refused = on_camera_refused
        self._call: Call | None = None
        self._busy = False

    @property
    def call(self) -> Call:
        assert self._call is not None, "attach() comes first"
        return self._call

    def attach(self, call: Call) -> None:
        # The handlers must exist before the offer is set: aiortc announces the browser's tracks while it applies it.
        self._call = call
        self._watch()

    async def answer(self, offer_sdp: str) -> str:
        offer_sdp, self.refused_video = set_aside_undecodable_video(offer_sdp)
        for section in self.refused_video:
            logger.warning(
                "webrtc %s: refusing the offer's video track (mid %s): it offers %s, this server decodes VP8 and "
                "H.264; the call goes on without video",
                self.id,
                section.mid,
                ", ".join(section.codecs) or "no codec",
            )
            self._on_camera_refused("unsupported_codec")
        pc = self.pc
        await accept_offer(pc, offer_sdp)
        pc.addTrack(self.track)
        if self._hosts:
            await announce_host_addresses(pc, self._hosts)
        await pc.setLocalDescription(await pc.createAnswer())
        if sends_opus(pc.localDescription.sdp):
            self.track.send_opus()  # encoded by the track: aiortc then only packetizes
        return reject_in_answer(pc.localDescription.sdp, self.refused_video)

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
        return self.channel is not None and self.channel.readyState == "open"

    async def send_text(self, text: str) -> None:
        channel = self.channel
        if channel is None or channel.readyState != "open":
            raise TransportClosed("the data channel is closed")
        channel.send(text)
        if not self._busy and channel.bufferedAmount > CHANNEL_HIGH_WATER:
            self._busy = True
            self.call.channel_busy(True)

    def close_channel(self) -> None:
        channel = self.channel
        if channel is None or channel.readyState in ("closing", "closed"):
            return
        # Closing a channel sends an SCTP reset; over a dead DTLS transport (the peer vanished) aiortc's task for it
        # fails unobserved. The peer connection's close ends it then.
        if channel.transport.transport.state == "connected":
            channel.close()

    def _attach_channel(self, channel: RTCDataChannel) -> None:
        call = self.call
        self.channel = channel
        channel.bufferedAmountLowThreshold = CHANNEL_LOW_WATER
        channel.on("message", call.client_message)
        channel.on("close", call.client_gone)
        channel.on("bufferedamountlow", self._drained)
        if channel.readyState == "open":
            call.channel_open()
        else:
            channel.on("open", call.channel_open)

    def _drained(self) -> None:
        if self._busy:
            self._busy = False
            self.call.channel_busy(False)

    # --- the peer connection ---

    async def close(self) -> None:
        """Stop the reply track, drop its audio and close the peer connection."""
        self.track.stop()
        self.output.clear_all()
        try:
            await self.pc.close()
        except Exception:  # the peer is gone either way; the call must still be forgotten
            logger.exception("webrtc %s: closing the peer connection failed", self.id)

    def _watch(self) -> None:
        pc = self.pc
        call = self.call

        @pc.on("datachannel")
        def on_datachannel(channel: RTCDataChannel) -> None:
            if channel.label != OAI_EVENTS_LABEL or self.channel is not None:
                logger.info("webrtc %s: ignoring data channel %r", self.id, channel.label)
                return
            self._attach_channel(channel)

        @pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "audio":
                pump = self._microphone(track)
            elif track.kind == "video":
                pump = self._camera_feed(track)
            else:
                pump = discard(track)
            call.spawn(pump, f"{track.kind} track")

        @pc.on("connectionstatechange")
        def on_state() -> None:
            state = pc.connectionState
            logger.info("webrtc %s: connection %s", self.id, state)
            if state == "connected":
                call.media_connected()
            elif state in ("failed", "closed"):
                call.client_gone()

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
        """Feed the browser's camera to the user's spoken messages (:mod:`realtime.media.video`) until the track
        ends."""
        feed = CameraFeed(self.call.runner, self._vision, self._camera, count=self._on_camera_frame, label=self.id)
        await feed.run(track)


async def discard(track: MediaStreamTrack) -> None:
    """Consume a track the call has no use for, so aiortc does not queue its frames."""
    while True:
        try:
            await track.recv()
        except MediaStreamError:
            return


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
    """Makes the calls whose media run in this process (:class:`InProcessMedia`, answered with ``hosts``; camera
    arguments as there)."""

    def __init__(
        self,
        *,
        hosts: tuple[IceHostAddress, ...],
        camera: CameraSettings,
        vision: VisionInfo | None,
        on_camera_frame: Callable[[str], None],
        on_camera_refused: Callable[[str], None],
    ) -> None:
        self._hosts = hosts
        self._camera = camera
        self._vision = vision
        self._on_camera_frame = on_camera_frame
        self._on_camera_refused = on_camera_refused
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
        media = InProcessMedia(
            call_id,
            pc,
            hosts=self._hosts,
            camera=self._camera,
            vision=self._vision,
            on_camera_frame=self._on_camera_frame,
            on_camera_refused=self._on_camera_refused,
        )
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

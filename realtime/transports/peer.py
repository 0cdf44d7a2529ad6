"""The peer-connection half of a WebRTC call that does not depend on the session: answering an offer with aiortc.

Shared by the in-process media (:mod:`realtime.transports.webrtc.in_process`) and the media workers
(:mod:`realtime.transports.media_workers`), so it imports neither the session nor the engine (a media worker process
must start without torch):

- :class:`IceHostAddress` and :func:`announce_host_addresses`: which host candidates an answer offers;
- :func:`accept_offer`: set the browser's offer, checking it brings an audio track and the data channel, and give
  its microphone the server's short receive buffer (:mod:`realtime.transports.receive_buffer`);
- :func:`sends_opus`: whether an answer sends Opus (the reply track then encodes its own packets);
- :func:`answer_offer`: all of a call's answer: video it cannot decode refused (:mod:`.video_codecs`), the offer
  accepted, the reply track added, the host candidates announced, Opus encoded by the track when the answer sends it;
- :func:`watch_peer` (:class:`PeerEvents`) and :class:`EventsChannel`: a call's peer-connection events and its
  ``oai-events`` data channel with the busy/drained reports;
- :func:`discard`: read a track nobody uses, so aiortc does not queue its frames.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from aiortc import RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcicetransport import RTCIceGatherer
from aiortc.sdp import SessionDescription

from realtime.errors import RealtimeError
from realtime.protocol.codes import ErrorCode
from realtime.transports.media import PacedAudioTrack
from realtime.transports.receive_buffer import SERVER_AUDIO_HOLD_PACKETS, hold_audio
from realtime.transports.video_codecs import SetAside, reject_in_answer, set_aside_undecodable_video

logger = logging.getLogger(__name__)

OAI_EVENTS_LABEL = "oai-events"
"""Label of the data channel that carries the JSON events (OpenAI's name)."""
CHANNEL_HIGH_WATER = 1 << 20
"""Bytes unsent on the data channel above which the call's server events wait for the peer to catch up."""
CHANNEL_LOW_WATER = 1 << 18
"""Bytes unsent on the data channel below which they go on."""

# --- ICE host candidates -------------------------------------------------------------------------


def _ice_gatherers(pc: RTCPeerConnection) -> Iterator[RTCIceGatherer]:
    seen: set[int] = set()
    transports = [t.receiver.transport for t in pc.getTransceivers()]
    if pc.sctp is not None:
        transports.append(pc.sctp.transport)
    for dtls in transports:
        gatherer = dtls.transport.iceGatherer
        if id(gatherer) not in seen:
            seen.add(id(gatherer))
            yield gatherer


@dataclass(frozen=True)
class IceHostAddress:
    """A host candidate to offer: UDP bound on ``bind`` (a local address, or ``0.0.0.0`` / ``::``),
    announced as ``announce``, which differs from ``bind`` behind a 1:1 NAT (a cloud VM's public
    address), as mediasoup's ``announcedIp`` or LiveKit's ``node_ip`` do."""

    bind: str
    announce: str

    @classmethod
    def parse(cls, spec: str) -> IceHostAddress:
        """``"ADDRESS"`` (bind and announce it) or ``"ANNOUNCED@BIND"``; raises ``ValueError``."""
        announce, at, bind = spec.partition("@")
        bind = bind if at else announce
        for part in (announce, bind):
            try:
                ipaddress.ip_address(part)
            except ValueError:
                raise ValueError(f"ICE host address {spec!r}: {part!r} is not an IP address") from None
        if ipaddress.ip_address(announce).version != ipaddress.ip_address(bind).version:
            raise ValueError(f"ICE host address {spec!r}: announced and bound addresses differ in IP version")
        return cls(bind=bind, announce=announce)


async def announce_host_addresses(pc: RTCPeerConnection, addresses: Sequence[IceHostAddress]) -> None:
    """Make ``pc`` offer host candidates on exactly ``addresses``, and no other candidate.

    aioice lists the machine's interfaces itself and skips loopback, and aiortc has no option to
    choose them, so this gathers the candidates beforehand; the gathering that
    ``setLocalDescription`` starts then finds them done. Call it after the transports exist
    (after ``setRemoteDescription`` for an answer, after adding transceivers / the data channel
    for an offer) and before ``setLocalDescription``. This reaches into aioice's ``Connection``
    (private attributes, aioice 0.9–0.13); the tests check the resulting SDP, so a change there
    fails loudly. Raises ``OSError`` when none of the addresses can be bound."""
    for gatherer in _ice_gatherers(pc):
        connection = gatherer._connection
        if connection._local_candidates_start:
            continue  # already gathered (a bundled transport seen twice)
        connection._local_candidates_start = True
        for component in sorted(connection._components):
            candidates = []
            for address in addresses:
                bound = await connection.get_component_candidates(component=component, addresses=[address.bind])
                for candidate in bound:
                    candidate.host = address.announce  # what the SDP offers; the socket stays bound on `bind`
                candidates += bound
            if not candidates:
                raise OSError(f"no ICE host candidate could be bound on {[a.bind for a in addresses]}")
            connection._local_candidates += candidates
        connection._local_candidates_end = True


# --- offer and answer -----------------------------------------------------------------------


def sends_opus(answer_sdp: str) -> bool:
    """Whether the answer's audio section sends Opus: its first codec, the one aiortc's sender uses."""
    audio = [m for m in SessionDescription.parse(answer_sdp).media if m.kind == "audio"]
    return bool(audio and audio[0].rtp.codecs and audio[0].rtp.codecs[0].mimeType.lower() == "audio/opus")


async def accept_offer(pc: RTCPeerConnection, offer_sdp: str) -> None:
    """Set the remote offer; it must bring an audio track and a data channel. The audio it receives is then held
    :data:`~realtime.transports.receive_buffer.SERVER_AUDIO_HOLD_PACKETS` packets before decoding (none), not
    aiortc's four."""
    if "m=" not in offer_sdp:
        raise RealtimeError("the request body is not an SDP offer", code=ErrorCode.INVALID_VALUE, param="sdp")
    try:
        await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
    except (ValueError, TypeError, KeyError) as exc:  # aiortc's parse/validation errors
        raise RealtimeError(f"invalid SDP offer: {exc}", code=ErrorCode.INVALID_VALUE, param="sdp") from None
    if not any(t.kind == "audio" for t in pc.getTransceivers()):
        raise RealtimeError("the SDP offer has no audio track", code=ErrorCode.INVALID_VALUE, param="sdp")
    if pc.sctp is None:
        raise RealtimeError(
            f"the SDP offer has no data channel (create one named {OAI_EVENTS_LABEL!r})",
            code=ErrorCode.INVALID_VALUE,
            param="sdp",
        )
    hold_audio(pc, SERVER_AUDIO_HOLD_PACKETS)


async def answer_offer(
    pc: RTCPeerConnection, offer_sdp: str, track: PacedAudioTrack, hosts: Sequence[IceHostAddress], label: str
) -> tuple[str, tuple[SetAside, ...]]:
    """Answer a call's offer on ``pc`` (handlers already set: :func:`watch_peer`), once every ICE candidate is
    gathered (aiortc has no trickle ICE): video sections in codecs aiortc cannot decode are set aside (logged under
    ``label``) and rejected in the answer, the rest of the offer accepted (:func:`accept_offer`), ``track`` sends the
    reply audio (encoding its own Opus packets when the answer sends Opus), and the host candidates are ``hosts``
    (empty: aioice's choice). Returns the answer SDP and the refused video sections. Raises as :func:`accept_offer`."""
    offer_sdp, refused = set_aside_undecodable_video(offer_sdp)
    for section in refused:
        logger.warning(
            "%s: refusing the offer's video track (mid %s): it offers %s, this server decodes VP8 and H.264; the call "
            "goes on without video",
            label,
            section.mid,
            ", ".join(section.codecs) or "no codec",
        )
    await accept_offer(pc, offer_sdp)
    pc.addTrack(track)
    if hosts:
        await announce_host_addresses(pc, hosts)
    await pc.setLocalDescription(await pc.createAnswer())
    if sends_opus(pc.localDescription.sdp):
        track.send_opus()  # encoded by the track: aiortc then only packetizes
    return reject_in_answer(pc.localDescription.sdp, refused), refused


# --- the peer connection's events ---------------------------------------------------------------


class PeerEvents(Protocol):
    """What a call's media do with their peer connection's events (:func:`watch_peer`); on the event loop."""

    def data_channel(self, channel: RTCDataChannel) -> None:
        """The client's ``oai-events`` data channel (once a call)."""
        ...

    def remote_track(self, track: MediaStreamTrack) -> None:
        """A track the client sends: ``audio`` its microphone, ``video`` its camera."""
        ...

    def connection_state(self, state: str) -> None:
        """The connection's new state (``RTCPeerConnection.connectionState``)."""
        ...


def watch_peer(pc: RTCPeerConnection, events: PeerEvents, label: str) -> None:
    """Send ``pc``'s events to ``events`` from now on. Call it before the offer is set: aiortc announces the client's
    tracks while it applies it. A data channel other than the first ``oai-events`` one is ignored (logged)."""
    chosen = False

    @pc.on("datachannel")
    def on_datachannel(channel: RTCDataChannel) -> None:
        nonlocal chosen
        if channel.label != OAI_EVENTS_LABEL or chosen:
            logger.info("%s: ignoring data channel %r", label, channel.label)
            return
        chosen = True
        events.data_channel(channel)

    @pc.on("track")
    def on_track(track: MediaStreamTrack) -> None:
        events.remote_track(track)

    @pc.on("connectionstatechange")
    def on_state() -> None:
        logger.info("%s: connection %s", label, pc.connectionState)
        events.connection_state(pc.connectionState)


class EventsChannel:
    """A call's ``oai-events`` data channel: ``on_message(data)`` for each message the client sends, ``on_close()``
    once it closes; after a :meth:`send` that leaves more than :data:`CHANNEL_HIGH_WATER` bytes unsent,
    ``on_busy(True)``, then ``on_busy(False)`` once they are below :data:`CHANNEL_LOW_WATER`."""

    def __init__(
        self,
        channel: RTCDataChannel,
        *,
        on_message: Callable[[str | bytes], None],
        on_close: Callable[[], None],
        on_busy: Callable[[bool], None],
    ) -> None:
        self.channel = channel
        self._on_busy = on_busy
        self._busy = False
        channel.bufferedAmountLowThreshold = CHANNEL_LOW_WATER
        channel.on("message", on_message)
        channel.on("close", on_close)
        channel.on("bufferedamountlow", self._drained)

    def when_open(self, on_open: Callable[[], None]) -> None:
        """``on_open()`` now if the channel is open, else once it opens."""
        if self.channel.readyState == "open":
            on_open()
        else:
            self.channel.on("open", on_open)

    @property
    def open(self) -> bool:
        return self.channel.readyState == "open"

    def send(self, text: str) -> bool:
        """Send ``text``; False (nothing sent) when the channel is not open."""
        channel = self.channel
        if channel.readyState != "open":
            return False
        channel.send(text)
        if not self._busy and channel.bufferedAmount > CHANNEL_HIGH_WATER:
            self._busy = True
            self._on_busy(True)
        return True

    def close(self) -> None:
        """Close the channel, unless it is closing or closed, or its transport is not connected: closing sends an SCTP
        reset, and over a dead DTLS transport (the peer vanished) aiortc's task for it fails unobserved; the peer
        connection's close ends it then."""
        channel = self.channel
        if channel.readyState in ("closing", "closed"):
            return
        if channel.transport.transport.state == "connected":
            channel.close()

    def _drained(self) -> None:
        if self._busy:
            self._busy = False
            self._on_busy(False)


async def discard(track: MediaStreamTrack) -> None:
    """Consume a track the call has no use for, so aiortc does not queue its frames."""
    while True:
        try:
            await track.recv()
        except MediaStreamError:
            return

"""The peer-connection half of a WebRTC call that does not depend on the session: answering an offer with aiortc.

Shared by the in-process media (:mod:`realtime.transports.webrtc.in_process`) and the media workers
(:mod:`realtime.transports.media_workers`), so it imports neither the session nor the engine (a media worker process
must start without torch):

- :class:`IceHostAddress` and :func:`announce_host_addresses`: which host candidates an answer offers;
- :func:`accept_offer`: set the browser's offer, checking it brings an audio track and the data channel, and give
  its microphone the server's short receive buffer (:mod:`realtime.transports.receive_buffer`);
- :func:`sends_opus`: whether an answer sends Opus (the reply track then encodes its own packets).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.rtcicetransport import RTCIceGatherer
from aiortc.sdp import SessionDescription

from realtime.errors import RealtimeError
from realtime.protocol.codes import ErrorCode
from realtime.transports.receive_buffer import SERVER_AUDIO_HOLD_PACKETS, hold_audio

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

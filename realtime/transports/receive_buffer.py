"""How long received WebRTC audio waits in aiortc's receive buffer before it is decoded.

aiortc's ``RTCRtpReceiver`` reorders incoming RTP packets in a ``JitterBuffer`` and releases a frame only once
``prefetch`` complete frames are in (a frame is complete when a packet of the next frame arrives). For audio it uses
``prefetch=4``: with 20 ms Opus packets, each packet is decoded when the fourth one after it arrives, 80 ms after its
own arrival, whatever the network does. :func:`hold_audio` gives every audio receiver of a peer connection a buffer
that releases a packet once ``packets`` later packets have arrived, reordering packets within that window as
aiortc's does; or, with ``packets`` 0, an :class:`InOrderAudioBuffer` that releases each packet as it arrives.

This replaces a private attribute of aiortc's receiver (aiortc 1.9–1.16); the tests check the resulting delay, so a
change there fails loudly. A receiver without that attribute keeps aiortc's buffer, with a warning.
"""

from __future__ import annotations

import logging

from aiortc import RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.rtp import RtpPacket
from aiortc.utils import uint16_add

logger = logging.getLogger(__name__)

AUDIO_CAPACITY = 16
"""Packets the buffer holds (a power of two, aiortc's own size for audio): a gap this long is given up on."""

SERVER_AUDIO_HOLD_PACKETS = 0
"""The server's microphone receiver: no hold. Its audio feeds voice activity detection and the model, not a
loudspeaker: a packet that arrives is decoded at once, and one that comes after a later one is dropped (the same
20 ms as a lost packet) rather than making every packet wait for it."""

RESTART_PACKETS = 100
"""A packet more than this many sequence numbers behind the last one released is a restarted sequence (a new
sender), not a late packet: the buffer follows it; as many ahead or more is a restart too, not a loss."""


class InOrderAudioBuffer:
    """An audio receive buffer without hold, for receivers whose every RTP packet is one frame (Opus): ``add``
    returns each packet's frame at once. Sequence numbers missing before it are counted ``lost`` and not waited for;
    a packet older than the last one released is dropped and counted ``late`` (its place in the stream has gone), unless
    it is more than :data:`RESTART_PACKETS` behind, which starts the sequence anew. The interface is aiortc's
    ``JitterBuffer.add`` (never asks for a picture loss indication: audio only)."""

    def __init__(self) -> None:
        self._next: int | None = None
        self.lost = 0
        self.late = 0

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        sequence = packet.sequence_number
        if self._next is not None:
            ahead = uint16_add(sequence, -self._next)
            behind = uint16_add(self._next, -sequence)
            if behind and behind <= ahead:  # older than the next expected
                if behind <= RESTART_PACKETS:
                    self.late += 1
                    return False, None
            elif ahead < RESTART_PACKETS:
                self.lost += ahead
        self._next = uint16_add(sequence, 1)
        # aiortc's receiver sets the depacketized payload as ``_data`` on the packet before it reaches the buffer
        return False, JitterFrame(data=packet._data, timestamp=packet.timestamp)  # type: ignore[attr-defined]


_ATTRIBUTE = "_RTCRtpReceiver__jitter_buffer"


def audio_buffer(packets: int) -> JitterBuffer | InOrderAudioBuffer:
    """A receive buffer releasing each audio packet once ``packets`` (0 to :data:`AUDIO_CAPACITY` - 1) later
    packets have arrived; 0: an :class:`InOrderAudioBuffer`."""
    if not 0 <= packets < AUDIO_CAPACITY:
        raise ValueError(f"an audio receive buffer holds 0 to {AUDIO_CAPACITY - 1} packets, got {packets}")
    if packets == 0:
        return InOrderAudioBuffer()
    return JitterBuffer(capacity=AUDIO_CAPACITY, prefetch=packets)


def hold_audio(pc: RTCPeerConnection, packets: int) -> int:
    """Give each audio receiver of ``pc`` a :func:`audio_buffer` of ``packets``; returns how many got one. Call it
    once the transceivers exist and before media flows (before the connection is established)."""
    changed = 0
    for transceiver in pc.getTransceivers():
        if transceiver.kind != "audio":
            continue
        receiver = transceiver.receiver
        if not hasattr(receiver, _ATTRIBUTE):
            logger.warning("aiortc's audio receiver has no %s: its own receive buffer (80 ms) stays", _ATTRIBUTE)
            continue
        setattr(receiver, _ATTRIBUTE, audio_buffer(packets))
        changed += 1
    return changed

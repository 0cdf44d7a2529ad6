"""How long received WebRTC audio waits in aiortc's receive buffer before it is decoded.

aiortc's ``RTCRtpReceiver`` reorders incoming RTP packets in a ``JitterBuffer`` and releases a frame only once
``prefetch`` complete frames are in (a frame is complete when a packet of the next frame arrives). For audio it uses
``prefetch=4``: with 20 ms Opus packets, each packet is decoded when the fourth one after it arrives, 80 ms after its
own arrival, whatever the network does. :func:`hold_audio` gives every audio receiver of a peer connection a buffer
that releases a packet once ``packets`` later packets have arrived (one packet is the least: aiortc's buffer knows a
frame is complete only from the next one). It reorders packets within that window, as aiortc's does.

This replaces a private attribute of aiortc's receiver (aiortc 1.9–1.16); the tests check the resulting delay, so a
change there fails loudly. A receiver without that attribute keeps aiortc's buffer, with a warning.
"""

from __future__ import annotations

import logging

from aiortc import RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer

logger = logging.getLogger(__name__)

AUDIO_CAPACITY = 16
"""Packets the buffer holds (a power of two, aiortc's own size for audio): a gap this long is given up on."""

SERVER_AUDIO_HOLD_PACKETS = 1
"""The server's microphone receiver: the least hold. Its audio feeds voice activity detection and the model, not a
loudspeaker, so a packet is not kept waiting for later ones beyond what reordering needs."""

_ATTRIBUTE = "_RTCRtpReceiver__jitter_buffer"


def audio_buffer(packets: int) -> JitterBuffer:
    """A receive buffer releasing each audio packet once ``packets`` (1 to :data:`AUDIO_CAPACITY` - 1) later
    packets have arrived."""
    if not 1 <= packets < AUDIO_CAPACITY:
        raise ValueError(f"an audio receive buffer holds 1 to {AUDIO_CAPACITY - 1} packets, got {packets}")
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

"""A video section in codecs aiortc cannot decode is set aside before aiortc reads the offer and rejected in the
answer at its place (realtime.transports.video_codecs); the rest of the call is answered as usual."""

from __future__ import annotations

import re

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription, VideoStreamTrack
from aiortc.mediastreams import AudioStreamTrack

from realtime.transports.video_codecs import reject_in_answer, set_aside_undecodable_video

pytestmark = pytest.mark.timeout(30)


async def client_offer() -> str:
    """An aiortc peer's offer: audio, video (VP8 and H.264), a data channel; every candidate gathered."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTrack(AudioStreamTrack())
    pc.addTrack(VideoStreamTrack())
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


def only_vp9(offer: str) -> str:
    """The offer with its video codecs renamed VP9 (and H.264's parameters dropped): a peer that sends VP9 only."""
    offer = re.sub(r"(a=rtpmap:\d+ )(VP8|H264)/90000", r"\1VP9/90000", offer)
    return re.sub(r"a=fmtp:\d+ [^\r\n]*packetization-mode[^\r\n]*\r\n", "", offer)


def mids(sdp: str) -> list[tuple[str, str, str]]:
    """(kind, port, mid) of each media section, in order."""
    sections = sdp.split("\r\nm=")[1:]
    return [(s.split()[0], s.split()[1], re.search(r"a=mid:(\S+)", s)[1]) for s in sections]


def bundle(sdp: str) -> list[str]:
    return re.search(r"a=group:BUNDLE ([^\r\n]*)", sdp)[1].split()


async def answer_through_aiortc(offer: str) -> str:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        kept, aside = set_aside_undecodable_video(offer)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=kept, type="offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        return reject_in_answer(pc.localDescription.sdp, aside)
    finally:
        await pc.close()


async def test_an_offer_with_decodable_video_is_left_alone():
    offer = await client_offer()
    assert set_aside_undecodable_video(offer) == (offer, ())
    assert reject_in_answer("v=0\r\n", ()) == "v=0\r\n"


async def test_a_vp9_only_video_section_is_rejected_at_its_place_and_the_rest_answered():
    offer = only_vp9(await client_offer())
    kept, aside = set_aside_undecodable_video(offer)
    ((index, mid, codecs),) = [(a.index, a.mid, a.codecs) for a in aside]
    assert index == 1 and set(codecs) == {"vp9"} and "m=video" not in kept and mid not in bundle(kept)
    answer = await answer_through_aiortc(offer)
    offered = mids(offer)
    answered = mids(answer)
    assert [(kind, mid) for kind, _, mid in answered] == [(kind, mid) for kind, _, mid in offered]
    assert answered[1] == ("video", "0", mid) and answered[0][1] != "0" and answered[2][1] != "0"
    video = answer.split("\r\nm=video")[1].split("\r\nm=")[0]
    assert "a=inactive" in video and video.split("\r\n")[0].split()[-1] in offer.split("m=video")[1].split()[:4]
    assert bundle(answer) == [m for _, _, m in offered if m != mid]
    assert answer.endswith("\r\n") and "\r\n\r\n" not in answer


async def test_without_the_set_aside_aiortc_refuses_the_whole_offer():
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        with pytest.raises(Exception, match="video"):
            await pc.setRemoteDescription(RTCSessionDescription(sdp=only_vp9(await client_offer()), type="offer"))
    finally:
        await pc.close()


def test_rtx_and_fec_do_not_count_as_codecs_and_a_rejected_section_stays_rejected():
    offer = (
        "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0 1\r\n"
        "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\na=rtpmap:111 opus/48000/2\r\n"
        "m=video 9 UDP/TLS/RTP/SAVPF 45 46 116\r\na=mid:1\r\na=rtpmap:45 AV1/90000\r\na=rtpmap:46 rtx/90000\r\n"
        "a=rtpmap:116 red/90000\r\n"
        "m=video 0 UDP/TLS/RTP/SAVPF 98\r\na=mid:2\r\na=rtpmap:98 AV1/90000\r\n"
    )
    kept, aside = set_aside_undecodable_video(offer)
    assert [(a.index, a.mid, a.payload_type, a.codecs) for a in aside] == [(1, "1", "45", ("av1",))]
    assert "a=group:BUNDLE 0\r\n" in kept and "a=mid:2" in kept  # the section already rejected is left to aiortc

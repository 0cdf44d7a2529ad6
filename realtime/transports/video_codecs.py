"""Video tracks whose codecs the server cannot decode: refused in the SDP answer, the rest of the call kept.

aiortc decodes VP8 and H.264 (:data:`DECODABLE`). Given an offer whose video section lists only other codecs (VP9,
AV1, ...), aiortc refuses the whole offer. :func:`set_aside_undecodable_video` takes such sections out of the offer
before aiortc reads it (and their ids out of its ``BUNDLE`` group); :func:`reject_in_answer` puts each back into
aiortc's answer, at its place, as a rejected section (port 0, ``inactive``; JSEP's way to decline one media section),
and out of the answer's ``BUNDLE`` group. The peer then sends no video; the audio and the data channel go on.

Plain text work on the SDP: no aiortc import, so this is testable alone.
"""

from __future__ import annotations

from dataclasses import dataclass

DECODABLE = frozenset({"vp8", "h264"})
"""Video codecs aiortc decodes (lower-case encoding names)."""

NOT_A_CODEC = frozenset({"rtx", "red", "ulpfec", "flexfec-03"})
"""Encoding names of repair and redundancy formats, which carry another codec's frames."""


@dataclass(frozen=True)
class SetAside:
    """A video section taken out of the offer: its place among the offer's media sections, its ``mid``, its
    transport protocol and first payload type (echoed in the rejected answer section) and its codecs' names."""

    index: int
    mid: str
    proto: str
    payload_type: str
    codecs: tuple[str, ...]


def _sections(sdp: str) -> tuple[str, list[str], list[list[str]]]:
    """(line ending, session lines, one list of lines per media section)."""
    eol = "\r\n" if "\r\n" in sdp else "\n"
    session: list[str] = []
    media: list[list[str]] = []
    for line in sdp.split(eol):
        if line.startswith("m="):
            media.append([line])
        elif media:
            media[-1].append(line)
        else:
            session.append(line)
    return eol, session, media


def _join(eol: str, session: list[str], media: list[list[str]]) -> str:
    lines = session + [line for section in media for line in section]
    while lines and lines[-1] == "":
        lines.pop()
    return eol.join(lines) + eol


def _codecs(section: list[str]) -> tuple[str, ...]:
    names = []
    for line in section:
        if line.startswith("a=rtpmap:"):
            _, _, encoding = line.partition(" ")
            names.append(encoding.split("/", 1)[0].lower())
    return tuple(name for name in names if name not in NOT_A_CODEC)


def _attribute(section: list[str], name: str) -> str | None:
    prefix = f"a={name}:"
    return next((line[len(prefix) :].strip() for line in section if line.startswith(prefix)), None)


def _without_bundled(session: list[str], mids: set[str]) -> list[str]:
    out = []
    for line in session:
        if line.startswith("a=group:BUNDLE"):
            kept = [tag for tag in line.split()[1:] if tag not in mids]
            line = " ".join(["a=group:BUNDLE", *kept])
        out.append(line)
    return out


def set_aside_undecodable_video(offer: str) -> tuple[str, tuple[SetAside, ...]]:
    """The offer without its video sections that list no :data:`DECODABLE` codec, and those sections. An offer
    with none is returned unchanged."""
    eol, session, media = _sections(offer)
    kept: list[list[str]] = []
    aside: list[SetAside] = []
    for index, section in enumerate(media):
        fields = section[0][2:].split()
        mid = _attribute(section, "mid")
        codecs = _codecs(section)
        undecodable = fields[0] == "video" and len(fields) >= 4 and fields[1] != "0" and not DECODABLE & set(codecs)
        if undecodable and mid is not None:
            aside.append(SetAside(index, mid, fields[2], fields[3], codecs))
        else:
            kept.append(section)
    if not aside:
        return offer, ()
    return _join(eol, _without_bundled(session, {a.mid for a in aside}), kept), tuple(aside)


def reject_in_answer(answer: str, aside: tuple[SetAside, ...]) -> str:
    """``answer`` (made for the offer without the ``aside`` sections) with each of them back at its place as a
    rejected section, and out of the ``BUNDLE`` group."""
    if not aside:
        return answer
    eol, session, media = _sections(answer)
    for section in sorted(aside, key=lambda s: s.index):
        rejected = [
            f"m=video 0 {section.proto} {section.payload_type}",
            "c=IN IP4 0.0.0.0",
            f"a=mid:{section.mid}",
            "a=inactive",
        ]
        media.insert(min(section.index, len(media)), rejected)
    return _join(eol, _without_bundled(session, {a.mid for a in aside}), media)

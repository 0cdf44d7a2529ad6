"""Audio of a WebRTC call: microphone frames in, reply audio out on a paced track.

The WebRTC wire carries Opus at 48 kHz in 20 ms frames both ways (aiortc decodes it to s16
stereo frames of 960 samples). This module holds the media half of a call, apart from the peer
connection and signalling (:mod:`realtime.transports.webrtc`, :mod:`realtime.transports.media_workers`):

- :func:`frame_to_mono` and :class:`MicrophoneEncoder`: a received ``av.AudioFrame`` → mono
  float → wire bytes in the session's input format, so the microphone feeds the session exactly
  as ``input_audio_buffer.append`` does over a WebSocket;
- :class:`OutputAudioQueue`: the session's :class:`realtime.runner.MediaSink`; reply audio
  (float32, 24 kHz) resampled to 48 kHz and cut into 20 ms frames, silence when idle; pure logic,
  no clock;
- :class:`PacedAudioTrack`: the outgoing ``MediaStreamTrack`` that pulls one frame from the queue
  per 20 ms of wall clock (pts-paced) and reports when a response's last frame has been sent.
"""

from __future__ import annotations

import asyncio
import fractions
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from realtime.media.audio import ENGINE_OUTPUT_RATE, StreamResampler, encode_audio, float_to_pcm16
from realtime.protocol.audio_format import AudioFormat
from realtime.transports.decimator import Decimator
from realtime.transports.opus_packets import OpusPackets

logger = logging.getLogger(__name__)

TRACK_RATE = 48_000
"""Sample rate (Hz) of WebRTC audio frames (Opus always runs at 48 kHz)."""

FRAME_MS = 20
FRAME_SAMPLES = TRACK_RATE * FRAME_MS // 1000
"""Samples per outgoing frame: 960 (20 ms at 48 kHz, one Opus packet)."""

MAX_LAG_S = 0.1
"""A track that falls this far behind its clock (event loop stalled) skips ahead instead of
bursting the missed frames, which the receiver's jitter buffer would drop anyway."""

_INT_SCALES = {"s16": 32768.0, "s16p": 32768.0, "s32": 2147483648.0, "s32p": 2147483648.0}


# --- input ---------------------------------------------------------------------------------------


def frame_to_mono(frame: av.AudioFrame) -> np.ndarray:
    """A decoded audio frame (any channel count, packed or planar, s16/s32/float) → mono float32
    in [-1, 1] at ``frame.sample_rate``: the mean of the channels."""
    channels = len(frame.layout.channels)
    data = frame.to_ndarray()
    if frame.format.is_planar:
        per_channel = data.reshape(channels, -1)
    else:
        per_channel = data.reshape(-1, channels).T
    mono = per_channel.astype(np.float32).mean(axis=0)
    scale = _INT_SCALES.get(frame.format.name)
    if scale is None and not np.issubdtype(data.dtype, np.floating):
        raise ValueError(f"unsupported audio sample format {frame.format.name!r}")
    return mono / np.float32(scale) if scale else mono


class MicrophoneEncoder:
    """Mono float audio of the microphone (at ``rate`` Hz) → wire bytes in the session's input
    format, streaming.

    The session decides the format (``session.audio.input.format``); a WebRTC client rarely
    changes it, but when it does the resampler restarts for the new rate (dropping the few ms the
    old one held back). A rate that is a whole multiple of the format's (48 kHz Opus to every
    session format) goes through a :class:`~realtime.transports.decimator.Decimator`, which holds
    nothing back: the end of the user's speech reaches the session as soon as its frame arrives."""

    def __init__(self) -> None:
        self._resampler: StreamResampler | Decimator | None = None
        self._key: tuple[int, AudioFormat] | None = None

    def encode(self, mono: np.ndarray, rate: int, fmt: AudioFormat) -> bytes:
        """The next chunk of the signal; with a rate that is not a whole multiple of the format's,
        may return fewer bytes than its share (resampler lag)."""
        if self._key != (rate, fmt):
            self._resampler = _downsampler(rate, fmt.sample_rate)
            self._key = (rate, fmt)
        assert self._resampler is not None
        return encode_audio(self._resampler.process(mono), fmt)


def _downsampler(in_rate: int, out_rate: int) -> StreamResampler | Decimator:
    if in_rate > out_rate and in_rate % out_rate == 0:
        return Decimator(in_rate // out_rate)
    return StreamResampler(in_rate, out_rate)


# --- output --------------------------------------------------------------------------------------


@dataclass
class _Playing:
    """One response's audio waiting to be framed (48 kHz float chunks)."""

    response_id: str
    resampler: StreamResampler
    chunks: deque[np.ndarray] = field(default_factory=deque)
    ended: bool = False
    """No more audio will come (``response.done`` was sent)."""
    played: int = 0
    """Samples handed to the track so far."""

    def take(self, n: int) -> np.ndarray:
        """Up to ``n`` samples from the front."""
        out: list[np.ndarray] = []
        while n > 0 and self.chunks:
            head = self.chunks[0]
            if len(head) <= n:
                out.append(self.chunks.popleft())
                n -= len(head)
            else:
                out.append(head[:n])
                self.chunks[0] = head[n:]
                n = 0
        taken = np.concatenate(out) if out else np.zeros(0, dtype=np.float32)
        self.played += len(taken)
        return taken


@dataclass(frozen=True)
class OutputFrame:
    """One 20 ms frame of the output track and the responses whose last sample it carries."""

    samples: np.ndarray
    """float32, :data:`FRAME_SAMPLES` samples at 48 kHz."""
    finished: tuple[str, ...] = ()
    audible: bool = False
    """Whether any response audio is in the frame (False: pure silence)."""


class FrameSource(Protocol):
    """What a :class:`PacedAudioTrack` plays: :class:`OutputAudioQueue`, or a wrapper of one."""

    def next_frame(self) -> OutputFrame:
        """The next 20 ms frame (silence when nothing is queued); called every 20 ms from the event loop."""
        ...


class OutputAudioQueue:
    """Reply audio waiting for the output track (a :class:`realtime.runner.MediaSink`).

    Responses play one after another in the order their audio arrived. :meth:`play` takes engine
    audio (float32 mono, 24 kHz); :meth:`end` says a response will get no more (its tail is then
    flushed from the resampler); :meth:`clear` drops a response's unplayed audio at once (barge-in,
    ``output_audio_buffer.clear``) and it is never reported finished. :meth:`next_frame` is called
    by the track every 20 ms: it returns the next frame (silence where nothing is queued; an
    underrun of an unfinished response is padded with silence) and the ids of the responses that
    ended and whose last sample is in that frame. Not thread-safe: one event loop."""

    def __init__(self) -> None:
        self._playing: deque[_Playing] = deque()

    @property
    def queued_samples(self) -> int:
        """48 kHz samples waiting (not counting what the resamplers still hold)."""
        return sum(len(c) for p in self._playing for c in p.chunks)

    def response_ids(self) -> tuple[str, ...]:
        return tuple(p.response_id for p in self._playing)

    def played_ms(self, response_id: str) -> float | None:
        """How much of ``response_id`` went out on the track (ms); ``None`` if it is not queued
        (never played, finished, or cleared)."""
        entry = self._find(response_id)
        return None if entry is None else 1000.0 * entry.played / TRACK_RATE

    def play(self, response_id: str, pcm: np.ndarray) -> None:
        entry = self._find(response_id)
        if entry is None:
            entry = _Playing(response_id, StreamResampler(ENGINE_OUTPUT_RATE, TRACK_RATE))
            self._playing.append(entry)
        if entry.ended:
            raise ValueError(f"audio for {response_id} after its end")
        self._append(entry, entry.resampler.process(pcm))

    def end(self, response_id: str) -> None:
        """``response_id`` gets no more audio. Unknown ids (responses without audio, or cleared
        ones) are ignored."""
        entry = self._find(response_id)
        if entry is not None and not entry.ended:
            self._append(entry, entry.resampler.flush())
            entry.ended = True

    def clear(self, response_id: str) -> None:
        entry = self._find(response_id)
        if entry is not None:
            self._playing.remove(entry)

    def clear_all(self) -> None:
        self._playing.clear()

    def next_frame(self) -> OutputFrame:
        parts: list[np.ndarray] = []
        finished: list[str] = []
        need = FRAME_SAMPLES
        while self._playing:
            head = self._playing[0]
            got = head.take(need)
            parts.append(got)
            need -= len(got)
            if head.chunks or not head.ended:
                break  # the frame is full, or the response is still coming (underrun: pad)
            finished.append(self._playing.popleft().response_id)
        audible = need < FRAME_SAMPLES
        if need:
            parts.append(np.zeros(need, dtype=np.float32))
        return OutputFrame(np.concatenate(parts), tuple(finished), audible)

    def _find(self, response_id: str) -> _Playing | None:
        return next((p for p in self._playing if p.response_id == response_id), None)

    @staticmethod
    def _append(entry: _Playing, samples: np.ndarray) -> None:
        if len(samples):
            entry.chunks.append(np.asarray(samples, dtype=np.float32))


class PacedAudioTrack(MediaStreamTrack):
    """The call's outgoing audio: one 20 ms frame of ``queue`` per 20 ms of wall clock.

    ``recv`` (called by aiortc's sender in a loop) sleeps until the frame's presentation time,
    so the track is paced by its pts: frame *k* is due ``k * 20 ms`` after the first. When a frame
    carries the last sample of a response, ``on_finished(response_id)`` is called before the
    frame is returned (the sender encodes and sends it right after). Frames are mono s16; aiortc's
    Opus encoder upmixes them. After :meth:`send_opus` (the call negotiated Opus) the track returns
    Opus packets instead (:class:`~realtime.transports.opus_packets.OpusPackets`), which the sender
    only packetizes."""

    kind = "audio"

    def __init__(self, queue: FrameSource, on_finished: Callable[[str], None]) -> None:
        super().__init__()
        self.queue = queue
        self._on_finished = on_finished
        self._start: float | None = None
        self._pts = 0
        self.frames_sent = 0
        self.audible_frames_sent = 0
        self.opus: OpusPackets | None = None

    def send_opus(self) -> None:
        """Return Opus packets from now on (call it before the sender starts: the negotiated codec must be Opus)."""
        self.opus = OpusPackets()

    async def recv(self) -> av.AudioFrame | av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        await self._wait_for_slot()
        frame = self.queue.next_frame()
        for response_id in frame.finished:
            self._on_finished(response_id)
        self.frames_sent += 1
        self.audible_frames_sent += frame.audible
        if self.opus is not None:
            return self.opus.packet(frame.samples, self._pts, audible=frame.audible)
        return self._av_frame(frame.samples)

    async def _wait_for_slot(self) -> None:
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
            self._pts = 0
            return
        self._pts += FRAME_SAMPLES
        late = loop.time() - (self._start + self._pts / TRACK_RATE)
        if late > MAX_LAG_S:
            skipped = int(late * TRACK_RATE) // FRAME_SAMPLES * FRAME_SAMPLES
            logger.debug("output track %.0f ms behind its clock: skipping ahead", late * 1000)
            self._pts += skipped
        elif late < 0:
            await asyncio.sleep(-late)

    def _av_frame(self, samples: np.ndarray) -> av.AudioFrame:
        pcm = float_to_pcm16(samples).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
        frame.sample_rate = TRACK_RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, TRACK_RATE)
        return frame

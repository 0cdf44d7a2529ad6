"""The browser's side of a WebRTC call, played by aiortc, for the server's WebRTC tests (loopback only)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import soundfile as sf
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from realtime.transports.media import OutputAudioQueue, PacedAudioTrack, frame_to_mono
from realtime.transports.webrtc import IceHostAddress, WebRTCCalls, announce_host_addresses
from tests.helpers.paths import TESTS

SPEECH = TESTS / "fixtures" / "speech"
LOOPBACK = IceHostAddress.parse("127.0.0.1")


def speech(name: str) -> np.ndarray:
    """A spoken fixture: float32 mono 24 kHz."""
    pcm, rate = sf.read(SPEECH / f"{name}.wav", dtype="float32")
    assert rate == 24_000
    return pcm


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if len(x) else 0.0


class ClientPeer:
    """The browser's side of a call: a microphone track, the ``oai-events`` channel, and a
    recorder of the audio received (48 kHz mono frames with their arrival times)."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.mic = OutputAudioQueue()
        self.spoken: list[str] = []
        self.pc.addTrack(PacedAudioTrack(self.mic, self.spoken.append))
        self.channel = self.pc.createDataChannel("oai-events")
        self.events: list[tuple[float, dict]] = []
        self.frames: list[tuple[float, np.ndarray]] = []
        self._read = 0
        self._tasks: set[asyncio.Task] = set()
        self.channel.on("message", lambda m: self.events.append((self._now(), json.loads(m))))
        self.pc.on("track", self._record)

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def _record(self, track) -> None:
        async def read() -> None:
            while True:
                try:
                    frame = await track.recv()
                except MediaStreamError:
                    return
                self.frames.append((self._now(), frame_to_mono(frame)))

        task = asyncio.ensure_future(read())
        self._tasks.add(task)

    async def offer(self) -> str:
        await announce_host_addresses(self.pc, [LOOPBACK])
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def call(self, calls: WebRTCCalls, **kwargs) -> str:
        answer = await calls.create_call(await self.offer(), **kwargs)
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        return answer

    def say(self, name: str) -> None:
        self.mic.play(name, speech(name))
        self.mic.end(name)

    def send(self, event: dict) -> None:
        self.channel.send(json.dumps(event))

    async def wait_for(self, event_type: str, timeout: float = 15.0) -> tuple[float, dict]:
        """The next unread event of ``event_type`` and its arrival time (earlier ones count as read)."""
        deadline = self._now() + timeout
        while True:
            for i in range(self._read, len(self.events)):
                if self.events[i][1]["type"] == event_type:
                    self._read = i + 1
                    return self.events[i]
            if self._now() > deadline:
                raise AssertionError(f"no {event_type} within {timeout} s; got {self.types()}")
            await asyncio.sleep(0.01)

    def types(self) -> list[str]:
        return [e["type"] for _, e in self.events]

    def received(self, start: float, end: float) -> np.ndarray:
        """The audio that arrived between ``start`` and ``end`` (loop time)."""
        parts = [f for t, f in self.frames if start <= t <= end]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    async def close(self) -> None:
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

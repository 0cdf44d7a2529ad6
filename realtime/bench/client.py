"""One simulated user of a realtime server: speaks WAVs in real time, listens, writes down when.

A :class:`SimulatedUser` runs the conversation script of a :class:`UserPlan` over a
:class:`Link` — :class:`WebSocketLink` (``/v1/realtime``, audio as base64 pcm16 deltas) or
:class:`WebRTCLink` (``/v1/realtime/calls``, aiortc, audio on media tracks, events on the
``oai-events`` data channel) — and returns one :class:`realtime.bench.metrics.TurnLog` per turn.

The microphone is always open, as a real one is: 20 ms frames, silence between utterances, paced
by absolute deadlines on the event loop's monotonic clock (frame *k* leaves at ``t0 + (k+1)·20 ms``;
a stall is caught up rather than drifting). Turn detection is the server's VAD. Each turn the user
speaks one file, then waits until the reply has finished *playing* (modelled player:
:func:`realtime.bench.metrics.paced_playback`) before speaking the next one — except on barge-in
turns, where it talks over the reply: the next file starts so that its speech onset comes a fixed time
(``barge_in_after_ms``) after the reply's first sound started playing, while the reply still plays whether or
not its generation has ended (:class:`realtime.bench.metrics.BargeInKind` tells the outcomes apart). A barge-in
turn's own file is cut :data:`BARGE_IN_TAIL_MS` after its speech, so its long trailing silence, still queued on
the microphone, cannot hold the interrupting speech back.

With ``ClientOptions.camera`` each user also shows a camera (:mod:`realtime.bench.camera`): over WebRTC a video
track beside the microphone; over WebSocket one ``input_image`` item at the start of each turn's speech. Such a user
counts the pictures it sent and the image tokens the replies' usage reports (:data:`USAGE_COUNTS`).

With ``ClientOptions.transcription`` each user turns input transcription on (a ``session.update`` with
``audio.input.transcription``, sent when the session starts, before any speech) and counts the transcription
events it receives (:attr:`SimulatedUser.counts`).

Every time is the event loop's clock (``loop.time()``, seconds): arrivals are stamped as the
client reads them, so they include the transport and this process's scheduling.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import enum
import functools
import ipaddress
import json
import logging
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from realtime.bench.camera import CameraOptions
from realtime.bench.metrics import (
    DEFAULT_JITTER_MS,
    SILENCE_THRESHOLD,
    AudioArrival,
    BargeInLog,
    ResponseLog,
    ResponseOutcome,
    TurnLog,
    first_audible,
    first_sound_played_at,
    paced_playback,
)
from realtime.bench.speech import RATE, Speech, without_tail
from realtime.protocol.codes import StatusReason
from realtime.protocol.names import ClientEventType, Dialect, ServerEvent, server_event_name

if TYPE_CHECKING:  # the transports' packages (and the camera's pictures) are imported when needed
    from aiortc import RTCDataChannel
    from websockets.asyncio.client import ClientConnection

    from realtime.bench.camera import CameraPictures
    from realtime.transports.media import OutputFrame

logger = logging.getLogger(__name__)

FRAME_MS = 20
FRAME_SAMPLES = RATE * FRAME_MS // 1000
"""Samples per microphone frame: 480 (20 ms at 24 kHz)."""

BARGE_IN_TAIL_MS = 100.0
"""A barge-in turn's file keeps this much of its silence after the speech end (the open microphone's silence
follows): a long tail still queued on the microphone would delay the interrupting speech."""

REALTIME_PATH = "/v1/realtime"
CALLS_PATH = "/v1/realtime/calls"
EVENTS_CHANNEL = "oai-events"

_WIRE = {server_event_name(e, Dialect.GA): e for e in ServerEvent if server_event_name(e, Dialect.GA)}
"""GA wire name → logical server event (the bench speaks the GA dialect)."""


class ClientTransport(str, enum.Enum):
    """How a simulated user reaches the server (the CLI's ``--transport`` values)."""

    WS = "ws"
    WEBRTC = "webrtc"


class BenchClientError(RuntimeError):
    """A simulated user could not connect or its session failed before any turn."""


@dataclass(frozen=True)
class UserPlan:
    """What one user says: one :class:`Speech` per turn, after ``start_delay_s``. On the turns in
    ``barge_in_turns`` it talks over the reply with the next turn's speech."""

    user: int
    speeches: tuple[Speech, ...]
    start_delay_s: float = 0.0
    barge_in_turns: frozenset[int] = frozenset()


@dataclass(frozen=True)
class ClientOptions:
    transport: ClientTransport = ClientTransport.WS
    api_key: str | None = field(default=None, repr=False)
    barge_in_after_ms: float = 300.0
    """On barge-in turns: the interrupting speech's onset comes this long after the reply's first sound started
    playing at the client (its file starts its leading silence earlier; no earlier than the first sound's
    arrival)."""
    jitter_ms: float = DEFAULT_JITTER_MS
    silence_threshold: int = SILENCE_THRESHOLD
    turn_timeout_s: float = 120.0
    """Longest wait for one reply (generation and playback)."""
    connect_timeout_s: float = 30.0
    transcription: bool = False
    """Turn input audio transcription on in every session (``audio.input.transcription``)."""
    camera: CameraOptions | None = None
    """Show a camera (module docstring); None: none."""
    turn_detection: dict | None = None
    """The session's ``audio.input.turn_detection`` object, sent in a ``session.update`` before any speech; the user
    waits for the server's ``session.updated`` and fails (:class:`BenchClientError`) on an ``error`` instead. None:
    the server's default."""


TRANSCRIPTION_MODEL = "whisper-1"
"""The transcription model a user names (the server echoes it and transcribes with its own model)."""

COUNTED_EVENTS = (
    ServerEvent.INPUT_AUDIO_BUFFER_COMMITTED,
    ServerEvent.INPUT_TRANSCRIPTION_DELTA,
    ServerEvent.INPUT_TRANSCRIPTION_COMPLETED,
    ServerEvent.INPUT_TRANSCRIPTION_FAILED,
)
"""Server events each user counts (by GA wire name): the commits, and the transcription events that answer them."""

PICTURES_SENT = "input_images_sent"
"""Counted: ``input_image`` items the user sent (WebSocket camera)."""
USAGE_IMAGE_TOKENS = "usage_image_tokens"
"""Counted: the sum over replies of ``response.done`` usage ``input_token_details.image_tokens`` (the image and video
positions in each reply's context)."""
USAGE_RESPONSES = "usage_responses"
"""Counted: replies whose ``response.done`` carried usage."""
USAGE_COUNTS = (PICTURES_SENT, USAGE_IMAGE_TOKENS, USAGE_RESPONSES)


# --- the microphone (pure) -----------------------------------------------------------------------


class Microphone:
    """Samples waiting to be "captured", cut into 20 ms frames; silence when nothing waits. No
    clock: the caller decides when a frame is due. Sample *g* of the stream (counted from the first
    frame) is captured at ``t0 + g / RATE``."""

    def __init__(self) -> None:
        self._pending: deque[np.ndarray] = deque()
        self._pending_samples = 0
        self.emitted = 0
        """Samples handed out in frames so far."""

    def queue(self, pcm: np.ndarray) -> int:
        """Queue float32 mono 24 kHz audio; returns the stream index of its first sample."""
        start = self.emitted + self._pending_samples
        if len(pcm):
            self._pending.append(np.asarray(pcm, dtype=np.float32))
            self._pending_samples += len(pcm)
        return start

    def next_frame(self) -> np.ndarray:
        out = np.zeros(FRAME_SAMPLES, dtype=np.float32)
        filled = 0
        while filled < FRAME_SAMPLES and self._pending:
            head = self._pending[0]
            take = min(len(head), FRAME_SAMPLES - filled)
            out[filled : filled + take] = head[:take]
            filled += take
            if take == len(head):
                self._pending.popleft()
            else:
                self._pending[0] = head[take:]
        self._pending_samples -= filled
        self.emitted += FRAME_SAMPLES
        return out


def pcm16_bytes(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


# --- links ---------------------------------------------------------------------------------------


class Listener(Protocol):
    def on_event(self, at: float, event: dict) -> None: ...

    def on_audio(self, at: float, samples: np.ndarray, response_id: str | None) -> None: ...


class Link(Protocol):
    """A connection to the server carrying one session."""

    paced_audio: bool
    output_rate: int

    async def connect(self, listener: Listener) -> None:
        """Open the session; events and audio go to ``listener`` from then on."""
        ...

    async def speak(self, pcm: np.ndarray) -> float:
        """Queue speech (float32 mono 24 kHz) on the microphone; returns the clock time at which
        its first sample is captured."""
        ...

    async def send(self, event: dict) -> None:
        """Send a client event (the session has started)."""
        ...

    async def close(self) -> None: ...


class WebSocketLink:
    """``/v1/realtime`` over a WebSocket, GA dialect; the microphone pump sends one
    ``input_audio_buffer.append`` per 20 ms frame."""

    paced_audio = False
    output_rate = RATE

    def __init__(self, url: str, api_key: str | None = None) -> None:
        self.url = url
        self.api_key = api_key
        self.mic = Microphone()
        self._ws: ClientConnection | None = None
        self._t0 = 0.0
        self._tasks: list[asyncio.Task] = []

    async def connect(self, listener: Listener) -> None:
        import websockets

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        try:
            self._ws = await websockets.connect(self.url, max_size=None, additional_headers=headers)
        except websockets.exceptions.InvalidHandshake as exc:  # refused: HTTP 401/403, not a WebSocket
            raise BenchClientError(f"{self.url} refused the session: {exc}") from exc
        self._t0 = asyncio.get_running_loop().time()
        self._tasks = [
            asyncio.create_task(self._pump(), name="bench microphone"),
            asyncio.create_task(self._read(listener), name="bench reader"),
        ]

    async def speak(self, pcm: np.ndarray) -> float:
        return self._t0 + self.mic.queue(pcm) / RATE

    async def send(self, event: dict) -> None:
        await self._socket().send(json.dumps(event))

    def _socket(self) -> ClientConnection:
        if self._ws is None:
            raise BenchClientError("the client is not connected (connect() first)")
        return self._ws

    async def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        frame = 0
        while True:
            frame += 1
            delay = self._t0 + frame * FRAME_MS / 1000 - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            audio = base64.b64encode(pcm16_bytes(self.mic.next_frame())).decode()
            await self._socket().send(
                json.dumps({"type": ClientEventType.INPUT_AUDIO_BUFFER_APPEND.value, "audio": audio})
            )

    async def _read(self, listener: Listener) -> None:
        loop = asyncio.get_running_loop()
        audio_delta = server_event_name(ServerEvent.AUDIO_DELTA, Dialect.GA)
        async for message in self._socket():
            at = loop.time()
            event = json.loads(message)
            if event.get("type") == audio_delta:
                samples = np.frombuffer(base64.b64decode(event["delta"]), dtype="<i2")
                listener.on_audio(at, samples, event.get("response_id"))
            else:
                listener.on_event(at, event)

    async def close(self) -> None:
        await _cancel(self._tasks)
        if self._ws is not None:
            await self._ws.close()


BROWSER_HOLD_PACKETS = 2
"""Reply packets the WebRTC user's receiver holds before decoding: 40 ms, the middle of what a browser's adaptive
jitter buffer keeps on a clean link (about 20 to 60 ms), rather than aiortc's fixed 80 ms
(:mod:`realtime.transports.receive_buffer`)."""


def import_webrtc() -> None:
    """Import what a WebRTC user needs (aiortc, PyAV, the server's media modules) now. Call it before a process's
    event loop runs its users: imported lazily on the first call instead, these modules (seconds on a loaded host)
    would stall that loop and show as its lag."""
    import aiortc  # noqa: F401

    import realtime.transports.media
    import realtime.transports.receive_buffer
    import realtime.transports.webrtc  # noqa: F401


class WebRTCLink:
    """A WebRTC call (``POST /v1/realtime/calls``) through aiortc: the microphone is a paced
    track, reply audio arrives on the remote track as 48 kHz frames, events on ``oai-events``.
    On a loopback server the peer offers only 127.0.0.1 and uses no STUN server. The reply's
    packets wait :data:`BROWSER_HOLD_PACKETS` in the receiver, as in a browser."""

    paced_audio = True

    def __init__(self, base_url: str, api_key: str | None = None, camera: CameraOptions | None = None) -> None:
        from realtime.transports.media import TRACK_RATE

        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.camera = camera
        self.sends_video = camera is not None
        """A video track goes beside the microphone (the camera needs no pictures over events)."""
        self.output_rate = TRACK_RATE
        self._pc = None
        self._mic: _TimedMicQueue | None = None
        self._spoken = 0
        self._channel: RTCDataChannel | None = None
        self._tasks: list[asyncio.Task] = []

    async def connect(self, listener: Listener) -> None:
        from aiortc import RTCSessionDescription

        self._pc = pc = self._peer(listener)
        host = urllib.parse.urlsplit(self.base_url).hostname or ""
        if _is_loopback(host):
            from realtime.transports.peer import IceHostAddress, announce_host_addresses

            await announce_host_addresses(pc, [IceHostAddress.parse("127.0.0.1")])
        await pc.setLocalDescription(await pc.createOffer())
        answer = await asyncio.to_thread(self._post_offer, pc.localDescription.sdp)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))

    def _peer(self, listener: Listener):
        """The user's peer connection before its offer: microphone (and camera) tracks, the events channel, the
        reply track's reader and receive buffer. Needs a running event loop."""
        from aiortc import RTCConfiguration, RTCPeerConnection

        from realtime.transports.media import PacedAudioTrack
        from realtime.transports.receive_buffer import hold_audio

        loop = asyncio.get_running_loop()
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self._mic = mic = _TimedMicQueue(loop.time)
        pc.addTrack(PacedAudioTrack(mic, lambda _name: None))
        if self.camera is not None:
            from realtime.bench.camera_track import CameraTrack

            pc.addTrack(CameraTrack(self.camera))
        self._channel = channel = pc.createDataChannel(EVENTS_CHANNEL)
        channel.on("message", lambda m: listener.on_event(loop.time(), json.loads(m)))
        pc.on("track", lambda track: self._tasks.append(asyncio.create_task(self._read(track, listener))))
        hold_audio(pc, BROWSER_HOLD_PACKETS)
        return pc

    def _post_offer(self, sdp: str) -> str:
        headers = {"Content-Type": "application/sdp"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.base_url + CALLS_PATH, data=sdp.encode(), headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - the bench's own server URL
            return response.read().decode()

    async def speak(self, pcm: np.ndarray) -> float:
        if self._mic is None:
            raise BenchClientError("the client is not connected (connect() first)")
        self._spoken += 1
        name = f"utterance-{self._spoken}"
        self._mic.play(name, pcm)
        self._mic.end(name)
        return await self._mic.started(name)

    async def send(self, event: dict) -> None:
        if self._channel is None:
            raise BenchClientError("the client is not connected (connect() first)")
        self._channel.send(json.dumps(event))

    async def _read(self, track, listener: Listener) -> None:
        from aiortc.mediastreams import MediaStreamError

        from realtime.transports.media import frame_to_mono

        loop = asyncio.get_running_loop()
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            listener.on_audio(loop.time(), frame_to_mono(frame), None)

    async def close(self) -> None:
        await _cancel(self._tasks)
        if self._pc is not None:
            await self._pc.close()


class _TimedMicQueue:
    """The microphone of a WebRTC user: an :class:`~realtime.transports.media.OutputAudioQueue`
    (the server's own paced-output logic, reused) that notes when each utterance's first sample
    was captured. A frame goes out on the track once all of it is captured, as from a real
    microphone (and as :class:`WebSocketLink` sends it): the first sample of a frame that leaves
    at *t* was captured at *t* − :data:`FRAME_MS`."""

    def __init__(self, clock: Callable[[], float]) -> None:
        from realtime.transports.media import OutputAudioQueue

        self._queue = OutputAudioQueue()
        self._clock = clock
        self._started: dict[str, asyncio.Future] = {}

    def play(self, name: str, pcm: np.ndarray) -> None:
        self._started[name] = asyncio.get_running_loop().create_future()
        self._queue.play(name, pcm)

    def end(self, name: str) -> None:
        self._queue.end(name)

    async def started(self, name: str) -> float:
        return await self._started[name]

    def next_frame(self) -> OutputFrame:
        playing = self._queue.response_ids()
        frame = self._queue.next_frame()
        if frame.audible and playing:
            future = self._started.get(playing[0])
            if future is not None and not future.done():
                future.set_result(self._clock() - FRAME_MS / 1000)
        return frame


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def _cancel(tasks: list[asyncio.Task]) -> None:
    """Cancel ``tasks`` and wait for them; a task that had already failed is logged."""
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for task, result in zip(tasks, results, strict=True):
        if isinstance(result, Exception):
            logger.warning("%s failed: %r", task.get_name(), result)


# --- the user ------------------------------------------------------------------------------------


class SimulatedUser:
    """Runs one :class:`UserPlan` over a :class:`Link` and logs every turn (see the module
    docstring for the script). Events are matched to turns by ``response_id``; WebRTC audio, which
    has none, belongs to the latest response."""

    def __init__(
        self, plan: UserPlan, link: Link, options: ClientOptions, on_turn: Callable[[TurnLog], None] | None = None
    ) -> None:
        self.plan = plan
        self.link = link
        self.options = options
        self.logs: list[TurnLog] = []
        self.errors: list[dict] = []
        self._on_turn = on_turn
        self._responses: dict[str, ResponseLog] = {}
        self._latest: ResponseLog | None = None
        self._interrupted: TurnLog | None = None
        self.session: dict = {}
        """The session as ``session.created`` described it."""
        self.counts: dict[str, int] = {_ga_name(e): 0 for e in COUNTED_EVENTS}
        if options.camera is not None:
            self.counts |= dict.fromkeys(USAGE_COUNTS, 0)
        """How many of each :data:`COUNTED_EVENTS` the user received, by wire name; with a camera also the
        :data:`USAGE_COUNTS`."""
        self._pictures: CameraPictures | None = None
        if options.camera is not None and not getattr(link, "sends_video", False):
            from realtime.bench.camera import CameraPictures

            self._pictures = CameraPictures(options.camera)
        self._picture_tasks: list[asyncio.Task] = []
        """One per turn: sends the turn's picture when its speech starts (cancelled when the user stops)."""
        self._ready = asyncio.Event()
        self._updates = 0
        """``session.updated`` events received."""
        self._progress = asyncio.Event()
        self._voiced: set[str] = set()
        """Responses whose ``response.done`` reported output audio (on WebRTC it may still be on its way)."""

    async def run(self) -> list[TurnLog]:
        """Connect, speak every turn, disconnect. Raises :class:`BenchClientError` when the session
        does not start; a reply that never comes marks its turn timed out and the script goes on."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.options.connect_timeout_s):
                await self.link.connect(self)
                await self._ready.wait()
                if self.options.turn_detection is not None:
                    await self._set_turn_detection(self.options.turn_detection)
                elif self.options.transcription:
                    await self.link.send(_transcription_update())
        except (TimeoutError, OSError) as exc:
            await self.link.close()
            raise BenchClientError(f"user {self.plan.user}: no session ({exc!r})") from exc
        if not self.link.paced_audio and _audio_formats(self.session) != [_PCM24, _PCM24]:
            await self.link.close()
            raise BenchClientError(f"the session's audio formats are {_audio_formats(self.session)}, not 24 kHz pcm")
        try:
            await asyncio.sleep(self.plan.start_delay_s)
            for index, speech in enumerate(self.plan.speeches):
                barge = index in self.plan.barge_in_turns and index + 1 < len(self.plan.speeches)
                # a barge-in turn's file ends soon after its speech, so the next one can start while the reply plays
                turn = await self._speak(index, without_tail(speech, BARGE_IN_TAIL_MS) if barge else speech)
                deadline = loop.time() + self.options.turn_timeout_s
                if barge:
                    heard = await self._until(functools.partial(_heard, turn), deadline)
                    if heard:
                        await self._sleep_until(self._barge_in_start(turn, self.plan.speeches[index + 1]))
                    self._interrupted = turn
                else:
                    heard = await self._until(functools.partial(self._reply_over, turn), deadline)
                    await self._sleep_until(self._playback_end(turn))
                turn.timed_out = not heard
                if self._on_turn is not None:
                    self._on_turn(turn)
            # let the last reply's trailing events (cancelled replies' done) arrive
            await self._until(lambda: all(_settled(t) for t in self.logs), loop.time() + 5.0)
        finally:
            await _cancel(self._picture_tasks)
            await self.link.close()
        return self.logs

    async def _set_turn_detection(self, turn_detection: dict) -> None:
        """Send the session's turn detection (and input transcription, when on) in one ``session.update`` and wait for
        the server's answer; an ``error`` answer raises :class:`BenchClientError`."""
        errors, updates = len(self.errors), self._updates
        audio_input: dict = {"turn_detection": turn_detection}
        if self.options.transcription:
            audio_input["transcription"] = {"model": TRANSCRIPTION_MODEL}
        await self.link.send(
            {
                "type": ClientEventType.SESSION_UPDATE.value,
                "session": {"type": "realtime", "audio": {"input": audio_input}},
            }
        )
        loop = asyncio.get_running_loop()
        answered = await self._until(
            lambda: self._updates > updates or len(self.errors) > errors, loop.time() + self.options.connect_timeout_s
        )
        if not answered or len(self.errors) > errors:
            await self.link.close()
            why = f"refused it: {self.errors[errors]}" if answered else "did not answer"
            raise BenchClientError(f"user {self.plan.user}: turn_detection {turn_detection}: the server {why}")

    async def _speak(self, index: int, speech: Speech) -> TurnLog:
        start = await self.link.speak(speech.pcm)
        turn = TurnLog(
            user=self.plan.user,
            turn=index,
            wav=speech.name,
            speech_start_at=start + speech.speech_start_ms / 1000,
            speech_end_at=start + speech.speech_end_ms / 1000,
            sample_rate=self.link.output_rate,
            paced_audio=self.link.paced_audio,
        )
        if self._pictures is not None:
            show = self._show_picture(self._pictures, turn.speech_start_at)
            task = asyncio.create_task(show, name=f"bench picture {index}")
            self._picture_tasks.append(task)
        if self._interrupted is not None and self._interrupted.barge_in is None:
            self._interrupted.barge_in = BargeInLog(onset_at=turn.speech_start_at)
        self.logs.append(turn)
        return turn

    async def _show_picture(self, pictures: CameraPictures, when: float) -> None:
        """Send the next camera picture at ``when`` (the loop's clock): the start of a turn's speech."""
        await self._sleep_until(when)
        await self.link.send(pictures.next_item())
        self.counts[PICTURES_SENT] += 1

    def _reply_over(self, turn: TurnLog) -> bool:
        """The reply is generated, and on WebRTC its output has stopped playing on the track (a reply with audio,
        seen on the track or counted in ``response.done``'s usage: a fast engine's reply can be done before its first
        frame arrives)."""
        response = turn.response
        if response is None or not _answered(turn):
            return False
        voiced = bool(response.audio) or response.response_id in self._voiced
        return not self.link.paced_audio or not voiced or response.output_stopped_at is not None

    def _barge_in_start(self, turn: TurnLog, speech: Speech) -> float:
        """When to start ``speech`` so that its onset comes ``barge_in_after_ms`` into the reply's playback."""
        response = turn.response
        assert response is not None
        rate, jitter_s = self.link.output_rate, self.options.jitter_ms / 1000
        sound = first_sound_played_at(response.audio, rate, jitter_s, paced=self.link.paced_audio)
        assert sound is not None  # the caller waited for it
        return sound + (self.options.barge_in_after_ms - speech.speech_start_ms) / 1000

    def _playback_end(self, turn: TurnLog) -> float:
        response = turn.response
        if response is None or not response.audio:
            return 0.0
        if self.link.paced_audio:  # the track is the player; its last frames are still in flight
            return (response.output_stopped_at or response.audio[-1].at) + self.options.jitter_ms / 1000
        playback = paced_playback(response.audio, self.link.output_rate, self.options.jitter_ms / 1000)
        return playback.end if playback else 0.0

    async def _until(self, condition: Callable[[], bool], deadline: float) -> bool:
        """Wait (woken by every event) until ``condition()``; False if ``deadline`` came first."""
        loop = asyncio.get_running_loop()
        while not condition():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._progress.wait()
        return True

    @staticmethod
    async def _sleep_until(when: float) -> None:
        delay = when - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)

    # --- Listener ---

    def on_event(self, at: float, event: dict) -> None:
        kind = _WIRE.get(event.get("type"))
        turn = self.logs[-1] if self.logs else None
        if event.get("type") in self.counts:
            self.counts[event["type"]] += 1
        if kind is ServerEvent.SESSION_CREATED:
            self.session = event.get("session", {})
            self._ready.set()
        elif kind is ServerEvent.ERROR:
            self.errors.append(event.get("error", {}))
            logger.warning("user %d: server error %s", self.plan.user, event.get("error"))
        elif kind is ServerEvent.SPEECH_STARTED:
            self._speech_started(at, turn)
        elif kind is ServerEvent.SESSION_UPDATED:
            self.session = event.get("session", {})
            self._updates += 1
        elif turn is not None and kind is ServerEvent.SPEECH_STOPPED:
            turn.speech_stopped_at = at  # the last one wins: it ended the turn that got the reply
            if turn.first_speech_stopped_at is None:
                turn.first_speech_stopped_at = at
        elif turn is not None and kind is ServerEvent.INPUT_AUDIO_BUFFER_COMMITTED:
            turn.committed_at = at
        elif turn is not None and kind is ServerEvent.RESPONSE_CREATED:
            response = ResponseLog(event["response"]["id"], created_at=at)
            self._responses[response.response_id] = self._latest = response
            turn.responses.append(response)
        elif kind is ServerEvent.TRANSCRIPT_DELTA:
            transcribed = self._responses.get(event.get("response_id", ""))
            if transcribed is not None and transcribed.first_transcript_at is None:
                transcribed.first_transcript_at = at
        elif kind is ServerEvent.RESPONSE_DONE:
            self._response_done(at, event["response"])
        elif kind in (ServerEvent.OUTPUT_AUDIO_BUFFER_STOPPED, ServerEvent.OUTPUT_AUDIO_BUFFER_CLEARED):
            stopped = self._responses.get(event.get("response_id", ""))
            if stopped is not None:
                stopped.output_stopped_at = at
                if kind is ServerEvent.OUTPUT_AUDIO_BUFFER_CLEARED:
                    stopped.output_cleared_at = at
        self._progress.set()

    def _speech_started(self, at: float, turn: TurnLog | None) -> None:
        if turn is not None and turn.speech_started_at is None:
            turn.speech_started_at = at
        interrupted = self._interrupted
        if interrupted is not None and interrupted.barge_in is not None and interrupted.barge_in.detected_at is None:
            interrupted.barge_in.detected_at = at

    def _response_done(self, at: float, payload: dict) -> None:
        response = self._responses.get(payload.get("id", ""))
        if response is None:
            return
        response.done_at = at
        usage = payload.get("usage") or {}
        if (usage.get("output_token_details") or {}).get("audio_tokens"):
            self._voiced.add(response.response_id)
        if usage and USAGE_RESPONSES in self.counts:
            self.counts[USAGE_RESPONSES] += 1
            self.counts[USAGE_IMAGE_TOKENS] += int((usage.get("input_token_details") or {}).get("image_tokens") or 0)
        response.status = ResponseOutcome(payload.get("status"))
        response.reason = (payload.get("status_details") or {}).get("reason")

    def on_audio(self, at: float, samples: np.ndarray, response_id: str | None) -> None:
        response = self._responses.get(response_id) if response_id is not None else self._latest
        if response is None:
            return  # WebRTC silence before the first reply
        sound = first_audible(samples, self.options.silence_threshold)
        if self.link.paced_audio and sound is None and not response.audio:
            return  # the idle track's silence before this reply's first sound
        response.audio.append(AudioArrival(at, len(samples), sound))
        self._progress.set()


_PCM24 = {"type": "audio/pcm", "rate": RATE}


def _transcription_update() -> dict:
    audio_input = {"transcription": {"model": TRANSCRIPTION_MODEL}}
    return {
        "type": ClientEventType.SESSION_UPDATE.value,
        "session": {"type": "realtime", "audio": {"input": audio_input}},
    }


def _audio_formats(session: dict) -> list:
    audio = session.get("audio", {})
    return [audio.get(side, {}).get("format") for side in ("input", "output")]


def silence_window_ms(session: dict) -> float | None:
    """The ``server_vad`` silence window of a GA session object (None without server VAD)."""
    detection = session.get("audio", {}).get("input", {}).get("turn_detection") or {}
    value = detection.get("silence_duration_ms")
    return float(value) if value is not None else None


def _ga_name(event: ServerEvent) -> str:
    name = server_event_name(event, Dialect.GA)
    assert name is not None, f"{event} is a GA event"
    return name


def _heard(turn: TurnLog) -> bool:
    return _first_sound_at(turn) is not None


def _first_sound_at(turn: TurnLog) -> float | None:
    response = turn.response
    if response is None:
        return None
    return next((a.at for a in response.audio if a.first_audible is not None), None)


def _answered(turn: TurnLog) -> bool:
    """The turn's reply is done (one cancelled because the VAD split the utterance does not
    count: the user was still speaking, another reply follows)."""
    response = turn.response
    if response is None or response.status is None:
        return False
    return not (response.status is ResponseOutcome.CANCELLED and response.reason == StatusReason.TURN_DETECTED)


def _settled(turn: TurnLog) -> bool:
    return all(r.status is not None for r in turn.responses)


# --- running many users --------------------------------------------------------------------------


def make_link(url: str, options: ClientOptions) -> Link:
    """The link for ``url`` (``http(s)://`` or ``ws(s)://`` base URL of the server)."""
    parts = urllib.parse.urlsplit(url)
    http = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    ws = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    base = f"{parts.netloc}"
    if options.transport is ClientTransport.WEBRTC:
        return WebRTCLink(f"{http}://{base}", options.api_key, options.camera)
    return WebSocketLink(f"{ws}://{base}{REALTIME_PATH}", options.api_key)


@dataclass
class ClientRun:
    """What a group of users observed: every turn (by user, then turn), the server's ``error``
    events, the sessions' VAD silence window (ms), and the :data:`COUNTED_EVENTS` received (summed over users)."""

    logs: list[TurnLog]
    errors: list[dict]
    silence_window_ms: float | None
    counts: dict[str, int] = field(default_factory=dict)
    turn_detection: list[dict | None] = field(default_factory=list)
    """Each user's ``turn_detection`` as the server last described its session (``session.created`` or
    ``session.updated``)."""


async def run_users(
    url: str, plans: list[UserPlan], options: ClientOptions, on_turn: Callable[[TurnLog], None] | None = None
) -> ClientRun:
    """Run every plan concurrently against ``url``. A user whose session never starts raises
    :class:`BenchClientError` after the others are stopped."""
    users = [SimulatedUser(plan, make_link(url, options), options, on_turn) for plan in plans]
    tasks = [asyncio.create_task(user.run(), name=f"bench user {user.plan.user}") for user in users]
    try:
        results = await asyncio.gather(*tasks)
    except BaseException:
        await _cancel(tasks)
        raise
    logs = [log for user_logs in results for log in user_logs]
    errors = [error for user in users for error in user.errors]
    windows = {silence_window_ms(user.session) for user in users}
    counts = {name: sum(user.counts[name] for user in users) for name in users[0].counts} if users else {}
    detection = [user.session.get("audio", {}).get("input", {}).get("turn_detection") for user in users]
    return ClientRun(logs, errors, windows.pop() if len(windows) == 1 else None, counts, detection)

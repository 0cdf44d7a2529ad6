"""A call's media on a media worker process (:mod:`realtime.transports.media_workers`): the server's proxy of them.

The call itself (:class:`~.call.Call`: session runner, transport, reply tracking) stays in the server's process, as
for in-process media; :class:`WorkerMedia` sends its reply audio, play/clear/end controls and server events to the
worker carrying its peer connection, and turns the worker's messages (:mod:`~realtime.transports.media_workers.
messages`) into the call's media events. Server events wait while the worker reports its data channel busy and while
the wire to the worker is over its high-water mark. Ordering: the worker's messages of one call arrive in order, and
a :class:`~realtime.transports.media_workers.messages.ClearAudioMessage` follows every
:class:`~realtime.transports.media_workers.messages.PlayAudioMessage` sent before it on the call's one ordered wire,
so the worker drops the cleared response's audio and nothing else.

The camera: the worker samples the call's video track with the endpoint's :class:`~.camera.CallCameras` settings and
sends the frames it keeps (:class:`~realtime.transports.media_workers.messages.CameraFrame`, RGB at the sampled size);
here they go to the session's spoken messages through :class:`~realtime.media.message_frames.MessageFrames`, as the
in-process media hand theirs, and every frame is counted through ``CallCameras.on_frame`` (the worker's own outcomes
arrive as :class:`~realtime.transports.media_workers.messages.CameraCounts`); video tracks the worker refused for their
codecs are counted through ``CallCameras.on_refused``.

A dead worker ends its calls: each session ends ``FAILED`` with :class:`~.errors.MediaWorkerLost` (the server's
fault), whichever notices first (the pool seeing the worker's wire close, or the session's own send finding the wire
broken); the ``error`` event it can no longer deliver is logged, and its slot freed; the pool restarts the worker.

:class:`MediaWorkerClient` makes the calls placed on a :class:`~realtime.transports.media_workers.pool.
MediaWorkerPool`; :class:`WorkerCalls` is the server's WebRTC endpoint with every call's media on workers.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Callable

import numpy as np

from realtime.media.message_frames import MessageFrames
from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.names import Dialect
from realtime.runner import MediaSink, SessionRunner, Transport, TransportClosed
from realtime.server.limits import MessageGate, SessionSlot
from realtime.transports.media_workers import messages as m
from realtime.transports.media_workers.pool import MediaWorkerPool, NoMediaWorker, WorkerLink
from realtime.transports.webrtc.call import Call
from realtime.transports.webrtc.camera import NO_VISION, UNSUPPORTED_CODEC, CallCameras
from realtime.transports.webrtc.endpoint import WebRTCCalls
from realtime.transports.webrtc.errors import MediaWorkerLost, WebRTCUnavailable, answer_refused

logger = logging.getLogger(__name__)

ANSWER_TIMEOUT_S = 10.0
"""How long a worker may take to answer an offer."""
HANGUP_TIMEOUT_S = 5.0
"""How long teardown waits for the worker to report the peer connection closed."""


class WorkerMedia:
    """A :class:`~.call.CallMedia` on ``worker`` (module docstring), its camera taken as ``cameras`` says.
    ``on_closed()`` runs once :meth:`close` is done (the host then forgets the call)."""

    def __init__(
        self,
        call_id: str,
        worker: WorkerLink,
        on_closed: Callable[[], None] | None = None,
        *,
        cameras: CallCameras = NO_VISION,
    ) -> None:
        self.id = call_id
        self.worker = worker
        self.cameras = cameras
        self._frames: MessageFrames | None = None
        self.answered: asyncio.Future[m.Answered | m.AnswerFailed] = asyncio.get_running_loop().create_future()
        self.ended = asyncio.Event()
        """The worker reported the peer connection closed (or the worker is gone)."""
        self._on_closed = on_closed
        self._call: Call | None = None

    @property
    def call(self) -> Call:
        assert self._call is not None, "attach() comes first"
        return self._call

    def attach(self, call: Call) -> None:
        self._call = call
        self._frames = MessageFrames(call.runner, count=self.cameras.on_frame, label=f"webrtc {self.id}")

    async def answer(self, offer_sdp: str) -> str:
        cameras = self.cameras
        self.worker.send(
            m.Answer(self.id, offer_sdp, self.call.input_format.value, camera=cameras.settings, vision=cameras.vision)
        )
        try:
            result = await asyncio.wait_for(asyncio.shield(self.answered), ANSWER_TIMEOUT_S)
        except TimeoutError:
            raise WebRTCUnavailable(f"the media worker did not answer within {ANSWER_TIMEOUT_S:.0f} s") from None
        if isinstance(result, m.AnswerFailed):
            raise answer_refused(result.message, result.param)
        for _ in range(result.refused_video):
            cameras.on_refused(UNSUPPORTED_CODEC)
        return result.answer_sdp

    # --- to the worker ---

    def play(self, response_id: str, pcm: np.ndarray) -> None:
        self.worker.send(m.PlayAudioMessage(self.id, response_id, np.asarray(pcm, dtype=np.float32)))

    def end_audio(self, response_id: str) -> None:
        self.worker.send(m.EndAudio(self.id, response_id))

    def clear_audio(self, response_id: str) -> None:
        self.worker.send(m.ClearAudioMessage(self.id, response_id))

    def use_input_format(self, input_format: AudioFormat) -> None:
        self.worker.send(m.InputFormat(self.id, input_format.value))

    def channel_ready(self) -> bool:
        """Always: the call sends only after the worker's ``ChannelOpen``, and the worker drops text for a channel
        closed since (the call is ending then)."""
        return True

    async def send_text(self, text: str) -> None:
        self.worker.send(m.ChannelSend(self.id, text))
        try:
            await self.worker.drain()
        except ConnectionError:
            # Only the worker's exit closes its end of the wire: the call ends as the worker's loss, not as the client
            # leaving, even when this send notices before the pool does.
            self.lost()
            raise TransportClosed("the call's media worker is gone") from None

    def close_channel(self) -> None:
        """Nothing here: :meth:`close` hangs up."""

    async def close(self) -> None:
        """Hang up on the worker unless it already ended the call, and wait (at most :data:`HANGUP_TIMEOUT_S`) for it
        to report the peer connection closed."""
        try:
            if not self.ended.is_set():
                self.worker.send(m.Hangup(self.id))
                try:
                    await asyncio.wait_for(self.ended.wait(), HANGUP_TIMEOUT_S)
                except TimeoutError:
                    logger.warning("webrtc %s: the media worker did not confirm the hang-up", self.id)
        finally:
            if self._on_closed is not None:
                self._on_closed()

    # --- from the worker ---

    def receive(self, message: object) -> None:
        """A message from the worker about this call."""
        call = self.call
        if isinstance(message, m.MicAudio):
            call.microphone(message.audio, AudioFormat(message.input_format), message.pts, message.rate)
        elif isinstance(message, m.CameraFrame):
            assert self._frames is not None, "attach() comes first"
            self._frames.offer(message.pixels, message.at)
        elif isinstance(message, m.CameraCounts):
            for outcome, frames in message.outcomes:
                self.cameras.frames(outcome, frames)
        elif isinstance(message, m.ChannelMessage):
            call.client_message(message.data)
        elif isinstance(message, m.ChannelBusy | m.ChannelDrained):
            call.channel_busy(isinstance(message, m.ChannelBusy))
        elif isinstance(message, m.PlaybackFinished):
            call.playback_finished(message.response_id)
        elif isinstance(message, m.AudioCleared):
            call.audio_cleared(message.response_id, message.played_ms)
        elif isinstance(message, m.ChannelOpen):
            call.channel_open()
        elif isinstance(message, m.Connected):
            logger.info("webrtc %s: connected (media worker %d)", self.id, self.worker.index)
            call.media_connected()
        elif isinstance(message, m.Answered | m.AnswerFailed):
            if not self.answered.done():
                self.answered.set_result(message)
        elif isinstance(message, m.CallEnded):
            self.ended_by_worker(message.reason, message.error)
        else:
            raise TypeError(f"unexpected message from a media worker: {message!r}")

    def lost(self) -> None:
        """The worker is gone: the session ends ``FAILED`` with :class:`~.errors.MediaWorkerLost` (module docstring);
        idempotent, and a session already ending keeps its end."""
        self.call.fail(MediaWorkerLost("the media process of this call stopped; start a new call"))
        if not self.ended.is_set():
            self.ended_by_worker("media worker lost")

    def ended_by_worker(self, reason: str, error: str | None = None) -> None:
        """The worker's side of the call is over (or the worker is gone)."""
        if error is not None:
            logger.error("webrtc %s: %s (%s): ending the call", self.id, reason, error)
        else:
            logger.info("webrtc %s: %s", self.id, reason)
        self.ended.set()
        if not self.answered.done():
            self.answered.set_result(m.AnswerFailed(self.id, f"the media worker ended the call: {reason}", None))
        self.call.client_gone()


class RemoteCall(Call[WorkerMedia]):
    """A call whose media run on ``worker``; the worker's messages about it go to :meth:`receive`."""

    def __init__(
        self,
        call_id: str,
        worker: WorkerLink,
        dialect: Dialect,
        make_runner: Callable[[Transport, MediaSink], SessionRunner],
        *,
        gate: MessageGate | None,
        slot: SessionSlot,
        on_input_delay: Callable[[float], None] | None,
        on_closed: Callable[[], None] | None = None,
        cameras: CallCameras = NO_VISION,
    ) -> None:
        media = WorkerMedia(call_id, worker, on_closed, cameras=cameras)
        super().__init__(call_id, media, dialect, make_runner, gate=gate, slot=slot, on_input_delay=on_input_delay)

    @property
    def worker(self) -> WorkerLink:
        return self.media.worker

    def receive(self, message: object) -> None:
        self.media.receive(message)

    def worker_lost(self) -> None:
        self.media.lost()

    def worker_ended(self, reason: str, error: str | None = None) -> None:
        self.media.ended_by_worker(reason, error)


class MediaWorkerClient:
    """Makes the calls whose media run on a pool of ``workers`` media workers, and routes the workers' messages to
    them. ``ice_host_addresses`` as ``ServerConfig.ice_host_addresses``; ``cameras``: how the calls' cameras are
    taken."""

    def __init__(
        self,
        workers: int,
        *,
        ice_host_addresses: tuple[str, ...],
        log_level: int,
        cameras: CallCameras,
    ) -> None:
        self._cameras = cameras
        self.pool = MediaWorkerPool(
            workers,
            ice_host_addresses=ice_host_addresses,
            on_message=self._from_worker,
            on_worker_lost=self._worker_lost,
            log_level=log_level,
        )
        self._calls: dict[str, RemoteCall] = {}  # placed on a worker, until their media are closed
        self._ids = itertools.count(1)

    @property
    def open_peers(self) -> int:
        """The calls whose worker has not reported their peer connection closed."""
        return sum(1 for call in self._calls.values() if not call.media.ended.is_set())

    async def new_call(
        self,
        dialect: Dialect,
        make_runner: Callable[[Transport, MediaSink], SessionRunner],
        *,
        gate: MessageGate | None,
        slot: SessionSlot,
        on_input_delay: Callable[[float], None] | None,
    ) -> RemoteCall:
        """A call placed on a worker, not answered yet; :class:`~.errors.WebRTCUnavailable` when no worker runs."""
        call_id = f"rtc_m{next(self._ids)}"
        try:
            worker = self.pool.place(call_id)
        except NoMediaWorker as exc:
            raise WebRTCUnavailable(f"cannot take calls now: {exc}") from None
        try:
            call = RemoteCall(
                call_id,
                worker,
                dialect,
                make_runner,
                gate=gate,
                slot=slot,
                on_input_delay=on_input_delay,
                on_closed=functools.partial(self._release, call_id),
                cameras=self._cameras,
            )
        except BaseException:
            self.pool.release(worker, call_id)
            raise
        self._calls[call_id] = call
        return call

    def _release(self, call_id: str) -> None:
        call = self._calls.pop(call_id, None)
        if call is not None:
            self.pool.release(call.worker, call_id)

    def _from_worker(self, message: object) -> None:
        call = self._calls.get(getattr(message, "call", ""))
        if call is not None:
            call.receive(message)

    def _worker_lost(self, call_ids: tuple[str, ...]) -> None:
        for call_id in call_ids:
            call = self._calls.get(call_id)
            if call is not None:
                call.worker_lost()

    async def start(self) -> None:
        await self.pool.start()

    async def close(self) -> None:
        await self.pool.close()


class WorkerCalls:
    """The WebRTC endpoint ``local`` (its configuration: slots, session settings, turn detection, gates, observers,
    metrics, connect timeout, ICE hosts, cameras) with every call's media on ``workers`` media worker processes.
    Everything but the placement of the media is ``local``'s."""

    def __init__(self, local: WebRTCCalls, workers: int) -> None:
        self.local = local
        self.media = MediaWorkerClient(
            workers,
            ice_host_addresses=tuple(
                a.announce if a.announce == a.bind else f"{a.announce}@{a.bind}" for a in local.ice_host_addresses
            ),
            log_level=logging.getLogger().getEffectiveLevel(),
            cameras=local.cameras,
        )
        local.place_media_on(self.media)
        self.pool = self.media.pool
        self.max_calls = local.max_calls

    @property
    def calls_started(self) -> int:
        return self.local.calls_started

    @property
    def calls_ended(self) -> int:
        return self.local.calls_ended

    @property
    def live_calls(self) -> int:
        return self.local.live_calls

    @property
    def open_peers(self) -> int:
        return self.local.open_peers

    @property
    def outbound_events(self) -> int:
        return self.local.outbound_events

    def calls(self) -> tuple[Call, ...]:
        return self.local.calls()

    async def start(self) -> None:
        await self.local.start()

    async def create_call(
        self, offer_sdp: str, *, dialect: Dialect = Dialect.GA, session_overrides: dict | None = None
    ) -> str:
        """As :meth:`WebRTCCalls.create_call`; :class:`~.errors.WebRTCUnavailable` also when no media worker runs."""
        return await self.local.create_call(offer_sdp, dialect=dialect, session_overrides=session_overrides)

    async def close(self) -> None:
        """Refuse new calls, end every call, stop the workers."""
        await self.local.close()

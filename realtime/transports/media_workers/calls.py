"""The server's WebRTC endpoint when media runs in worker processes (``serve --media-workers N``, N ≥ 1).

:class:`WorkerCalls` answers ``POST /v1/realtime/calls`` like the in-process
:class:`~realtime.transports.webrtc.WebRTCCalls` (same slots, limits, session settings, turn detection, metrics and
errors), but places each call's peer connection on a media worker (:mod:`.pool`). The call's session runner stays
here: :class:`RemoteCall` is its :class:`~realtime.runner.MediaSink` (reply audio and play/clear/end controls go to
the worker) and :class:`RemoteTransport` its :class:`~realtime.runner.Transport` (the data channel's messages and the
microphone's chunks come from the worker; server events go back to it).

Calls whose offer carries a camera track are answered in-process by the wrapped ``WebRTCCalls`` (camera frames do
not cross to workers).

Bounds: a call's incoming messages wait in a queue of :data:`INCOMING_LIMIT`; when the session falls that far behind
its microphone, the call ends with an ``error`` event (``server_error``) rather than silently losing audio. Server
events wait while the worker reports its data channel busy, or while the wire to the worker is over its high-water
mark; the runner's bounded outbound queue then fills and slows the response (as with a WebSocket). Reply audio is
sent as it is produced, as in-process.

Endings: as in-process (the data channel closes, the connection fails, the session ends, the connect timeout, the
server shuts down), and when the call's worker dies: its session ends ``FAILED`` (:meth:`RemoteCall.worker_lost`,
whether the pool's notice or the session's own send on the broken wire comes first), gets an ``error`` event it can
no longer deliver (logged), and frees its slot; the pool restarts the worker.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
from collections.abc import AsyncIterator, Callable

import numpy as np
from aiortc.sdp import SessionDescription

from realtime.engines.placement import EngineSlot
from realtime.engines.pool import end_on_engine_failure
from realtime.errors import ErrorType, RealtimeError, to_error_payload
from realtime.ids import RandomIds
from realtime.media.audio import StreamResampler, decode_audio, encode_audio
from realtime.observe.error_log import log_error_event
from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.client import InputAudioAppend
from realtime.protocol.codes import ErrorCode
from realtime.protocol.names import Dialect, ServerEvent, server_event_name
from realtime.protocol.server import ServerEvents
from realtime.runner import MediaSink, SessionEnd, SessionRunner, Transport, TransportClosed, session_task_name
from realtime.server.limits import MessageGate, SessionSlot
from realtime.session import ResponsePhase
from realtime.transports.call_lifecycle import CallLifecycle
from realtime.transports.input_delay import InputDelayMeter
from realtime.transports.media_workers import messages as m
from realtime.transports.media_workers.pool import MediaWorkerPool, NoMediaWorker, WorkerLink
from realtime.transports.webrtc import (
    EventObserver,
    WebRTCCalls,
    WebRTCUnavailable,
    _overrides_message,
    truncate_message,
)

logger = logging.getLogger(__name__)

INCOMING_LIMIT = 1000
"""Messages (microphone chunks of 20 ms and data-channel messages) a call's session may fall behind by: 20 s of
audio. Beyond it the call ends with an error."""
ANSWER_TIMEOUT_S = 10.0
"""How long a worker may take to answer an offer."""
HANGUP_TIMEOUT_S = 5.0
"""How long teardown waits for the worker to report the peer connection closed."""


class MediaBacklog(RealtimeError):
    """The session fell too far behind its microphone audio."""

    type = ErrorType.SERVER
    code = ErrorCode.SERVER_ERROR


class MediaWorkerLost(RealtimeError):
    """The media worker carrying the call stopped."""

    type = ErrorType.SERVER
    code = ErrorCode.SERVER_ERROR


class _Refused:
    def __init__(self, error: RealtimeError) -> None:
        self.error = error


class _Truncation:
    """The truncation of a cleared reply, queued among the incoming messages where the clear happened; how much of
    the reply was played (``played_ms``) comes later, from the worker (:class:`~.messages.AudioCleared`)."""

    def __init__(self, item_id: str) -> None:
        self.item_id = item_id
        self.played_ms: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()

    def resolve(self, played_ms: float | None) -> None:
        if not self.played_ms.done():
            self.played_ms.set_result(played_ms)


class RemoteTransport:
    """A call's :class:`~realtime.runner.Transport` over its worker (module docstring): iteration yields the client's
    data-channel messages (through ``gate``; a refused one is answered with an ``error`` event) and the microphone's
    appends, in arrival order, and ends after :meth:`disconnect`.

    A cleared reply's ``conversation.item.truncate`` (:meth:`RemoteCall.clear`) takes its place in that order when
    the reply is cleared, as in-process; iteration waits there until the worker says how much was played, so nothing
    received after the clear (the microphone's end of the interrupting turn, a ``response.create``) reaches the
    session before the truncation: the next reply is generated from what the user heard."""

    _END = object()

    def __init__(self, call: RemoteCall, gate: MessageGate | None, dialect: Dialect) -> None:
        self._call = call
        self._gate = gate
        self._events = ServerEvents(dialect, RandomIds())
        self._incoming: asyncio.Queue = asyncio.Queue(INCOMING_LIMIT + 1)  # + the end marker
        self._open = asyncio.Event()
        self._idle = asyncio.Event()  # the worker's data channel is not busy
        self._idle.set()
        self._gone = asyncio.Event()
        self._overflowed = False

    def opened(self) -> None:
        self._open.set()

    def busy(self, busy: bool) -> None:
        if busy:
            self._idle.clear()
        else:
            self._idle.set()

    def push(self, message: str | bytes | InputAudioAppend | _Refused | _Truncation) -> None:
        """An incoming message; a full queue ends the session with :class:`MediaBacklog` (its ``error`` event is still
        sent, then the call closes) and nothing more is taken."""
        if self._gone.is_set() or self._overflowed:
            return
        if self._incoming.qsize() >= INCOMING_LIMIT:
            self._overflowed = True
            logger.error("webrtc %s: the session is %d messages behind: ending the call", self._call.id, INCOMING_LIMIT)
            self._call.runner.end_for(
                SessionEnd.FAILED, MediaBacklog("the server fell behind on this call's audio; the call ends")
            )
            return
        self._incoming.put_nowait(message)

    def from_client(self, data: str | bytes) -> None:
        refusal = self._gate.check(data) if self._gate is not None else None
        self.push(data if refusal is None else _Refused(refusal))

    def disconnect(self) -> None:
        if not self._gone.is_set():
            self._gone.set()
            self._incoming.put_nowait(self._END)

    async def __aiter__(self) -> AsyncIterator[str | bytes | InputAudioAppend]:
        while True:
            message = await self._incoming.get()
            if message is self._END:
                return
            if isinstance(message, _Refused):
                payload = to_error_payload(message.error)
                log_error_event(payload, session_id=self._call.runner.session.session_id, answers=None)
                await self.send(self._events.error(payload))
                continue
            if isinstance(message, _Truncation):
                await self._wait_until(message.played_ms)
                played_ms = message.played_ms.result() if message.played_ms.done() else None
                if played_ms is not None:  # None: nothing of it was queued, or the call is ending
                    yield truncate_message(message.item_id, int(played_ms))
                continue
            yield message

    async def send(self, event: dict) -> None:
        await self._wait_until(self._open)
        while not self._idle.is_set() and not self._gone.is_set():
            await self._wait_until(self._idle)
        if self._gone.is_set():
            raise TransportClosed("the data channel is closed")
        self._call.sent(event)
        self._call.worker.send(m.ChannelSend(self._call.id, json.dumps(event)))
        try:
            await self._call.worker.drain()
        except ConnectionError:
            # Only the worker's exit closes its end of the wire: the call ends as the worker's loss, not as the client
            # leaving, even when this send notices before the pool does.
            self._call.worker_lost()
            raise TransportClosed("the call's media worker is gone") from None

    async def close(self) -> None:
        self.disconnect()

    async def _wait_until(self, event: asyncio.Event | asyncio.Future) -> None:
        """Wait for ``event`` (set, or done: it is never cancelled here) or for the call to end, whichever comes
        first."""
        if isinstance(event, asyncio.Future):
            if event.done() or self._gone.is_set():
                return
            gone = asyncio.ensure_future(self._gone.wait())
            try:
                await asyncio.wait({event, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
            return
        if event.is_set() or self._gone.is_set():
            return
        waiters = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._gone.wait())}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()


class RemoteCall:
    """One call whose media runs on ``worker``: its session runner, transport and media sink."""

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
    ) -> None:
        self.id = call_id
        self.worker = worker
        self.slot = slot
        self.answer: asyncio.Future[m.Answered | m.AnswerFailed] = asyncio.get_running_loop().create_future()
        self.connected = asyncio.Event()
        self.ended = asyncio.Event()
        """The worker reported the peer connection closed (or the worker is gone)."""
        self.observer: EventObserver | None = None
        self.tasks: set[asyncio.Task] = set()
        self.microphone_chunks = 0
        self._done_type = server_event_name(ServerEvent.RESPONSE_DONE, dialect)
        self._item_added_type = server_event_name(ServerEvent.OUTPUT_ITEM_ADDED, dialect)
        self._items: dict[str, str] = {}  # response id → its assistant item id
        self._truncating: dict[str, _Truncation] = {}  # cleared response id → its truncation, waiting for the worker
        self.transport = RemoteTransport(self, gate, dialect)
        self.runner = make_runner(self.transport, self)
        self.input_format = self.runner.session.config.input_format
        loop = asyncio.get_running_loop()
        self._delay = InputDelayMeter(on_input_delay, loop.time) if on_input_delay is not None else None
        self._converter: tuple[AudioFormat, StreamResampler] | None = None

    def task_name(self, role: str) -> str:
        return session_task_name(self.runner.session.session_id, f"webrtc {self.id} {role}")

    def spawn(self, coro, role: str) -> None:
        task = asyncio.create_task(coro, name=self.task_name(role))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # --- teardown (realtime.transports.call_lifecycle) ---

    def closing(self) -> None:
        """Nothing to mark: the call's state is its worker's."""

    async def close_media(self) -> None:
        """Hang up on the worker unless it already ended the call, and wait (at most :data:`HANGUP_TIMEOUT_S`) for it
        to report the peer connection closed."""
        if self.ended.is_set():
            return
        self.worker.send(m.Hangup(self.id))
        try:
            await asyncio.wait_for(self.ended.wait(), HANGUP_TIMEOUT_S)
        except TimeoutError:
            logger.warning("webrtc %s: the media worker did not confirm the hang-up", self.id)

    # --- the session's MediaSink ---

    def play(self, response_id: str, pcm: np.ndarray) -> None:
        self.worker.send(m.PlayAudio(self.id, response_id, np.asarray(pcm, dtype=np.float32)))

    def clear(self, response_id: str) -> None:
        """Stop ``response_id``'s audio now, and cut the conversation to what was played (as the in-process call
        does; not while the response is still being generated).

        Ordering: :class:`~.messages.ClearAudio` names the response and follows every :class:`~.messages.PlayAudio`
        sent before it on the call's one ordered wire, so the worker drops that response's audio and nothing else
        (a reply started after the clear plays). The truncation is queued among the incoming messages now and
        delivered to the session, before anything received later, once the worker's
        :class:`~.messages.AudioCleared` says how much was played (:class:`RemoteTransport`)."""
        item_id = self._items.pop(response_id, None)
        session = self.runner.session
        generating = session.active_response_id == response_id and session.response_phase is ResponsePhase.IN_PROGRESS
        if item_id is not None and not generating:
            truncation = _Truncation(item_id)
            self._truncating[response_id] = truncation
            self.transport.push(truncation)
        self.worker.send(m.ClearAudio(self.id, response_id))

    # --- events ---

    def sent(self, event: dict) -> None:
        """``event`` is going to the client."""
        if self.observer is not None:
            self.observer(event)
        kind = event.get("type")
        if kind == self._item_added_type:
            self._items[event["response_id"]] = event["item"]["id"]
        elif kind == self._done_type:
            # all the response's audio went to the worker before its response.done
            self.worker.send(m.EndAudio(self.id, event["response"]["id"]))

    def receive(self, message: object) -> None:
        """A message from the worker about this call."""
        if isinstance(message, m.MicAudio):
            self._microphone(message)
        elif isinstance(message, m.ChannelMessage):
            self.transport.from_client(message.data)
        elif isinstance(message, m.ChannelBusy | m.ChannelDrained):
            self.transport.busy(isinstance(message, m.ChannelBusy))
        elif isinstance(message, m.PlaybackFinished):
            self._items.pop(message.response_id, None)
            if not self.ended.is_set():
                self.runner.playback_finished(message.response_id)
        elif isinstance(message, m.AudioCleared):
            self._items.pop(message.response_id, None)
            truncation = self._truncating.pop(message.response_id, None)
            if truncation is not None:
                truncation.resolve(message.played_ms)
        elif isinstance(message, m.ChannelOpen):
            self.transport.opened()
        elif isinstance(message, m.Connected):
            logger.info("webrtc %s: connected (media worker %d)", self.id, self.worker.index)
            self.connected.set()
        elif isinstance(message, m.Answered | m.AnswerFailed):
            if not self.answer.done():
                self.answer.set_result(message)
        elif isinstance(message, m.CallEnded):
            self.worker_ended(message.reason, message.error)
        else:
            raise TypeError(f"unexpected message from a media worker: {message!r}")

    def worker_lost(self) -> None:
        """The call's media worker is gone: the session ends :attr:`~realtime.runner.SessionEnd.FAILED` with
        :class:`MediaWorkerLost` (the server's fault), whichever notices first (the pool seeing the worker's wire
        close, or the session's writer finding it broken); idempotent, and a session already ending keeps its end."""
        self.runner.end_for(
            SessionEnd.FAILED, MediaWorkerLost("the media process of this call stopped; start a new call")
        )
        if not self.ended.is_set():
            self.worker_ended("media worker lost")

    def worker_ended(self, reason: str, error: str | None = None) -> None:
        """The worker's side of the call is over (or the worker is gone)."""
        if error is not None:
            logger.error("webrtc %s: %s (%s): ending the call", self.id, reason, error)
        else:
            logger.info("webrtc %s: %s", self.id, reason)
        self.ended.set()
        if not self.answer.done():
            self.answer.set_result(m.AnswerFailed(self.id, f"the media worker ended the call: {reason}", None))
        self.transport.disconnect()

    def _microphone(self, message: m.MicAudio) -> None:
        self.microphone_chunks += 1
        if self._delay is not None:
            self._delay.frame(message.pts, message.rate)
        fmt = self.runner.session.config.input_format
        audio = message.audio
        if message.input_format != fmt.value:
            audio = self._convert(AudioFormat(message.input_format), fmt, audio)
        if audio:
            self.transport.push(InputAudioAppend(None, audio))

    def _convert(self, sent: AudioFormat, wanted: AudioFormat, audio: bytes) -> bytes:
        """A chunk the worker encoded before it learnt of the session's new input format: re-encoded here, and the
        worker told (the chunks already on their way are converted too)."""
        if self.input_format != wanted:
            self.input_format = wanted
            self.worker.send(m.InputFormat(self.id, wanted.value))
        if self._converter is None or self._converter[0] != sent:
            self._converter = (sent, StreamResampler(sent.sample_rate, wanted.sample_rate))
        return encode_audio(self._converter[1].process(decode_audio(audio, sent)), wanted)


class WorkerCalls:
    """The WebRTC endpoint over a :class:`MediaWorkerPool` of ``workers`` processes (module docstring). ``local``: the
    in-process endpoint whose configuration (slots, session settings, turn detection, gates, observers, metrics,
    connect timeout, ICE hosts) the calls share, and which answers camera calls."""

    def __init__(self, local: WebRTCCalls, workers: int) -> None:
        self.local = local
        self.pool = MediaWorkerPool(
            workers,
            ice_host_addresses=tuple(
                a.announce if a.announce == a.bind else f"{a.announce}@{a.bind}" for a in local.ice_host_addresses
            ),
            on_message=self._from_worker,
            on_worker_lost=self._worker_lost,
            log_level=logging.getLogger().getEffectiveLevel(),
        )
        self.max_calls = local.max_calls
        self._lifecycle: CallLifecycle[RemoteCall] = CallLifecycle(
            local.connect_timeout_s, on_closed=lambda call: self.pool.release(call.worker, call.id)
        )
        self._ids = itertools.count(1)

    @property
    def calls_started(self) -> int:
        return self._lifecycle.calls_started

    @property
    def calls_ended(self) -> int:
        return self._lifecycle.calls_ended

    async def start(self) -> None:
        await self.pool.start()

    @property
    def live_calls(self) -> int:
        return len(self._lifecycle.calls) + self.local.live_calls

    @property
    def open_peers(self) -> int:
        """Peer connections not known closed: the in-process ones, and the workers' calls not reported ended."""
        return self.local.open_peers + sum(1 for call in self._lifecycle.calls.values() if not call.ended.is_set())

    @property
    def outbound_events(self) -> int:
        return self.local.outbound_events + sum(len(call.runner.outbound) for call in self._lifecycle.calls.values())

    def calls(self) -> tuple[RemoteCall, ...]:
        return tuple(self._lifecycle.calls.values())

    async def create_call(
        self, offer_sdp: str, *, dialect: Dialect = Dialect.GA, session_overrides: dict | None = None
    ) -> str:
        """As :meth:`WebRTCCalls.create_call`; :class:`WebRTCUnavailable` also when no media worker runs."""
        if self._lifecycle.closed:
            raise WebRTCUnavailable("the server is shutting down")
        if _has_camera(offer_sdp):
            return await self.local.create_call(offer_sdp, dialect=dialect, session_overrides=session_overrides)
        first_message = _overrides_message(session_overrides)
        slot = self.local.slots.try_acquire()
        if slot is None:
            raise self.local.slots.refusal()
        call: RemoteCall | None = None
        try:
            call = await self._new_call(dialect, slot)
            if first_message is not None:
                call.transport.push(first_message)
            answer = await self._answer(call, offer_sdp)
        except BaseException:
            if call is not None:
                await self._lifecycle.teardown(call)
            else:
                slot.release()
            raise
        call.observer = self.local.new_observer()
        self._lifecycle.serve(call)
        logger.info("webrtc %s: answered by media worker %d", call.id, call.worker.index)
        return answer

    async def _new_call(self, dialect: Dialect, slot: SessionSlot) -> RemoteCall:
        make_runner = await self.local.session_factory(dialect, slot)
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
                gate=self.local.new_gate(),
                slot=slot,
                on_input_delay=self.local.on_input_delay,
            )
        except BaseException:
            self.pool.release(worker, call_id)
            raise
        self._lifecycle.add(call)
        if isinstance(slot, EngineSlot):
            slot.on_engine_failure(functools.partial(end_on_engine_failure, call.runner, slot.index))
        return call

    async def _answer(self, call: RemoteCall, offer_sdp: str) -> str:
        call.worker.send(m.Answer(call.id, offer_sdp, call.input_format.value))
        try:
            result = await asyncio.wait_for(asyncio.shield(call.answer), ANSWER_TIMEOUT_S)
        except TimeoutError:
            raise WebRTCUnavailable(f"the media worker did not answer within {ANSWER_TIMEOUT_S:.0f} s") from None
        if isinstance(result, m.AnswerFailed):
            if result.param is not None:
                raise RealtimeError(result.message, code=ErrorCode.INVALID_VALUE, param=result.param)
            raise WebRTCUnavailable(result.message)
        if self._lifecycle.closed:  # close() ran meanwhile and will not see this call
            raise WebRTCUnavailable("the server is shutting down")
        return result.answer_sdp

    def _from_worker(self, message: object) -> None:
        call = self._lifecycle.calls.get(getattr(message, "call", ""))
        if call is not None:
            call.receive(message)

    def _worker_lost(self, call_ids: tuple[str, ...]) -> None:
        for call_id in call_ids:
            call = self._lifecycle.calls.get(call_id)
            if call is not None:
                call.worker_lost()

    async def close(self) -> None:
        """Refuse new calls, end every call, stop the workers."""
        await self._lifecycle.close()
        await self.local.close()
        await self.pool.close()


def _has_camera(offer_sdp: str) -> bool:
    """Whether the offer brings a video track (an unparsable offer: no; the worker refuses it properly)."""
    try:
        media = SessionDescription.parse(offer_sdp).media
    except (ValueError, TypeError, KeyError, IndexError):
        return False
    return any(section.kind == "video" and section.port != 0 for section in media)

"""The engine core in a child process (the stage config's ``engine.process``).

Why: on a GPU server with many users the engine thread shares the server's GIL with the event loop
(WebSockets, JSON, base64, resampling, a VAD pass per 20 ms frame of every user), and engine steps
stretched to most of a second. Here the child process owns the GPU: it loads the checkpoint itself (from a
picklable :mod:`pipeline.hosting.loaders` recipe), builds the :class:`~pipeline.core.engine_core.EngineCore` and runs
the very
same :class:`~pipeline.hosting.loop.EngineThread` serve loop (commands between steps, the token2wav worker's
wake-up, the high-priority CUDA stream, inference mode). The caller's process keeps the async API and talks
to it over one duplex pipe.

What crosses the pipe (tuples whose first item is a tag; everything pickles):

- parent → child: ``(CALL, call_id, request)`` (answered by one ``RESULT``), ``(POST, request)`` (no answer;
  a failure is logged), ``(ACK, response_id, n)`` (the consumer took ``n`` more events), ``(STOP,)``.
- child → parent: ``(READY, EngineFacts)`` or ``(FAILED, exception)`` once, after loading;
  ``(RESULT, call_id, ok, value or exception)``; ``(EVENT, response_id, ResponseEvent)``;
  ``(LOG, LogRecord)`` (the child's log records, re-emitted by the parent's loggers).

Ordering: the child runs commands in the order the parent sent them, and sends events and results in the
order the engine thread produced them (one sender thread). A call cannot be withdrawn once sent: cancelling
the caller's wait does not stop the command.

Backpressure is credit-based: the child counts, per response, the events it sent minus those the parent
acknowledged; at ``max_pending_events`` it stops stepping that response (its ``can_accept`` is False) until
acks arrive. The parent acknowledges consumed events in batches of ``max_pending_events // 8`` (at least 1),
so the child may overestimate what is pending by less than a batch, never underestimate it.

Failure: if the child dies (killed, crashed, a CUDA error), every pending call fails with
:class:`~pipeline.errors.EngineDeadError`, every live response ends with a failed ``ResponseDone`` carrying
it, and every later call raises it; this process carries on. Errors raised by commands cross intact
(:class:`~pipeline.errors.PipelineError` pickles with its class, message and ``param``); any other exception
becomes an :class:`~pipeline.errors.EngineProcessError` naming its type, its traceback logged by the child.
"""

from __future__ import annotations

import itertools
import logging
import logging.handlers
import multiprocessing
import queue
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING, Any

from pipeline.config import StageGraphConfig
from pipeline.core.commands import StartResponseCommand
from pipeline.core.response_state import ResponseSpec
from pipeline.errors import EngineClosedError, EngineDeadError, EngineProcessError, PipelineError
from pipeline.hosting.loaders import CheckpointLoader
from pipeline.hosting.loop import CoreCall, is_request
from pipeline.response_events import ResponseDone, ResponseEvent, ResponseStatus, Usage

if TYPE_CHECKING:
    from pipeline.core.engine_core import EngineCore
    from pipeline.hosting.loop import EngineFacts, EngineThread

log = logging.getLogger(__name__)

CALL, POST, ACK, STOP = "call", "post", "ack", "stop"
READY, FAILED, RESULT, EVENT, LOG = "ready", "failed", "result", "event", "log"

STOP_TIMEOUT_S = 30.0
"""How long :meth:`EngineProcess.close` waits for the child to finish its shutdown (a running token2wav job,
the last events) before terminating it."""


@dataclass(frozen=True)
class ProcessSpec:
    """Everything the child needs, pickled once at spawn."""

    loader: CheckpointLoader
    cfg: StageGraphConfig
    seed: int | None
    max_pending_events: int
    torch_threads: int
    """The child's torch CPU threads (``torch.set_num_threads``), set before anything loads."""
    log_level: int = logging.WARNING
    """The child's root log level: records at or above it are forwarded to the parent's loggers."""


class AckBatcher:
    """The parent's side of the credits: counts each response's consumed events and says when to acknowledge
    them, in batches of ``max_pending_events // 8`` (at least 1). A batch never exceeds ``max_pending_events``,
    so a paused response is always acknowledged once its consumer has taken everything it was sent. Called
    from the consumers' event loops only; distinct responses touch distinct keys."""

    def __init__(self, max_pending_events: int) -> None:
        self.batch = max(1, max_pending_events // 8)
        self._consumed: dict[str, int] = {}

    def consumed(self, response_id: str, *, done: bool) -> int:
        """The consumer took one more event (``done``: the last one, which needs no ack). Returns how many
        events to acknowledge now (0: none yet)."""
        if done:
            self._consumed.pop(response_id, None)
            return 0
        n = self._consumed.get(response_id, 0) + 1
        if n < self.batch:
            self._consumed[response_id] = n
            return 0
        self._consumed[response_id] = 0
        return n


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "closed its pipe but is still running"
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


# --- the parent side ------------------------------------------------------------------------------------------


class EngineProcess:
    """The engine core in a child process; the same interface as :class:`~pipeline.hosting.loop.EngineThread`
    (``submit`` → future, ``post``, ``consumed``, ``pending``, ``close``, ``closed``).

    The constructor spawns the child and returns once it has loaded the checkpoint and built the core
    (``facts`` then holds what the API needs to know of it); it raises what loading raised in the child, or
    :class:`EngineDeadError` if the child died meanwhile. A reader thread then resolves futures, routes each
    response's events to its sink (called on that thread, in the order the child produced them) and
    re-emits the child's log records."""

    def __init__(self, spec: ProcessSpec, *, start_timeout: float | None = None) -> None:
        self._acks = AckBatcher(spec.max_pending_events)
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited CUDA state or threads
        self._conn, child_conn = context.Pipe(duplex=True)
        self._process = context.Process(
            target=child_main, args=(child_conn, spec), name="omni-engine-core", daemon=True
        )
        self._process.start()
        child_conn.close()  # only the child holds its end now: its death reads as end-of-file here
        self._lock = threading.Lock()
        """Guards the calls, routes and state below against the reader thread."""
        self._reap_lock = threading.Lock()
        """Serializes waiting for, polling and stopping the child (:meth:`_stop_process`): ``multiprocessing`` is not
        safe for two threads at once there. When the child exits, :meth:`close`'s thread and the reader thread
        (:meth:`_on_exit`) both wake; one reaps it (``waitpid``) and the other's ``waitpid`` then fails, which
        ``Process.is_alive`` reads as "still running" until the first has recorded the exit code: a clean exit was
        logged as a child that did not stop, and a signal was sent to its reaped pid."""
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._futures: dict[int, Future] = {}
        self._routes: dict[str, Callable[[ResponseEvent], None]] = {}
        """Response id -> its sink, from the start_response call until its ResponseDone."""
        self._closing = False
        self._error: EngineClosedError | None = None
        try:
            self.facts: EngineFacts = self._wait_ready(start_timeout)
        except BaseException:
            self._stop_process(timeout=5.0)  # a child that failed to load is exiting by itself
            self._conn.close()
            raise
        self._reader = threading.Thread(target=self._read_loop, name="omni-engine-ipc", daemon=True)
        self._reader.start()

    # -- the EngineThread interface --
    @property
    def closed(self) -> bool:
        return self._closing or self._error is not None

    def submit(self, command: CoreCall) -> Future:
        """Send ``command``; its result (or exception) comes back through the future. For ``start_response``
        the spec's sink receives the response's events, on the reader thread."""
        wire, route = self._wire(command)
        fut: Future = Future()
        fut.set_running_or_notify_cancel()  # sent at once and never withdrawn: a cancelled wait leaves it be
        call_id = next(self._ids)
        payload = ForkingPickler.dumps((CALL, call_id, wire))
        with self._lock:
            self._raise_if_closed()
            self._futures[call_id] = fut
            if route is not None:
                self._routes[route[0]] = route[1]
        if route is not None:  # a refused start sends no event: forget its route (runs before anyone else's callback)
            response_id = route[0]

            def forget_if_refused(f: Future) -> None:
                if f.exception() is not None:
                    self._drop_route(response_id)

            fut.add_done_callback(forget_if_refused)
        self._send(payload)
        return fut

    def post(self, command: CoreCall) -> None:
        wire, route = self._wire(command)
        if route is not None:
            raise ValueError("StartResponseCommand must be submitted (its refusal comes back through the future)")
        payload = ForkingPickler.dumps((POST, wire))
        with self._lock:
            self._raise_if_closed()
        self._send(payload)

    def consumed(self, response_id: str, *, done: bool) -> None:
        """Called by the response's consumer for each event it takes (on its event loop's thread)."""
        n = self._acks.consumed(response_id, done=done)
        if n and not self.closed:
            self._send(ForkingPickler.dumps((ACK, response_id, n)))

    @property
    def pid(self) -> int | None:
        """The child's process id."""
        return self._process.pid

    @property
    def exitcode(self) -> int | None:
        """The child's exit status once it ended (negative: killed by that signal), else None."""
        return self._process.exitcode

    def pending(self) -> int:
        """Calls sent and not answered yet (posts are not counted)."""
        return len(self._futures)

    def close(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the child: it runs the commands sent before, ends every response (cancelled, as an engine thread
        does), stops its token2wav worker and exits; after ``timeout`` it is terminated. Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        if self._error is None:
            self._send(ForkingPickler.dumps((STOP,)))
        self._stop_process(timeout)
        self._reader.join(10.0)
        if self._reader.is_alive():
            log.warning("the engine process's reader thread did not stop")
        self._conn.close()

    # -- internals --
    def _wire(self, command: CoreCall) -> tuple[CoreCall, tuple[str, Callable[[ResponseEvent], None]] | None]:
        """What crosses the pipe for ``command``, and the response id and sink to route its events to
        (``StartResponseCommand``)."""
        if not is_request(command):
            raise TypeError(f"an engine core in a child process runs engine requests, not {type(command).__name__}")
        if not isinstance(command, StartResponseCommand):
            return command, None
        if not isinstance(command.spec, ResponseSpec):
            raise TypeError(f"StartResponseCommand takes a ResponseSpec, not {type(command.spec).__name__}")
        return StartResponseCommand(command.spec.detached()), (command.spec.id, command.spec.sink)

    def _raise_if_closed(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closing:
            raise EngineClosedError("the engine is shut down")

    def _send(self, payload) -> None:
        try:
            with self._send_lock:
                self._conn.send_bytes(payload)
        except OSError as exc:  # the child is gone: the reader thread fails whatever waits for it
            log.debug("engine process pipe closed while sending: %s", exc)

    def _drop_route(self, response_id: str) -> None:
        with self._lock:
            self._routes.pop(response_id, None)

    def _wait_ready(self, timeout: float | None) -> EngineFacts:
        while True:
            if not wait([self._conn, self._process.sentinel], timeout):
                raise EngineDeadError(f"the engine process did not start within {timeout:.0f} s")
            if not self._conn.poll():  # only the sentinel: the child exited with nothing more to say
                self._process.join()
                raise EngineDeadError(f"the engine process {describe_exit(self._process.exitcode)} while loading")
            try:
                message = self._conn.recv()
            except EOFError:
                self._process.join(5.0)
                raise EngineDeadError(
                    f"the engine process {describe_exit(self._process.exitcode)} while loading"
                ) from None
            if message[0] == LOG:
                _emit(message[1])
            elif message[0] == READY:
                return message[1]
            elif message[0] == FAILED:
                raise message[1]
            else:
                raise EngineDeadError(f"the engine process sent {message[0]!r} before it was ready")

    def _read_loop(self) -> None:
        while True:
            # the process's sentinel too, not only the pipe's end: a grandchild that inherited the child's end of
            # the pipe (a fork-started worker pool) would keep it open after the child died
            ready = wait([self._conn, self._process.sentinel])
            if self._conn not in ready and not self._conn.poll():
                break  # the child exited and everything it sent has been read
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            except Exception:  # noqa: BLE001 - one message that does not unpickle must not stop the others
                log.exception("a message from the engine process could not be read")
                continue
            try:
                self._dispatch(message)
            except Exception:  # noqa: BLE001 - e.g. a sink whose consumer is gone; the next message still counts
                log.exception("handling %r from the engine process failed", message[0])
        self._on_exit()

    def _dispatch(self, message: tuple) -> None:
        tag = message[0]
        if tag == EVENT:
            _, response_id, event = message
            with self._lock:
                sink = (
                    self._routes.pop(response_id) if isinstance(event, ResponseDone) else self._routes.get(response_id)
                )
            if sink is None:
                log.debug("event for unknown response %s dropped", response_id)
            else:
                sink(event)
        elif tag == RESULT:
            _, call_id, ok, value = message
            with self._lock:
                fut = self._futures.pop(call_id, None)
            if fut is None:
                log.warning("answer to unknown engine call %d dropped", call_id)
            elif ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
        elif tag == LOG:
            _emit(message[1])
        else:
            log.error("unexpected message %r from the engine process", tag)

    def _on_exit(self) -> None:
        """The pipe reached its end: the child exited (or was stopped). Fail whatever still waits."""
        # a child that closed its end but still runs cannot be talked to any more: stopped after 5 s, unannounced
        self._stop_process(timeout=5.0, warn=False)
        with self._lock:
            if self._closing:
                error: EngineClosedError = EngineClosedError("the engine is shut down")
            else:
                error = EngineDeadError(
                    f"the engine process {describe_exit(self._process.exitcode)}; every call "
                    "fails until the engine is restarted"
                )
                log.error("%s", error.message)
            self._error = error
            futures, self._futures = self._futures, {}
        for fut in futures.values():
            try:
                fut.set_exception(error)
            except InvalidStateError:  # answered meanwhile: nothing to fail
                log.debug("engine call answered while failing the pending ones")
        with self._lock:  # after the futures: a refused start_response has dropped its route and failed itself
            routes, self._routes = self._routes, {}
        dead = isinstance(error, EngineDeadError)
        for response_id, sink in routes.items():
            if dead:
                done = ResponseDone(status=ResponseStatus.FAILED, usage=Usage(), reason="error", error=error)
            else:  # stopped before it could end this one itself (close timed out): as an engine thread's close
                done = ResponseDone(status=ResponseStatus.CANCELLED, usage=Usage(), reason="conversation_closed")
            try:
                sink(done)
            except Exception:  # noqa: BLE001 - every other response must still get its ending
                log.exception("ending response %s failed", response_id)

    def _stop_process(self, timeout: float, *, warn: bool = True) -> None:
        """Wait ``timeout`` s for the child to exit, then terminate it (then kill it after 5 s). Any thread."""
        with self._reap_lock:
            self._process.join(timeout)
            if self._process.exitcode is None:
                if warn:
                    log.warning("the engine process did not stop within %.0f s: terminating it", timeout)
                self._process.terminate()
                self._process.join(5.0)
            if self._process.exitcode is None:
                self._process.kill()
                self._process.join()


def _emit(record: logging.LogRecord) -> None:
    """Re-emit a record of the child through this process's logger of the same name (its handlers, levels)."""
    logger = logging.getLogger(record.name)
    if logger.isEnabledFor(record.levelno):
        logger.handle(record)


# --- the child side -------------------------------------------------------------------------------------------


class Outbox:
    """Messages to the parent, pickled and sent by a thread of their own in the order given, so the engine
    thread never waits on the pipe (a parent busy with its event loop reads it late)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="omni-engine-outbox", daemon=True)
        self._thread.start()

    def send(self, message: tuple) -> None:
        self._queue.put(message)

    def close(self) -> None:
        """Send what is queued, then stop."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        broken = False
        while (message := self._queue.get()) is not None:
            if broken:
                continue  # the parent is gone; drain until close
            try:
                payload = ForkingPickler.dumps(message)
            except Exception as exc:  # noqa: BLE001 - answer with what can be sent instead of nothing
                payload = ForkingPickler.dumps(_unpicklable(message, exc))
            try:
                self._conn.send_bytes(payload)
            except OSError:
                broken = True  # the main thread sees the end of the pipe too and stops the engine


def _unpicklable(message: tuple, exc: Exception) -> tuple:
    """A stand-in for a message that does not pickle (a bug: every answer should)."""
    error = EngineProcessError(
        f"the engine's answer could not be sent: {type(exc).__name__}: {exc}", remote_type=type(exc).__qualname__
    )
    if message[0] == RESULT:
        return RESULT, message[1], False, error
    if message[0] == EVENT and isinstance(message[2], ResponseDone):
        return EVENT, message[1], replace(message[2], error=error)
    record = logging.LogRecord(
        __name__, logging.ERROR, __file__, 0, "%s (message %r)", (error.message, message[0]), None
    )
    return LOG, record


def portable(exc: BaseException) -> PipelineError:
    """``exc`` as it can cross the pipe: a PipelineError as is; anything else as an EngineProcessError naming
    its type and message (the child logs its traceback first)."""
    if isinstance(exc, PipelineError):
        return exc
    log.error("engine command raised %s", type(exc).__name__, exc_info=exc)
    return EngineProcessError(f"{type(exc).__name__} in the engine process: {exc}", remote_type=type(exc).__qualname__)


class Credits:
    """Per-response backpressure in the child: events sent minus events the parent acknowledged. Used only on
    the engine thread (acks arrive as posted commands), so it needs no lock."""

    def __init__(self, outbox: Outbox, max_pending: int) -> None:
        self._outbox = outbox
        self._max_pending = max_pending
        self._unacked: dict[str, int] = {}

    def start(self, core: EngineCore, spec: ResponseSpec) -> None:
        """``core.start_response`` with this process's sink and backpressure for the response."""
        self._unacked[spec.id] = 0
        try:
            core.start_response(
                spec.bind(sink=lambda event: self.sink(spec.id, event), can_accept=lambda: self.can_accept(spec.id))
            )
        except BaseException:
            self._unacked.pop(spec.id, None)
            raise

    def sink(self, response_id: str, event: ResponseEvent) -> None:
        if isinstance(event, ResponseDone):
            self._unacked.pop(response_id, None)
        elif response_id in self._unacked:
            self._unacked[response_id] += 1
        self._outbox.send((EVENT, response_id, event))

    def can_accept(self, response_id: str) -> bool:
        return self._unacked.get(response_id, 0) < self._max_pending

    def ack(self, response_id: str, n: int) -> None:
        """The parent's consumer took ``n`` more events (acks of a finished response are ignored)."""
        if response_id in self._unacked:
            self._unacked[response_id] = max(0, self._unacked[response_id] - n)

    def unacked(self, response_id: str) -> int:
        return self._unacked.get(response_id, 0)


class _LogPipe:
    """The queue a :class:`logging.handlers.QueueHandler` writes to: records go to the parent."""

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox

    def put_nowait(self, record: logging.LogRecord) -> None:
        self._outbox.send((LOG, record))


def child_main(conn: Connection, spec: ProcessSpec) -> None:
    """The child process: load, report ready, then serve commands until STOP or the parent's end of the pipe."""
    # Ctrl-C reaches the whole process group; the parent decides when the engine stops (close(): STOP).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch

    torch.set_num_threads(spec.torch_threads)
    device = torch.device(spec.cfg.thinker.device)
    if device.type == "cuda" and device.index is not None:
        # this process's GPU is the thinker's: CUDA state that follows the current device (streams, caching
        # allocator, the random build's kernels) then never lands on GPU 0 when the engine serves another one
        torch.cuda.set_device(device)
    outbox = Outbox(conn)
    root = logging.getLogger()
    # formatted here, pickled without args; QueueHandler only calls put_nowait (typeshed's queue protocol adds get)
    root.handlers[:] = [logging.handlers.QueueHandler(_LogPipe(outbox))]  # type: ignore[arg-type]
    root.setLevel(spec.log_level)
    try:
        from pipeline.core.engine_core import EngineCore
        from pipeline.hosting.loop import EngineFacts, EngineThread

        ckpt = spec.loader.load(spec.cfg)
        core = EngineCore(ckpt, spec.cfg, seed=spec.seed)
        facts = EngineFacts.of(ckpt, spec.cfg)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        outbox.send((FAILED, portable(exc)))
        outbox.close()
        return
    engine = EngineThread(core)
    outbox.send((READY, facts))
    _ChildServer(conn, engine, outbox, Credits(outbox, spec.max_pending_events)).serve()


class _ChildServer:
    """The child's main thread: reads the pipe and hands each command to the engine thread, in order."""

    def __init__(self, conn: Connection, engine: EngineThread, outbox: Outbox, credits: Credits) -> None:
        self._conn = conn
        self._engine = engine
        self._outbox = outbox
        self._credits = credits

    def serve(self) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                log.warning("the engine's parent process is gone: stopping the engine")
                break
            except Exception:  # noqa: BLE001 - a message that does not unpickle: the others still count
                log.exception("a message from the parent could not be read")
                continue
            if message[0] == STOP:
                break
            try:
                self._handle(message)
            except Exception:  # noqa: BLE001 - a malformed message must not stop the engine
                log.exception("handling %r from the parent failed", message[0])
        self._engine.close(timeout=STOP_TIMEOUT_S - 5.0)  # every response ends (cancelled); the worker stops
        self._outbox.close()

    def _handle(self, message: tuple) -> None:
        tag = message[0]
        if tag == CALL:
            _, call_id, command = message
            try:
                runnable = self._runnable(command)
            except TypeError as exc:  # answered, so that the caller's future does not wait forever
                self._outbox.send((RESULT, call_id, False, portable(exc)))
                return
            fut = self._engine.submit(runnable)
            fut.add_done_callback(lambda f: self._answer(call_id, f))
        elif tag == POST:
            self._engine.post(self._runnable(message[1]))
        elif tag == ACK:
            _, response_id, n = message
            self._engine.post(lambda core: self._credits.ack(response_id, n))  # on the engine thread: no lock
        else:
            raise ValueError(f"unknown message {tag!r}")

    def _runnable(self, command: Any) -> CoreCall:
        if not is_request(command):
            raise TypeError(f"expected an engine request, got {type(command).__name__}")
        if isinstance(command, StartResponseCommand):
            return lambda core: self._credits.start(core, command.spec)
        return command

    def _answer(self, call_id: int, fut: Future) -> None:
        """Runs on the engine thread as the command's future resolves."""
        exc = fut.exception()
        if exc is None:
            self._outbox.send((RESULT, call_id, True, fut.result()))
        else:
            self._outbox.send((RESULT, call_id, False, portable(exc)))

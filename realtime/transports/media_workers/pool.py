"""The server's side of the media workers: spawning them, placing calls, and restarting one that died.

Workers are ``multiprocessing`` processes of the *spawn* context (the server holds torch and CUDA, which must not be
forked), each connected by one socket pair (:mod:`.wire`). A call is placed on the live worker with the fewest calls
and stays there for its life. Messages from a worker go to ``on_message(message)`` in arrival order, on the event
loop; its log records are re-logged here under their own logger names; each camera frame is acknowledged to the
worker (:class:`~.messages.CameraTaken`) once ``on_message`` has taken it, which paces the worker's camera frames by
this reader (:mod:`.camera`).

A worker that dies (its wire closes: killed, crashed, or exited) is reported once through
``on_worker_lost(call_ids)`` with the calls it carried, as soon as its reader sees the wire close (before the wire is
closed on this side or the process joined), so their sessions end and free their slots; it is restarted
after :data:`RESTART_DELAY_S`, doubled for each death that follows a short life (:data:`STABLE_AFTER_S`) up to
:data:`MAX_RESTART_DELAY_S`. Meanwhile new calls go to the other workers; with none live, placement raises
:class:`NoMediaWorker`.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess

from realtime.transports.media_workers import messages as m
from realtime.transports.media_workers import worker as worker_module
from realtime.transports.media_workers.wire import Wire

logger = logging.getLogger(__name__)

RESTART_DELAY_S = 0.5
MAX_RESTART_DELAY_S = 30.0
STABLE_AFTER_S = 30.0
"""A worker that lived this long before dying is restarted after :data:`RESTART_DELAY_S` again."""
READY_TIMEOUT_S = 60.0
"""How long a starting worker may take to import and say it is ready."""
JOIN_TIMEOUT_S = 5.0
"""How long :meth:`MediaWorkerPool.close` waits for a worker to exit before killing it."""


class NoMediaWorker(Exception):
    """No media worker is running (all are being restarted, or the pool is closed)."""


class WorkerLink:
    """One worker: its process, its wire and the calls placed on it."""

    def __init__(self, index: int, process: BaseProcess, wire: Wire) -> None:
        self.index = index
        self.process = process
        self.wire = wire
        self.calls: set[str] = set()
        self.started = time.monotonic()
        self.ready = asyncio.Event()
        """The worker said :class:`~.messages.Ready`: calls may be placed on it."""
        self.reader: asyncio.Task | None = None

    @property
    def live(self) -> bool:
        return self.ready.is_set() and not self.wire.closing

    def send(self, message: object) -> None:
        self.wire.send(message)

    async def drain(self) -> None:
        await self.wire.drain()


class MediaWorkerPool:
    """``size`` media workers (module docstring)."""

    def __init__(
        self,
        size: int,
        *,
        ice_host_addresses: tuple[str, ...],
        on_message: Callable[[object], None],
        on_worker_lost: Callable[[tuple[str, ...]], None],
        log_level: int = logging.INFO,
    ) -> None:
        if size < 1:
            raise ValueError(f"a media worker pool needs at least one worker, got {size}")
        self.size = size
        self._ice_host_addresses = ice_host_addresses
        self._on_message = on_message
        self._on_worker_lost = on_worker_lost
        self._log_level = log_level
        self._context = multiprocessing.get_context("spawn")
        self.workers: dict[int, WorkerLink] = {}
        self._delays = dict.fromkeys(range(size), RESTART_DELAY_S)
        self._restarts: set[asyncio.Task] = set()
        self._closed = False
        self.deaths = 0

    async def start(self) -> None:
        """Start every worker and wait until each is ready (they import in parallel); raises ``RuntimeError`` if one
        is not ready within :data:`READY_TIMEOUT_S`."""
        links = [await self._start(index) for index in range(self.size)]
        for link in links:
            await self._until_ready(link)

    async def _until_ready(self, link: WorkerLink) -> None:
        try:
            await asyncio.wait_for(link.ready.wait(), READY_TIMEOUT_S)
        except TimeoutError:
            link.process.kill()  # its reader then sees the wire close: the worker is lost (and restarted)
            raise RuntimeError(f"media worker {link.index} did not start within {READY_TIMEOUT_S:.0f} s") from None

    async def _start(self, index: int) -> WorkerLink:
        parent, child = self._context.Pipe(duplex=True)
        settings = worker_module.WorkerSettings(index, self._ice_host_addresses, self._log_level)
        process = self._context.Process(
            target=worker_module.run, args=(child, settings), name=f"media-worker-{index}", daemon=True
        )
        await asyncio.to_thread(process.start)
        child.close()
        link = WorkerLink(index, process, await Wire.open(parent))
        link.reader = asyncio.create_task(self._read(link), name=f"media worker {index} reader")
        self.workers[index] = link
        return link

    def place(self, call_id: str) -> WorkerLink:
        """The live worker with the fewest calls, now carrying ``call_id``; raises :class:`NoMediaWorker`."""
        live = [w for w in self.workers.values() if w.live]
        if self._closed or not live:
            raise NoMediaWorker("no media worker is running")
        link = min(live, key=lambda w: (len(w.calls), w.index))
        link.calls.add(call_id)
        return link

    def release(self, link: WorkerLink, call_id: str) -> None:
        link.calls.discard(call_id)

    async def _read(self, link: WorkerLink) -> None:
        try:
            while (message := await link.wire.receive()) is not None:
                if isinstance(message, m.Ready):
                    logger.info("media worker %d: ready (process %d)", link.index, message.pid)
                    link.ready.set()
                elif isinstance(message, m.LogRecord):
                    logging.getLogger(message.name).log(
                        message.level, "[media worker %d] %s", link.index, message.message
                    )
                else:
                    self._on_message(message)
                    if isinstance(message, m.CameraFrame):
                        link.send(m.CameraTaken())
        finally:
            await self._lost(link)

    async def _lost(self, link: WorkerLink) -> None:
        calls = tuple(link.calls)
        link.calls.clear()
        if self.workers.get(link.index) is link:
            del self.workers[link.index]
        if not self._closed:
            self.deaths += 1
            if calls:  # at once, before anything here awaits: the calls learn why their wire broke from the pool
                self._on_worker_lost(calls)
        await link.wire.close()
        if self._closed:
            return
        await asyncio.to_thread(link.process.join, JOIN_TIMEOUT_S)
        logger.error(
            "media worker %d (process %d) stopped (exit code %s): ended its %d call(s)",
            link.index,
            link.process.pid,
            link.process.exitcode,
            len(calls),
        )
        lived = time.monotonic() - link.started
        delay = RESTART_DELAY_S if lived >= STABLE_AFTER_S else self._delays[link.index]
        self._delays[link.index] = min(delay * 2, MAX_RESTART_DELAY_S)
        task = asyncio.create_task(self._restart(link.index, delay), name=f"media worker {link.index} restart")
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _restart(self, index: int, delay: float) -> None:
        await asyncio.sleep(delay)
        if self._closed:
            return
        try:
            link = await self._start(index)
        except Exception:
            logger.exception("media worker %d: restart failed; trying again", index)
            task = asyncio.create_task(self._restart(index, MAX_RESTART_DELAY_S), name=f"media worker {index} restart")
            self._restarts.add(task)
            task.add_done_callback(self._restarts.discard)
            return
        try:
            await self._until_ready(link)
        except RuntimeError:
            logger.exception("media worker %d: restart failed", index)  # killed: lost, restarted again

    async def close(self) -> None:
        """Stop every worker: each closes its calls' peer connections and exits (killed after
        :data:`JOIN_TIMEOUT_S`)."""
        self._closed = True
        for task in list(self._restarts):
            task.cancel()
        links = list(self.workers.values())
        for link in links:
            await link.wire.close()
        for link in links:
            if link.reader is not None:
                await asyncio.gather(link.reader, return_exceptions=True)
            await asyncio.to_thread(link.process.join, JOIN_TIMEOUT_S)
            if link.process.exitcode is None:
                logger.warning("media worker %d did not exit: killing it", link.index)
                link.process.kill()
                await asyncio.to_thread(link.process.join, JOIN_TIMEOUT_S)
        self.workers.clear()

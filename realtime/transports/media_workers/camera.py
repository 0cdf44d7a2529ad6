"""A media worker's camera frames on their way to the server: behind the audio, and bounded.

A call's camera is sampled on its worker (:class:`realtime.media.video.CameraFeed`, the rule of the in-process media);
each kept frame (:class:`~.messages.CameraFrame`) crosses the worker's one wire to the server, where the session's
:class:`realtime.media.message_frames.MessageFrames` takes it.

:class:`CameraLane` (one a worker) keeps the frames from crowding the wire. The microphone's chunks and every other
message are written to the wire at once; a camera frame is written only while the camera bytes the server has not yet
read (it answers each frame with :class:`~.messages.CameraTaken` as its reader takes it) are under
:data:`CAMERA_IN_FLIGHT_BYTES`. So a microphone chunk never waits for a camera frame in the worker, has at most that
many camera bytes (or one frame) ahead of it in the socket, and the wire's flow control (which slows the microphone
loop) is never reached by camera frames alone. The frames that must wait queue in the lane, oldest first across calls,
at most :data:`CAMERA_WAITING_PER_CALL` a call: one more drops the call's oldest waiting frame, counted ``overflow``
(a server that reads slowly sees the latest frames, not a backlog). A call's frames still waiting when it ends are let
go uncounted, as a frame held by the session when a call ends.

:class:`CameraTally` collects the outcomes of one call's frames decided on the worker (``skipped``, ``no_vision``,
``invalid``, ``overflow``) and reports them (:class:`~.messages.CameraCounts`) at most every :data:`COUNTS_EVERY_S`,
and when flushed (the track or the call ends), so the server's counters lag by that much at most.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable

from realtime.transports.media_workers import messages as m

CAMERA_IN_FLIGHT_BYTES = 1 << 20
"""Camera bytes sent and not yet read by the server above which further frames wait (one frame always goes)."""
CAMERA_WAITING_PER_CALL = 2
"""Frames of one call that may wait for the wire; a newer one drops the oldest (``overflow``)."""
COUNTS_EVERY_S = 0.5
"""How often at most a call's camera outcomes decided on the worker are reported to the server."""


class CameraLane:
    """The camera frames of one worker's calls on their way to the server (module docstring). ``send(message)``
    writes to the wire; ``on_overflow(call_id)`` is called for each frame dropped waiting. On the worker's event
    loop."""

    def __init__(
        self,
        send: Callable[[object], None],
        on_overflow: Callable[[str], None],
        *,
        in_flight_bytes: int = CAMERA_IN_FLIGHT_BYTES,
        waiting_per_call: int = CAMERA_WAITING_PER_CALL,
    ) -> None:
        if waiting_per_call < 1:
            raise ValueError(f"waiting_per_call must be at least 1, got {waiting_per_call}")
        self._send = send
        self._on_overflow = on_overflow
        self._limit = in_flight_bytes
        self._per_call = waiting_per_call
        self._in_flight: deque[int] = deque()  # the sizes of the frames sent and not yet taken, in order
        self._waiting: deque[m.CameraFrame] = deque()
        self._waiting_by_call: Counter[str] = Counter()

    @property
    def in_flight(self) -> int:
        """Frames sent that the server has not yet read."""
        return len(self._in_flight)

    def waiting(self, call_id: str | None = None) -> int:
        """Frames waiting to be sent (of ``call_id``, or of every call)."""
        return len(self._waiting) if call_id is None else self._waiting_by_call[call_id]

    def put(self, frame: m.CameraFrame) -> None:
        """Send ``frame`` now if there is room on the wire, else queue it (dropping its call's oldest waiting frame
        when the call already has :data:`CAMERA_WAITING_PER_CALL` waiting)."""
        if not self._waiting and self._room():
            self._write(frame)
            return
        if self._waiting_by_call[frame.call] >= self._per_call:
            oldest = next(f for f in self._waiting if f.call == frame.call)
            self._waiting.remove(oldest)
            self._waiting_by_call[frame.call] -= 1
            self._on_overflow(frame.call)
        self._waiting.append(frame)
        self._waiting_by_call[frame.call] += 1

    def taken(self) -> None:
        """The server read the oldest frame in flight (:class:`~.messages.CameraTaken`): send what now has room."""
        if not self._in_flight:
            raise RuntimeError("the server acknowledged a camera frame that was never sent")
        self._in_flight.popleft()
        while self._waiting and self._room():
            frame = self._waiting.popleft()
            self._waiting_by_call[frame.call] -= 1
            self._write(frame)

    def forget(self, call_id: str) -> int:
        """Let go of ``call_id``'s waiting frames (the call ended); returns how many."""
        dropped = self._waiting_by_call.pop(call_id, 0)
        if dropped:
            self._waiting = deque(f for f in self._waiting if f.call != call_id)
        return dropped

    def _room(self) -> bool:
        return sum(self._in_flight) < self._limit

    def _write(self, frame: m.CameraFrame) -> None:
        self._in_flight.append(frame.pixels.nbytes)
        self._send(frame)


class CameraTally:
    """The camera outcomes of call ``call_id`` decided on its worker, reported through ``send`` as
    :class:`~.messages.CameraCounts` (module docstring)."""

    def __init__(
        self, call_id: str, send: Callable[[object], None], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._call = call_id
        self._send = send
        self._clock = clock
        self._counts: Counter[str] = Counter()
        self._reported = clock()

    def count(self, outcome: str) -> None:
        """One frame's outcome; reported with the others once :data:`COUNTS_EVERY_S` passed since the last report."""
        self._counts[outcome] += 1
        if self._clock() - self._reported >= COUNTS_EVERY_S:
            self.flush()

    def flush(self) -> None:
        """Report the outcomes not reported yet, if any."""
        self._reported = self._clock()
        if self._counts:
            self._send(m.CameraCounts(self._call, tuple(sorted(self._counts.items()))))
            self._counts.clear()

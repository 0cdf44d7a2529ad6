"""Where a response's first audio spends its time on the server: one trace per response. Pure (the
runner passes the clock readings in).

A trace holds the moments (``time.monotonic()`` seconds, a host-wide clock, so the engine's own
moments from a child process fit on the same line) of each hop, in the order they happen:

- ``turn_end``: the runner queued the audio commit (the server VAD's ``speech_stopped``, or the
  client's ``input_audio_buffer.commit``); absent for a response to text or to an earlier commit;
- ``requested``: the runner asked the engine for the response (right behind the commit, which it does
  not wait for: the engine runs the two in order);
- ``engine_started``: the engine took it (``StageTimings.started_at_s``);
- ``engine_first_audio``: its first audio chunk left the engine (``token2wav_first_chunk_ms`` later);
- ``received``: the runner got that chunk from the engine's output stream;
- ``sent``: its first audio delta was handed to the transport (WebSocket), or the chunk to the media
  track (WebRTC).

Off that path, ``committed`` is when the engine's answer to the commit (the tail encoded, the item in the
conversation) reached the runner.

A preemptive reply (``ServerConfig.preemptive_response_ms``, :mod:`realtime.session`) is committed and requested at a
pause in the user's speech, so its ``turn_end`` is the pause; ``shown`` (also off the path) is when speech stopped and
its held events went out, and ``sent`` cannot come before it. A withdrawn one is still handed over, marked
``withdrawn``, with whatever hops it reached.

:meth:`FirstAudioTrace.segments` gives the time between consecutive path hops that both happened (ms):
what the engine spent, and what the server path around it (command hand-off, output transport, the
outbound queue) added; plus ``turn_end->committed``, the commit's round trip. The engine's inner
milestones (prefill tail, talker's first code, first chunk's codes) are in the response's ``StageTimings``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.response_events import StageTimings


class Hop(enum.Enum):
    TURN_END = "turn_end"
    COMMITTED = "committed"
    SHOWN = "shown"
    REQUESTED = "requested"
    ENGINE_STARTED = "engine_started"
    ENGINE_FIRST_AUDIO = "engine_first_audio"
    RECEIVED = "received"
    SENT = "sent"


PATH = (Hop.TURN_END, Hop.REQUESTED, Hop.ENGINE_STARTED, Hop.ENGINE_FIRST_AUDIO, Hop.RECEIVED, Hop.SENT)
"""The hops on the first audio's path, in the order a response passes them (``committed`` and ``shown`` are beside
it)."""


SIDE_SEGMENTS = ((Hop.TURN_END, Hop.COMMITTED), (Hop.TURN_END, Hop.SHOWN), (Hop.SHOWN, Hop.SENT))
"""Segments reported beside the path's: the commit's and a preemptive reply's timing."""

USUAL_SEGMENTS = tuple(f"{a.value}->{b.value}" for a, b in (*zip(PATH, PATH[1:]), *SIDE_SEGMENTS))
"""The segment names of a response that passes every hop (a trace lacking a hop joins its neighbours)."""


@dataclass
class FirstAudioTrace:
    response_id: str
    at: dict[Hop, float] = field(default_factory=dict)
    """Hop -> ``time.monotonic()`` seconds; the first mark of a hop wins."""
    preemptive: bool = False
    """Started on a pause in the user's speech (see the module docstring)."""
    withdrawn: bool = False
    """A preemptive reply taken back unseen: the user spoke on."""

    @property
    def settled(self) -> bool:
        """Not waiting to learn whether the client sees it: not preemptive, shown or withdrawn."""
        return not self.preemptive or self.withdrawn or Hop.SHOWN in self.at

    def mark(self, hop: Hop, at: float) -> None:
        self.at.setdefault(hop, at)

    def engine(self, timings: StageTimings) -> None:
        """Place the engine's start and first audio (from its ``ResponseDone``) on the trace."""
        if timings.started_at_s is None:
            return
        self.mark(Hop.ENGINE_STARTED, timings.started_at_s)
        if timings.token2wav_first_chunk_ms is not None:
            self.mark(Hop.ENGINE_FIRST_AUDIO, timings.started_at_s + timings.token2wav_first_chunk_ms / 1000.0)

    def segments(self) -> dict[str, float]:
        """``"a->b"`` -> ms from path hop a to the next path hop b that happened, in path order; then
        ``turn_end->committed``, ``turn_end->shown`` (the head start a preemptive reply had) and ``shown->sent`` (its
        first audio's wait as the client sees it) for those that happened."""
        present = [hop for hop in PATH if hop in self.at]
        out = {f"{a.value}->{b.value}": 1000.0 * (self.at[b] - self.at[a]) for a, b in zip(present, present[1:])}
        for a, b in SIDE_SEGMENTS:
            if a in self.at and b in self.at:
                out[f"{a.value}->{b.value}"] = 1000.0 * (self.at[b] - self.at[a])
        return out

    def total_ms(self) -> float | None:
        """From the first hop (the turn's end, else the request) to the first audio sent."""
        present = [hop for hop in PATH if hop in self.at]
        if not present or present[-1] is not Hop.SENT:
            return None
        return 1000.0 * (self.at[Hop.SENT] - self.at[present[0]])


class FirstAudioTracer:
    """The traces of one session's responses, from the runner's hooks, called in event order.

    A turn's end waits for the next response request; the commit's answer goes to the response requested
    after that turn's end (or waits for it); a response's trace is handed to
    ``on_trace`` once its ``ResponseDone`` has been seen and its first audio was sent (or at the done,
    for a response without audio), then forgotten; a preemptive reply's not before it was shown or withdrawn, a
    withdrawn one's at its done. Bounded: one trace per response in flight (a preemptive reply's may be made when the
    session reports it, before its request runs)."""

    def __init__(self, clock: Callable[[], float], on_trace: Callable[[FirstAudioTrace], None]) -> None:
        self._clock = clock
        self._on_trace = on_trace
        self._turn_end: float | None = None
        self._committed: float | None = None  # the commit answered before the response was requested
        self._awaiting_commit: FirstAudioTrace | None = None  # requested after a turn end, commit not answered
        self._traces: dict[str, FirstAudioTrace] = {}
        self._done: set[str] = set()  # ResponseDone seen, trace not handed over yet
        self._dropped: set[str] = set()  # queued audio dropped (a cancel): no send to wait for

    def turn_ended(self) -> None:
        self._turn_end, self._committed, self._awaiting_commit = self._clock(), None, None

    def committed(self) -> None:
        if self._awaiting_commit is not None:
            self._awaiting_commit.mark(Hop.COMMITTED, self._clock())
            self._awaiting_commit = None
        elif self._turn_end is not None:
            self._committed = self._clock()

    def requested(self, response_id: str) -> None:
        trace = self._traces.get(response_id)
        if trace is None:  # else a preemptive reply's, which took its turn's end when it was reported
            trace = self._traces[response_id] = self._new_trace(response_id)
        trace.mark(Hop.REQUESTED, self._clock())

    def preempted(self, response_id: str) -> None:
        """``response_id`` was started on a pause, reported right behind its commit and usually before its request
        ran: its trace takes the pause's turn end now, so that a request that runs late (behind a blocked command
        queue) cannot take the next turn's."""
        trace = self._traces.get(response_id)
        if trace is None:
            trace = self._traces[response_id] = self._new_trace(response_id)
        trace.preemptive = True

    def _new_trace(self, response_id: str) -> FirstAudioTrace:
        """A trace that takes the pending turn end, and the commit's answer or the wait for it."""
        trace = FirstAudioTrace(response_id)
        self._awaiting_commit = None
        if self._turn_end is not None:
            trace.mark(Hop.TURN_END, self._turn_end)
            if self._committed is not None:
                trace.mark(Hop.COMMITTED, self._committed)
            else:
                self._awaiting_commit = trace
        self._turn_end = self._committed = None
        return trace

    def shown(self, response_id: str) -> None:
        """Speech stopped: the preemptive reply's held events go out."""
        trace = self._traces.get(response_id)
        if trace is not None:
            trace.mark(Hop.SHOWN, self._clock())
            self._settle(response_id)

    def withdrawn(self, response_id: str) -> None:
        """The preemptive reply was taken back unseen; its trace goes out at its done."""
        trace = self._traces.get(response_id)
        if trace is not None:
            trace.withdrawn = True
            self._settle(response_id)

    def received_audio(self, response_id: str) -> None:
        trace = self._traces.get(response_id)
        if trace is not None:
            trace.mark(Hop.RECEIVED, self._clock())

    def sent_audio(self, response_id: str) -> None:
        trace = self._traces.get(response_id)
        if trace is not None and Hop.SENT not in trace.at:
            trace.mark(Hop.SENT, self._clock())
            self._settle(response_id)

    def done(self, response_id: str, timings: StageTimings) -> None:
        trace = self._traces.get(response_id)
        if trace is None:
            return
        trace.engine(timings)
        self._done.add(response_id)
        self._settle(response_id)

    def dropped(self, response_id: str) -> None:
        """The response's queued audio was dropped (a cancel): its first audio may never be sent."""
        if response_id in self._traces:
            self._dropped.add(response_id)
            self._settle(response_id)

    def _settle(self, response_id: str) -> None:
        """Hand the trace over if its done came and nothing is left to wait for."""
        trace = self._traces[response_id]
        if response_id not in self._done or not trace.settled:
            return
        if trace.withdrawn or Hop.SENT in trace.at or Hop.RECEIVED not in trace.at or response_id in self._dropped:
            self._finish(response_id)

    def _finish(self, response_id: str) -> None:
        self._done.discard(response_id)
        self._dropped.discard(response_id)
        self._on_trace(self._traces.pop(response_id))

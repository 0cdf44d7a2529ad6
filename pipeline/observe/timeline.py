"""A record of what the engine did and when: every step, token2wav job, audio chunk and response, for reading a load
(a benchmark's burst) afterwards. Off unless ``engine.timeline_path`` is set; written as JSON when the engine closes.

Why in the engine and not in a profiling script: the benchmark's engine runs in a child process behind the server,
where nothing outside can wrap its methods, and the questions a burst raises (how long were the steps while the
early replies waited for codes, which jobs ran before a late chunk) need the engine's own account of its steps.

Units: times are ms from the timeline's creation (``time.perf_counter()``), durations ms. Each list holds tuples
(JSON arrays), oldest first; :data:`MAX_EVENTS` bounds the record (what comes after is counted in ``dropped``, not
kept), so a long-running server with the option on cannot grow without end. Recording is a tuple append on the
engine thread: no lock, no I/O until :meth:`EngineTimeline.write`.

Keys of the file (a JSON object):

- ``steps``: ``[start, wall, prefill_chunks, thinker_rows, talker_rows, codes, talker_chains]``: one per engine step
  that did something (idle steps are not recorded); ``codes``: codec tokens the talker made in it (more than its rows
  when it ran a chain of talker steps); ``talker_chains``: such chains started in it.
- ``jobs``: ``[start, ms, streams, first]``: each token2wav job from its hand-over to the emission of its chunks;
  ``first``: a job of first chunks (a job holds only first chunks or only later ones).
- ``chunks``: ``[t, response_id, index, audio_ms, waited_ms]``: each audio chunk as it was emitted; ``waited_ms``:
  how long the reply's real-time player had been dry (``pipeline/output/playout.py``).
- ``responses``: ``[t, response_id, event]``, ``event`` one of ``started``, ``first_code``, ``held`` (its first chunk
  was made and is held for a start buffer, ``token2wav.start_buffer_ms``; its chunks are recorded when sent),
  ``codes_done`` and the final status (``completed``, ``cancelled``, ...).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

__all__ = ["EngineTimeline", "MAX_EVENTS"]

log = logging.getLogger(__name__)

MAX_EVENTS = 2_000_000
"""Events kept in all (a few hundred bytes of JSON each); a 32-user burst of 5-second replies makes ~20 000."""


class EngineTimeline:
    """See the module docstring. Engine thread only."""

    def __init__(self, path: str | Path, *, max_events: int = MAX_EVENTS) -> None:
        self.path = Path(path)
        self.max_events = max_events
        self.origin = time.perf_counter()
        self.steps: list[tuple] = []
        self.jobs: list[tuple] = []
        self.chunks: list[tuple] = []
        self.responses: list[tuple] = []
        self.dropped = 0
        self._events = 0

    def ms(self, t: float) -> float:
        """``time.perf_counter()`` value ``t`` as ms on this timeline."""
        return round((t - self.origin) * 1000.0, 3)

    def _keep(self, into: list, event: tuple) -> None:
        if self._events >= self.max_events:
            self.dropped += 1
            return
        self._events += 1
        into.append(event)

    def step(
        self,
        started: float,
        ended: float,
        *,
        prefills: int,
        thinker_rows: int,
        talker_rows: int,
        codes: int,
        chains: int,
    ) -> None:
        """An engine step ran from ``started`` to ``ended`` (``perf_counter`` seconds)."""
        self._keep(
            self.steps,
            (
                self.ms(started),
                round((ended - started) * 1000.0, 3),
                prefills,
                thinker_rows,
                talker_rows,
                codes,
                chains,
            ),
        )

    def job(self, started: float, ended: float, *, streams: int, first: bool) -> None:
        """A token2wav job of ``streams`` streams (of first chunks: ``first``) handed over at ``started``, its chunks
        emitted at ``ended``."""
        self._keep(self.jobs, (self.ms(started), round((ended - started) * 1000.0, 3), streams, first))

    def chunk(self, t: float, response_id: str, index: int, audio_ms: float, waited_ms: float) -> None:
        """Chunk ``index`` (0 = the first audio) of a reply, ``audio_ms`` long, emitted at ``t``."""
        self._keep(self.chunks, (self.ms(t), response_id, index, round(audio_ms, 3), round(waited_ms, 3)))

    def response(self, t: float, response_id: str, event: str) -> None:
        self._keep(self.responses, (self.ms(t), response_id, event))

    def as_dict(self) -> dict:
        return {
            "steps": self.steps,
            "jobs": self.jobs,
            "chunks": self.chunks,
            "responses": self.responses,
            "dropped": self.dropped,
        }

    def write(self) -> None:
        """Write the record to :attr:`path` (its folder is created). An error is logged, not raised: the engine is
        closing, and a timeline that cannot be written must not stop that."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.as_dict()))
        except OSError as exc:
            log.error("engine timeline not written to %s: %s", self.path, exc)
            return
        log.info(
            "engine timeline written to %s: %d steps, %d token2wav jobs, %d chunks (%d events dropped)",
            self.path,
            len(self.steps),
            len(self.jobs),
            len(self.chunks),
            self.dropped,
        )

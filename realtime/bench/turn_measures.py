"""Full-Duplex-Bench's three turn-taking measures, read off the client's timeline of one turn: pure functions, no I/O.

Every input is a :class:`realtime.bench.metrics.TurnLog` (client clock, seconds), as a simulated user writes it down:

- **reply latency** (smooth turn-taking): the utterance's real end of speech → the moment the answering reply's first
  non-silent sample would play (its arrival plus its offset in the chunk): the bench's voice-to-voice figure, which
  includes the server's wait for the end of the turn.
- **pause takeover** (pause handling): on an utterance with a mid-sentence pause, the server took the turn when any
  sign of it arrived *before the utterance's real end*: a ``speech_stopped``, a ``response.created`` or reply audio.
  A server that waits sends none of them until the user has finished, so no margin is needed.
- **interruption stop** (user interruption): on a reply the user talked over, the user's speech onset → the signal
  that stops the reply's audio (:func:`realtime.bench.metrics.barge_in_outcome`: the reply's cancellation while it
  is generated, else the stop of its playback). Only ``cancelled`` and ``stopped_playback`` replies have a figure;
  the others are counted by :class:`realtime.bench.metrics.BargeInKind`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from realtime.bench.metrics import DEFAULT_JITTER_MS, BargeInKind, Distribution, TurnLog, turn_metrics


def reply_latency_ms(log: TurnLog) -> float | None:
    """Real end of speech → the answering reply's first sound plays, in ms; None: no reply with sound."""
    return turn_metrics(log).voice_to_voice_ms


def pause_takeover_at(log: TurnLog) -> float | None:
    """Client time of the first sign that the server took the turn before the utterance's real end (module
    docstring); None: it waited for the end."""
    signs = [log.first_speech_stopped_at]
    for response in log.responses:
        signs.append(response.created_at)
        signs.append(next((a.at for a in response.audio if a.first_audible is not None), None))
    early = [t for t in signs if t is not None and t < log.speech_end_at]
    return min(early) if early else None


def interruption_stop(log: TurnLog, *, jitter_ms: float = DEFAULT_JITTER_MS) -> tuple[BargeInKind, float | None]:
    """What became of the reply the user talked over, and the user's onset → its stop signal in ms (None for the
    kinds without a stop). ``ValueError`` on a turn the user did not talk over."""
    if log.barge_in is None:
        raise ValueError(f"turn {log.turn} of user {log.user} was not talked over")
    metrics = turn_metrics(log, jitter_ms=jitter_ms)
    assert metrics.barge_in_kind is not None  # set on every barge-in turn
    return BargeInKind(metrics.barge_in_kind), metrics.barge_in_ms


@dataclass(frozen=True)
class TurnTakingResult:
    """One turn-detection setting's three measures over its trials."""

    label: str
    """The setting in words, e.g. ``server_vad 500 ms``."""
    turn_detection: dict
    """The ``turn_detection`` object the sessions sent."""
    reply_latency_ms: Distribution
    latency_trials: int
    pause_trials: int
    pause_takeovers: int
    interruption_stop_ms: Distribution
    interruptions: dict[str, int]
    """Replies talked over, by :class:`BargeInKind` value."""
    session_turn_detection: list[dict | None] = field(default_factory=list)
    """The sessions' ``turn_detection`` as the server described it after the update (distinct values)."""
    errors: list[dict] = field(default_factory=list)
    trials: list[dict] = field(default_factory=list)
    """Per trial: ``measure``, ``clip`` and its value (``latency_ms``, ``taken_ms`` after the pause start or None,
    ``kind`` and ``stop_ms``)."""

    @property
    def takeover_share(self) -> float:
        """Share of the pause trials where the server took the turn (NaN without trials)."""
        return self.pause_takeovers / self.pause_trials if self.pause_trials else float("nan")

    def to_dict(self) -> dict:
        return asdict(self) | {"takeover_share": self.takeover_share}


def measure(
    label: str,
    turn_detection: dict,
    latency: Sequence[TurnLog],
    pauses: Sequence[tuple[TurnLog, float]],
    interruptions: Sequence[TurnLog],
    *,
    jitter_ms: float = DEFAULT_JITTER_MS,
) -> TurnTakingResult:
    """The three measures of one setting. ``latency``: turns of complete utterances; ``pauses``: turns of paused
    utterances, each with the client time its pause started; ``interruptions``: turns whose reply the user talked
    over (others in the sequence are ignored)."""
    trials: list[dict] = []
    latencies = []
    for log in latency:
        value = reply_latency_ms(log)
        latencies.append(value)
        trials.append({"measure": "latency", "clip": log.wav, "latency_ms": value})
    taken = 0
    for log, pause_start_at in pauses:
        at = pause_takeover_at(log)
        taken += at is not None
        taken_ms = None if at is None else 1000.0 * (at - pause_start_at)
        trials.append({"measure": "pause", "clip": log.wav, "taken_ms": taken_ms})
    kinds = dict.fromkeys((k.value for k in BargeInKind), 0)
    stops = []
    for log in interruptions:
        if log.barge_in is None:
            continue
        kind, stop_ms = interruption_stop(log, jitter_ms=jitter_ms)
        kinds[kind.value] += 1
        stops.append(stop_ms)
        trials.append({"measure": "interruption", "clip": log.wav, "kind": kind.value, "stop_ms": stop_ms})
    return TurnTakingResult(
        label,
        turn_detection,
        Distribution.of(latencies),
        len(latency),
        len(pauses),
        taken,
        Distribution.of(stops),
        kinds,
        trials=trials,
    )

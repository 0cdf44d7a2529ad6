"""Per-turn latency metrics from timestamped client observations: pure functions, no I/O.

A simulated user (:mod:`realtime.bench.client`) writes down *when* things happened on its own
monotonic clock (seconds) in a :class:`TurnLog`; :func:`turn_metrics` turns one log into the
numbers users feel (BENCHMARKS.md, "What is measured"), :func:`summarize` turns many into percentiles.

Definitions (all times measured at the client, in ms unless named otherwise):

- **end of turn**: arrival of ``input_audio_buffer.speech_stopped`` (the server's VAD decided the
  user stopped), else of ``input_audio_buffer.committed``.
- **TTFA**: end of turn → arrival of the first audio (delta or WebRTC frame) holding a non-silent
  sample (:data:`SILENCE_THRESHOLD`).
- **voice-to-voice**: the real end of speech in the input file, as played in real time → the
  moment that first non-silent sample would leave a player started on its arrival (arrival + its
  offset in the chunk). Includes the VAD silence window.
- **first transcript**: end of turn → first ``response.output_audio_transcript.delta``.
- **RTF** (WebSocket only): (arrival of the last audio delta − arrival of the first) / duration of
  the reply's audio; < 1 means the server synthesises faster than real time. WebRTC audio is paced
  by the server in real time, so there is no RTF to see on the wire.
- **underruns** (replies not talked over): WebSocket: a player starts at the first delta's arrival + a jitter buffer and
  plays continuously; whenever the next delta is not there when needed it starves until it arrives
  (one underrun, its wait counted in ``starved_ms``). WebRTC: the server pads a late reply with
  silence, so every run of silent frames between the reply's first and last audible frame counts.
- **barge-in** (a reply the user talked over, :class:`BargeInKind`): the user's speech onset (the moment its
  first speech sample is captured and sent) → the signal that stops the reply. While the reply is still being
  generated the server cancels it: the signal is its ``response.done`` (``cancelled``, ``turn_detected``). When
  generation had already ended but the reply was still playing at the client, the signal is what tells the client
  to stop playing: ``input_audio_buffer.speech_started`` over a WebSocket (the client owns playback),
  ``output_audio_buffer.cleared`` over WebRTC (the server clears the track). Also: ``speech_started`` → the
  cancelled reply's ``response.done``, and → the end of its last audible audio.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np

from realtime.protocol.codes import StatusReason

SILENCE_THRESHOLD = 33
"""pcm16 magnitude at and above which a sample counts as sound (about -60 dBFS; 33 / 32768)."""

DEFAULT_JITTER_MS = 60.0
"""The jitter buffer of the modelled WebSocket player: it starts this long after the first delta."""


class ResponseOutcome(str, enum.Enum):
    """``response.done`` statuses (the wire values), plus what the client saw instead of one."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"
    INCOMPLETE = "incomplete"
    TIMED_OUT = "timed_out"
    """No ``response.done`` within the bench's turn timeout."""
    NO_RESPONSE = "no_response"
    """The turn ended without any response (the VAD never heard the speech, or a server error)."""


def first_audible(samples: np.ndarray, threshold: int = SILENCE_THRESHOLD) -> int | None:
    """Index of the first sample whose pcm16 magnitude is >= ``threshold``; float input is taken as
    [-1, 1] and scaled to pcm16. ``None`` when the chunk is silent."""
    values = np.asarray(samples)
    if values.dtype.kind == "f":
        values = np.round(values * 32768.0)
    loud = np.flatnonzero(np.abs(values.astype(np.int64)) >= threshold)
    return int(loud[0]) if len(loud) else None


@dataclass(frozen=True)
class AudioArrival:
    """One piece of reply audio as it reached the client."""

    at: float
    """Client clock (s) when it arrived."""
    samples: int
    first_audible: int | None
    """Index (in samples) of its first non-silent sample, ``None`` when all silent."""


@dataclass
class ResponseLog:
    """What the client saw of one ``response`` (client clock, seconds)."""

    response_id: str
    created_at: float
    first_transcript_at: float | None = None
    audio: list[AudioArrival] = field(default_factory=list)
    done_at: float | None = None
    status: ResponseOutcome | None = None
    reason: str | None = None
    output_stopped_at: float | None = None
    """WebRTC: arrival of ``output_audio_buffer.stopped`` (or ``.cleared``) for this reply."""
    output_cleared_at: float | None = None
    """WebRTC: arrival of ``output_audio_buffer.cleared`` for this reply (the server cut its playback)."""


class BargeInKind(str, enum.Enum):
    """What became of a reply the user talked over (the wire values of ``barge_in_kind``)."""

    CANCELLED = "cancelled"
    """Still being generated: the server cancelled it (``response.done`` ``cancelled``, ``turn_detected``)."""
    STOPPED_PLAYBACK = "stopped_playback"
    """Generation had ended; the client was told to stop playing it while it still played."""
    PLAYED_OUT = "played_out"
    """It had finished playing before the user spoke or before the stop signal came: nothing was cut."""
    NOT_STOPPED = "not_stopped"
    """It was playing when the user spoke, and no stop signal came."""
    NO_REPLY = "no_reply"
    """The turn's reply had no audio to talk over (no reply, or a silent one)."""


@dataclass
class BargeInLog:
    """The user talked over this turn's reply."""

    onset_at: float
    """When the real speech onset of the interrupting utterance was played."""
    detected_at: float | None = None
    """Arrival of the ``speech_started`` that interrupted the reply (None: not detected)."""


@dataclass
class TurnLog:
    """Raw, timestamped observations of one user turn (client clock, seconds)."""

    user: int
    turn: int
    wav: str
    speech_start_at: float
    """When the real speech onset of the file was played (file start + its speech start)."""
    speech_end_at: float
    """When the real end of speech of the file was played."""
    sample_rate: int = 24_000
    """Rate of the reply audio (samples of :class:`AudioArrival`)."""
    paced_audio: bool = False
    """Reply audio came as real-time-paced media frames (WebRTC) rather than deltas."""
    speech_started_at: float | None = None
    speech_stopped_at: float | None = None
    committed_at: float | None = None
    responses: list[ResponseLog] = field(default_factory=list)
    """Normally one; a VAD that split the utterance gives several (all but the last cancelled)."""
    barge_in: BargeInLog | None = None
    timed_out: bool = False

    @property
    def response(self) -> ResponseLog | None:
        """The response that answered the whole turn: the last one."""
        return self.responses[-1] if self.responses else None

    @property
    def end_of_turn_at(self) -> float | None:
        return self.speech_stopped_at if self.speech_stopped_at is not None else self.committed_at


@dataclass(frozen=True)
class Playback:
    """A modelled player's run over one reply (client clock, seconds)."""

    start: float
    end: float
    underruns: int
    starved_s: float


def paced_playback(arrivals: Sequence[AudioArrival], rate: int, jitter_s: float) -> Playback | None:
    """A player that starts ``jitter_s`` after the first arrival and plays at ``rate``; when the
    next piece is not there in time it waits for it (an underrun) and resumes on its arrival.
    ``None`` for no audio. Arrivals must be in arrival order."""
    if not arrivals:
        return None
    start = clock = arrivals[0].at + jitter_s
    underruns, starved = 0, 0.0
    for piece in arrivals:
        if piece.at > clock:
            underruns += 1
            starved += piece.at - clock
            clock = piece.at
        clock += piece.samples / rate
    return Playback(start, clock, underruns, starved)


def first_sound_played_at(arrivals: Sequence[AudioArrival], rate: int, jitter_s: float, *, paced: bool) -> float | None:
    """When the reply's first non-silent sample plays at the client: on the :func:`paced_playback` player
    (deltas), or ``jitter_s`` after its frame arrived (``paced``: real-time media frames). ``None``: no sound yet."""
    for i, piece in enumerate(arrivals):
        if piece.first_audible is None:
            continue
        if paced or i == 0:
            starts = piece.at + jitter_s
        else:
            before = paced_playback(arrivals[:i], rate, jitter_s)
            assert before is not None  # i > 0
            starts = max(before.end, piece.at)
        return starts + piece.first_audible / rate
    return None


def media_gaps(arrivals: Sequence[AudioArrival], rate: int) -> tuple[int, float]:
    """Runs of silent frames between the first and the last audible frame, and their total length
    (s): what a listener hears as dropouts when the sender pads a late reply with silence."""
    audible = [i for i, a in enumerate(arrivals) if a.first_audible is not None]
    if len(audible) < 2:
        return 0, 0.0
    runs, silent, previous_silent = 0, 0, False
    for piece in arrivals[audible[0] : audible[-1] + 1]:
        is_silent = piece.first_audible is None
        if is_silent:
            silent += piece.samples
            runs += not previous_silent
        previous_silent = is_silent
    return runs, silent / rate


@dataclass(frozen=True)
class TurnMetrics:
    """The figures of one turn; ``None`` where the turn gives no value (see the module docstring)."""

    user: int
    turn: int
    wav: str
    status: str
    ttfa_ms: float | None = None
    voice_to_voice_ms: float | None = None
    first_transcript_ms: float | None = None
    end_of_turn_ms: float | None = None
    """Real end of speech → end of turn known (the VAD's silence window plus transport)."""
    rtf: float | None = None
    audio_ms: float | None = None
    underruns: int | None = None
    starved_ms: float | None = None
    barge_in_kind: str | None = None
    """A :class:`BargeInKind` value on a turn whose reply the user talked over; ``None`` on other turns."""
    barge_in_ms: float | None = None
    """The user's speech onset → the stop signal (module docstring), on ``cancelled`` and ``stopped_playback``."""
    barge_in_stop_ms: float | None = None
    """``speech_started`` arrival → the cancelled reply's ``response.done``."""
    barge_in_audio_stop_ms: float | None = None
    """``speech_started`` arrival → the end of the reply's last audible audio (≤ 0: none came after)."""

    def to_dict(self) -> dict:
        return asdict(self)


NUMERIC_METRICS = tuple(
    f.name for f in fields(TurnMetrics) if f.name not in ("user", "turn", "wav", "status", "barge_in_kind")
)


def _ms(later: float | None, earlier: float | None) -> float | None:
    return None if later is None or earlier is None else 1000.0 * (later - earlier)


def _first_sound(response: ResponseLog, rate: int) -> tuple[float, float] | None:
    """(arrival, play time) of the reply's first non-silent sample."""
    for piece in response.audio:
        if piece.first_audible is not None:
            return piece.at, piece.at + piece.first_audible / rate
    return None


def turn_metrics(log: TurnLog, *, jitter_ms: float = DEFAULT_JITTER_MS) -> TurnMetrics:
    """The metrics of one turn (module docstring). Statuses: the last response's, or
    ``timed_out`` / ``no_response``."""
    response = log.response
    status = _status(log, response)
    base = TurnMetrics(
        log.user, log.turn, log.wav, status.value, end_of_turn_ms=_ms(log.end_of_turn_at, log.speech_end_at)
    )
    if response is None:
        return replace(base, barge_in_kind=BargeInKind.NO_REPLY.value) if log.barge_in is not None else base
    values: dict = {"first_transcript_ms": _ms(response.first_transcript_at, log.end_of_turn_at)}
    sound = _first_sound(response, log.sample_rate)
    if sound is not None:
        values["ttfa_ms"] = _ms(sound[0], log.end_of_turn_at)
        values["voice_to_voice_ms"] = _ms(sound[1], log.speech_end_at)
    played_out = status in (ResponseOutcome.COMPLETED, ResponseOutcome.INCOMPLETE) and log.barge_in is None
    if played_out and response.audio:
        values.update(_delivery(log, response, jitter_ms))
    if log.barge_in is not None:
        values.update(_barge_in(log, response, status, jitter_ms))
    return replace(base, **values)


def _status(log: TurnLog, response: ResponseLog | None) -> ResponseOutcome:
    if response is None:
        return ResponseOutcome.TIMED_OUT if log.timed_out else ResponseOutcome.NO_RESPONSE
    if response.status is None:
        return ResponseOutcome.TIMED_OUT
    return response.status


def _delivery(log: TurnLog, response: ResponseLog, jitter_ms: float) -> dict:
    """Audio length, RTF and underruns of a reply that played to its end."""
    rate, audio = log.sample_rate, response.audio
    if log.paced_audio:
        runs, starved = media_gaps(audio, rate)
        audible = [a for a in audio if a.first_audible is not None]
        audio_s = (audible[-1].at - audible[0].at) + audible[-1].samples / rate if audible else 0.0
        return {"audio_ms": 1000.0 * audio_s, "underruns": runs, "starved_ms": 1000.0 * starved}
    audio_s = sum(a.samples for a in audio) / rate
    playback = paced_playback(audio, rate, jitter_ms / 1000.0)
    assert playback is not None  # audio is non-empty
    return {
        "audio_ms": 1000.0 * audio_s,
        "rtf": (audio[-1].at - audio[0].at) / audio_s if audio_s > 0 else None,
        "underruns": playback.underruns,
        "starved_ms": 1000.0 * playback.starved_s,
    }


def _barge_in(log: TurnLog, response: ResponseLog, status: ResponseOutcome, jitter_ms: float) -> dict:
    """The :class:`BargeInKind` of a reply the user talked over and its stop latencies (module docstring). The
    last *audible* audio is used: a WebRTC track keeps sending silence after the clear."""
    barge = log.barge_in
    assert barge is not None  # a barge-in turn's
    kind, signal_at = barge_in_outcome(log, response, status, jitter_ms)
    values: dict = {"barge_in_kind": kind.value}
    if kind not in (BargeInKind.CANCELLED, BargeInKind.STOPPED_PLAYBACK):
        return values
    values["barge_in_ms"] = _ms(signal_at, barge.onset_at)
    if kind is BargeInKind.CANCELLED:
        values["barge_in_stop_ms"] = _ms(response.done_at, barge.detected_at)
    if kind is BargeInKind.CANCELLED or log.paced_audio:  # over a WebSocket a finished reply's audio is all there
        audible = [a for a in response.audio if a.first_audible is not None]
        # a delta: when the server's last audio arrived; a paced frame: when it ended
        last_audio = audible[-1].at + (audible[-1].samples / log.sample_rate if log.paced_audio else 0.0)
        values["barge_in_audio_stop_ms"] = _ms(last_audio, barge.detected_at)
    return values


def barge_in_outcome(
    log: TurnLog, response: ResponseLog | None, status: ResponseOutcome, jitter_ms: float = DEFAULT_JITTER_MS
) -> tuple[BargeInKind, float | None]:
    """What became of the reply of ``log`` (a barge-in turn) and when its stop signal arrived (``None`` for the
    kinds without one). A reply counts as cancelled when the server cancelled it for turn detection after the
    interrupting speech was heard; otherwise the stop signal (``speech_started`` over a WebSocket,
    ``output_audio_buffer.cleared`` over WebRTC) must arrive before the reply would have finished playing."""
    barge = log.barge_in
    assert barge is not None
    play_end = _playback_end(log, response, jitter_ms) if response is not None else None
    if response is None or play_end is None:
        return BargeInKind.NO_REPLY, None
    heard = barge.detected_at
    if (
        status is ResponseOutcome.CANCELLED
        and response.reason == StatusReason.TURN_DETECTED
        and heard is not None
        and response.done_at is not None
        and response.done_at >= heard
    ):
        return BargeInKind.CANCELLED, response.done_at
    if barge.onset_at >= play_end:
        return BargeInKind.PLAYED_OUT, None
    signal_at = response.output_cleared_at if log.paced_audio else heard
    if signal_at is None:
        return BargeInKind.NOT_STOPPED, None
    if signal_at >= play_end:
        return BargeInKind.PLAYED_OUT, None
    return BargeInKind.STOPPED_PLAYBACK, signal_at


def _playback_end(log: TurnLog, response: ResponseLog, jitter_ms: float) -> float | None:
    """When the reply would have finished playing at the client, had nobody stopped it: the modelled player's end
    (WebSocket), the end of its last audible frame (WebRTC). ``None``: the reply had no sound."""
    audible = [a for a in response.audio if a.first_audible is not None]
    if not audible:
        return None
    if log.paced_audio:
        return audible[-1].at + audible[-1].samples / log.sample_rate
    played = paced_playback(response.audio, log.sample_rate, jitter_ms / 1000)
    assert played is not None  # audible is not empty
    return played.end


# --- distributions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Distribution:
    """Percentiles (linear interpolation) of the values that exist; NaN when there are none."""

    n: int
    p50: float
    p90: float
    p95: float
    mean: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Distribution:
        data = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
        if not len(data):
            nan = float("nan")
            return cls(0, nan, nan, nan, nan, nan)
        p50, p90, p95 = (float(np.percentile(data, q)) for q in (50, 90, 95))
        return cls(len(data), p50, p90, p95, float(data.mean()), float(data.max()))

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(metrics: Sequence[TurnMetrics]) -> dict[str, Distribution]:
    """One :class:`Distribution` per numeric metric over ``metrics``."""
    return {name: Distribution.of(getattr(m, name) for m in metrics) for name in NUMERIC_METRICS}


def status_counts(metrics: Sequence[TurnMetrics]) -> dict[str, int]:
    counts = {s.value: 0 for s in ResponseOutcome}
    for m in metrics:
        counts[m.status] += 1
    return counts


def barge_in_counts(metrics: Sequence[TurnMetrics]) -> dict[str, dict]:
    """Per :class:`BargeInKind`: how many turns had it (``count``) and the distribution of their ``barge_in_ms``
    (``ms``, only the kinds that have one: ``cancelled``, ``stopped_playback``)."""
    out: dict[str, dict] = {}
    for kind in BargeInKind:
        turns = [m for m in metrics if m.barge_in_kind == kind.value]
        out[kind.value] = {"count": len(turns)}
        if kind in (BargeInKind.CANCELLED, BargeInKind.STOPPED_PLAYBACK):
            out[kind.value]["ms"] = Distribution.of(m.barge_in_ms for m in turns)
    return out

"""The turn-taking benchmark's trials (``omni-realtime bench --turn-taking``): the espeak-ng fixtures of
:mod:`realtime.bench.turn_fixtures` spoken by one simulated user to a server, once per turn-detection setting.

Each setting (:class:`TurnSetting`: a ``turn_detection`` object the sessions send as it is, so whatever the server
makes of ``server_vad`` or ``semantic_vad`` is what is measured) runs three kinds of trial, one user at a time:

- **latency**: each complete utterance in a session of its own; the user waits for the reply to finish playing;
- **pause**: each paused utterance (0.6–1.2 s of silence mid-sentence) in a session of its own, so a reply to the
  first half can never be taken for the next trial's;
- **interruption**: one session speaking the complete utterances in turn, each talking over the previous one's reply
  ``barge_in_after_ms`` after its first sound played (the last one's reply plays out).

The users run in a child process (``spawn``) on an event loop of their own, as the sweep's do, so that an in-process
server and the measuring client never share an interpreter lock. Trial *i* speaks sentence ``i mod 24`` in voice
``(i + i div 24) mod 6``: every sentence before any repeats, every voice in turn.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from realtime.bench.client import ClientOptions, ClientRun, ClientTransport, UserPlan, import_webrtc, run_users
from realtime.bench.metrics import TurnLog
from realtime.bench.speech import RATE, Speech
from realtime.bench.turn_fixtures import (
    DEFAULT_SEED,
    SENTENCES,
    VOICES,
    Sentence,
    TurnClip,
    TurnKind,
    Voice,
    clip_base,
    read_folder,
    render,
    tools_missing,
)
from realtime.bench.turn_measures import TurnTakingResult, measure

TURN_DETECTION_TYPES = ("server_vad", "semantic_vad")
EAGERNESS = ("low", "medium", "high", "auto")


@dataclass(frozen=True)
class TurnSetting:
    """A session's ``turn_detection`` and its name in the report."""

    label: str
    turn_detection: dict


def turn_settings(types: Sequence[str], *, silence_ms: int, eagerness: str) -> list[TurnSetting]:
    """One setting per type, in the order given: ``server_vad`` with ``silence_ms`` of silence, ``semantic_vad`` with
    ``eagerness``. ``ValueError`` on an unknown type or eagerness, a negative silence or a repeated type."""
    if eagerness not in EAGERNESS:
        raise ValueError(f"eagerness must be one of {', '.join(EAGERNESS)}, got {eagerness!r}")
    if silence_ms < 0:
        raise ValueError(f"the silence window must be >= 0 ms, got {silence_ms}")
    if len(set(types)) != len(types) or not types:
        raise ValueError(f"name each turn detection type once, got {list(types)}")
    settings = []
    for kind in types:
        if kind == "server_vad":
            settings.append(
                TurnSetting(f"server_vad {silence_ms} ms", {"type": "server_vad", "silence_duration_ms": silence_ms})
            )
        elif kind == "semantic_vad":
            settings.append(TurnSetting(f"semantic_vad {eagerness}", {"type": "semantic_vad", "eagerness": eagerness}))
        else:
            raise ValueError(f"turn detection must be one of {', '.join(TURN_DETECTION_TYPES)}, got {kind!r}")
    return settings


@dataclass(frozen=True)
class TurnTrials:
    """The spoken inputs: per trial a complete and a paused utterance, at the bench's rate."""

    complete: tuple[Speech, ...]
    paused: tuple[Speech, ...]
    pause_start_ms: dict[str, float]
    """Paused speech name → where its pause starts (ms from the file start)."""

    def __post_init__(self) -> None:
        if not self.complete or len(self.complete) != len(self.paused):
            raise ValueError("one complete and one paused utterance per trial, at least one trial")


def trial_pairs(count: int) -> list[tuple[Sentence, Voice]]:
    """The (sentence, voice) of each of ``count`` trials (module docstring)."""
    if count < 1:
        raise ValueError(f"at least one trial, got {count}")
    n = len(SENTENCES)
    return [(SENTENCES[i % n], VOICES[(i + i // n) % len(VOICES)]) for i in range(count)]


def render_trials(count: int, seed: int = DEFAULT_SEED, fixtures: Path | None = None) -> TurnTrials:
    """The fixtures of ``count`` trials: rendered with espeak-ng and sox (~80 ms of CPU a trial; ``RuntimeError``
    when the tools are missing), or read from ``fixtures``, a folder :func:`~realtime.bench.turn_fixtures.write_folder`
    wrote (rendered with the same seed; ``ValueError`` when a trial's clips are not there)."""
    if fixtures is not None:
        stored = read_folder(fixtures)

        def clips_of(sentence, voice) -> dict:
            base = clip_base(sentence, voice)
            found = {kind: stored.get(f"{base}.{kind.value}") for kind in (TurnKind.COMPLETE, TurnKind.PAUSE)}
            if None in found.values():
                raise ValueError(f"{fixtures} lacks the clips of {base}")
            return found

        return _trials(clips_of(sentence, voice) for sentence, voice in trial_pairs(count))
    missing = tools_missing()
    if missing:
        raise RuntimeError(f"{', '.join(missing)} not found on PATH (Debian: apt-get install espeak-ng sox)")
    with tempfile.TemporaryDirectory(prefix="turn-bench-") as tmp:
        return _trials(
            {clip.kind: clip for clip in render(sentence, voice, Path(tmp), seed)}
            for sentence, voice in trial_pairs(count)
        )


def _trials(each) -> TurnTrials:
    complete, paused, starts = [], [], {}
    for clips in each:
        complete.append(as_speech(clips[TurnKind.COMPLETE]))
        pause = clips[TurnKind.PAUSE]
        paused.append(as_speech(pause))
        assert pause.pause_start_ms is not None  # a pause clip's
        starts[pause.name] = float(pause.pause_start_ms)
    return TurnTrials(tuple(complete), tuple(paused), starts)


def as_speech(clip: TurnClip) -> Speech:
    """A fixture clip (16 kHz) as the bench plays it (:data:`realtime.bench.speech.RATE`), its bounds kept."""
    import soxr

    from realtime.bench.turn_fixtures import RATE as CLIP_RATE

    pcm = np.ascontiguousarray(soxr.resample(clip.audio, CLIP_RATE, RATE), dtype=np.float32)
    return Speech(clip.name, pcm, float(clip.speech_start_ms), float(clip.speech_end_ms), "fixture")


@dataclass(frozen=True)
class TrialPlans:
    latency: list[UserPlan]
    pauses: list[UserPlan]
    interruption: UserPlan

    def all(self) -> list[UserPlan]:
        """Every session's plan, in the order they run."""
        return [*self.latency, *self.pauses, self.interruption]


def trial_plans(trials: TurnTrials) -> TrialPlans:
    """The sessions of one setting (module docstring): ``n + 1`` utterances give ``n`` interruptions."""
    n = len(trials.complete)
    chain = tuple(trials.complete[(i + 1) % n] for i in range(n + 1))
    return TrialPlans(
        [UserPlan(0, (speech,)) for speech in trials.complete],
        [UserPlan(0, (speech,)) for speech in trials.paused],
        UserPlan(0, chain, barge_in_turns=frozenset(range(n))),
    )


def run_sessions(url: str, plans: list[UserPlan], options: ClientOptions) -> list[ClientRun]:
    """Worker-process entry: run each plan in a session of its own, one after the other, on a fresh event loop."""
    if options.transport is ClientTransport.WEBRTC:
        import_webrtc()

    async def sessions() -> list[ClientRun]:
        return [await run_users(url, [plan], options) for plan in plans]

    return asyncio.run(sessions())


def _ready() -> None:
    """Worker-process entry: import the client before any trial's clock starts."""


async def run_turn_taking(
    url: str, settings: Sequence[TurnSetting], trials: TurnTrials, options: ClientOptions
) -> list[TurnTakingResult]:
    """Every setting's trials against the server at ``url`` (which this event loop may be serving), one setting after
    the other; the users run in one child process. ``options.turn_detection`` is replaced by each setting's.
    Raises :class:`realtime.bench.client.BenchClientError` when a session fails to start or refuses a setting."""
    loop = asyncio.get_running_loop()
    plans = trial_plans(trials)
    results = []
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        await loop.run_in_executor(pool, _ready)
        for setting in settings:
            session_options = replace(options, turn_detection=setting.turn_detection)
            runs = await loop.run_in_executor(pool, run_sessions, url, plans.all(), session_options)
            results.append(_result(setting, runs, trials, options.jitter_ms))
    return results


def _result(setting: TurnSetting, runs: list[ClientRun], trials: TurnTrials, jitter_ms: float) -> TurnTakingResult:
    n = len(trials.complete)
    latency_runs, pause_runs, chain_run = runs[:n], runs[n : 2 * n], runs[2 * n]
    latency = [log for run in latency_runs for log in run.logs]
    pauses = [(log, _pause_start_at(log, trials)) for run in pause_runs for log in run.logs]
    result = measure(setting.label, setting.turn_detection, latency, pauses, chain_run.logs, jitter_ms=jitter_ms)
    seen: list[dict | None] = []
    for run in runs:
        for detection in run.turn_detection:
            if detection not in seen:
                seen.append(detection)
    errors = [error for run in runs for error in run.errors]
    return replace(result, session_turn_detection=seen, errors=errors)


def _pause_start_at(log: TurnLog, trials: TurnTrials) -> float:
    """Client time the pause of a paused utterance's turn started (its speech start is ``speech_start_at``)."""
    speech = next(s for s in trials.paused if s.name == log.wav)
    return log.speech_start_at + (trials.pause_start_ms[log.wav] - speech.speech_start_ms) / 1000.0

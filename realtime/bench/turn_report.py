"""Report of the turn-taking benchmark: ``turn_taking.json`` (everything, per trial) and ``turn_taking.md`` (one row per
turn-detection setting), in the run folder."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from realtime.bench.metrics import BargeInKind, Distribution
from realtime.bench.turn_measures import TurnTakingResult

TURN_JSON = "turn_taking.json"
TURN_MD = "turn_taking.md"


@dataclass(frozen=True)
class TurnRunInfo:
    """How the numbers were made."""

    command: str
    date: str
    model: str
    device: str
    transport: str
    server: str
    trials: int
    """Trials per measure (and setting)."""
    reply: str
    """The forced reply length in words."""
    fixtures: str
    lighter_workload: str | None = None
    """Why the figures are not the benchmark's default run (``--quick``, fewer trials); None: the default."""
    versions: dict[str, str] = field(default_factory=dict)


def results_dict(info: TurnRunInfo, results: Sequence[TurnTakingResult]) -> dict:
    return {"info": asdict(info), "settings": [r.to_dict() for r in results]}


def _f(value: float) -> str:
    return "–" if not math.isfinite(value) else f"{value:.0f}"


def _p50_p95(d: Distribution) -> str:
    return f"{_f(d.p50)} / {_f(d.p95)} (n={d.n})"


def markdown(info: TurnRunInfo, results: Sequence[TurnTakingResult]) -> str:
    """The table: one row per setting, then what each column means."""
    lines = [
        f"Model: {info.model}; device: {info.device}; transport: {info.transport}; server: {info.server}.",
        f"Inputs: {info.fixtures}; {info.trials} trials per measure, one user; replies: {info.reply}.",
        *([f"**lighter workload: {info.lighter_workload}**."] if info.lighter_workload else []),
        "",
        "Turn-taking (Full-Duplex-Bench's measures on our fixtures)",
        "",
        "| turn detection | reply latency ms p50 / p95 | pause takeover | interruption stop ms p50 / p95 "
        "| talked-over replies not stopped / played out / no reply |",
        "| :--- | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        share = "–" if not r.pause_trials else f"{r.takeover_share:.2f} ({r.pause_takeovers}/{r.pause_trials})"
        other = " / ".join(
            str(r.interruptions.get(k.value, 0))
            for k in (BargeInKind.NOT_STOPPED, BargeInKind.PLAYED_OUT, BargeInKind.NO_REPLY)
        )
        lines.append(
            f"| {r.label} | {_p50_p95(r.reply_latency_ms)} | {share} | {_p50_p95(r.interruption_stop_ms)} | {other} |"
        )
    lines += [
        "",
        "reply latency: the utterance's real end of speech → the reply's first sound (complete utterances; includes "
        "the wait for the end of the turn). pause takeover: share of utterances with a 0.6–1.2 s mid-sentence pause "
        "where the server took the turn (speech_stopped, a response or its audio) before the utterance's real end; "
        "lower is better. interruption stop: the interrupting speech's onset → the signal that stops the reply "
        "(its cancellation, or the stop of its playback); only replies still playing have one.",
    ]
    errors = sum(len(r.errors) for r in results)
    if errors:
        lines += ["", f"The server sent {errors} error event(s): see {TURN_JSON}."]
    return "\n".join(lines) + "\n"


def write_report(out: Path, info: TurnRunInfo, results: Sequence[TurnTakingResult]) -> tuple[Path, Path]:
    """Write ``turn_taking.json`` (strict JSON: a figure no trial had is null) and ``turn_taking.md`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / TURN_JSON, out / TURN_MD
    json_path.write_text(json.dumps(_finite(results_dict(info, results)), indent=1) + "\n", encoding="utf-8")
    md_path.write_text(markdown(info, results), encoding="utf-8")
    return json_path, md_path


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value

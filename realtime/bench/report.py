"""Reports of a sweep: ``results.json`` (everything), ``report.md`` (tables), PNG plots.

Every table and plot shows our streaming server beside the reference (transformers' ``generate``
served one request at a time) when the run had one: the latency table has a "transformers reference" row when the
reference served the 1-user level (its time to first audio is request → its only audio), and columns beside ours when
it served a level of more users (queueing included). Percentiles are over all turns of a level.
Stage throughput and device memory (:mod:`realtime.bench.throughput`) are one figure per level.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from realtime.bench.goal import DEFAULT_P95_TTFA_MS, LatencyGoal
from realtime.bench.metrics import BargeInKind, Distribution, TurnMetrics, barge_in_counts, status_counts, summarize
from realtime.bench.sweep import LevelResult
from realtime.bench.throughput import GIB

RESULTS_JSON = "results.json"
REPORT_MD = "report.md"
PLOTS = ("latency_cdf.png", "ttfa_vs_concurrency.png", "rtf_vs_concurrency.png")


@dataclass(frozen=True)
class RunInfo:
    """How the numbers were made: enough to rerun and to judge them."""

    command: str
    date: str
    model: str
    device: str
    transport: str
    server: str
    text_tokens: int | None
    """The forced reply text in tokens; None: not known (a ``--url`` server of unknown family, given seconds)."""
    codec_tokens: int | None
    """The forced reply audio in the family's codes; None: not known (likewise)."""
    wavs: str
    torch_threads: int
    turns_per_user: int
    """The plan's turns per user (low levels run more for enough samples: each level's ``turns_per_user``)."""
    workload: str
    """The workload in words: turns per user and the forced reply length."""
    lighter_workload: str | None
    """What makes the workload lighter than the bench's default (shorter replies, fewer turns); ``None``: not
    lighter."""
    load_average: dict[str, list[float]] = field(default_factory=dict)
    """``/proc/loadavg``-style 1/5/15 min averages, ``start`` and ``end`` of the run."""
    versions: dict[str, str] = field(default_factory=dict)
    transcription: bool = False
    """The users turned input audio transcription on (``--transcription``)."""
    camera: dict | None = None
    """How every user showed a camera (``--camera``: ``width``, ``height``, ``fps``, ``sent_as`` in words); None: the
    camera was off."""
    goal: str = LatencyGoal().describe()
    """The latency goal in words (:mod:`realtime.bench.goal`)."""
    goal_p95_ttfa_ms: float = DEFAULT_P95_TTFA_MS
    reply_s: float | None = None
    """The forced reply audio in seconds (``codec_tokens`` at ``codes_per_second``); None: not known (codes given for
    a server of unknown family)."""
    codes_per_second: float | None = None
    """The served family's codes per second of audio; None: the family is not known."""


# --- JSON ----------------------------------------------------------------------------------------


def results_dict(info: RunInfo, levels: Sequence[LevelResult]) -> dict:
    goal = LatencyGoal(info.goal_p95_ttfa_ms)
    return {
        "info": asdict(info),
        "users_at_goal": goal.users_at_goal([(level.concurrency, level.turns) for level in levels]),
        "levels": [_level_dict(level, goal) for level in levels],
    }


def _level_dict(level: LevelResult, goal: LatencyGoal) -> dict:
    out = {
        "concurrency": level.concurrency,
        "meets_goal": goal.meets(level.turns),
        "turns_per_user": level.turns_per_user,
        "wall_s": level.wall_s,
        "replying_s": level.replying_s,
        "silence_window_ms": level.silence_window_ms,
        "statuses": status_counts(level.turns),
        "summary": _summary_dict(level.turns),
        "barge_in": _barge_in_dict(level.turns),
        "turns": [t.to_dict() for t in level.turns],
        "errors": level.errors,
        "throughput": level.throughput.to_dict() if level.throughput is not None else None,
        "event_counts": level.event_counts,
        "client_processes": level.client_processes,
        "camera_frames": level.camera_frames,
    }
    if level.reference is not None:
        ref_throughput = level.reference_throughput()
        out["reference"] = {
            "wall_s": level.reference_wall_s,
            "throughput": ref_throughput.to_dict() if ref_throughput is not None else None,
            "summary": _summary_dict(level.reference_metrics()),
            "service_ms": Distribution.of(1000.0 * q.service_s for q in level.reference).to_dict(),
            "turns": [asdict(q) | {"service_s": q.service_s} for q in level.reference],
        }
    return out


def _summary_dict(turns: Sequence[TurnMetrics]) -> dict:
    return {name: dist.to_dict() for name, dist in summarize(turns).items()}


def _barge_in_dict(turns: Sequence[TurnMetrics]) -> dict:
    return {
        kind: {name: value.to_dict() if isinstance(value, Distribution) else value for name, value in entry.items()}
        for kind, entry in barge_in_counts(turns).items()
    }


def write_json(path: Path, info: RunInfo, levels: Sequence[LevelResult]) -> None:
    """Strict JSON: NaN (a metric no turn had) is written as null."""
    path.write_text(json.dumps(_finite(results_dict(info, levels)), indent=1) + "\n", encoding="utf-8")


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


# --- Markdown ------------------------------------------------------------------------------------


NA = "n/a"

STATUS_WORDS = {"incomplete": "incomplete (forced length)"}
"""How the delivery table names a ``response.done`` status: the bench forces every reply's length (the stage
config's ``max_tokens``), and a reply that reaches it ends as ``incomplete``, by design (not a failure)."""
"""A figure no turn had (``null`` in results.json); the report says why below its table."""


def _f(value: float, digits: int = 0) -> str:
    """``value`` to ``digits`` decimals, "–" for NaN; a value that is not zero never reads as zero (``0.004`` is
    written ``0.004`` at ``digits=2``, not ``0.00``)."""
    if not math.isfinite(value):
        return "–"
    text = f"{value:.{digits}f}"
    if value != 0 and float(text) == 0:
        return f"{value:.1g}" if abs(value) >= 1e-4 else f"{value:.0e}"
    return text


def _ppp(d: Distribution, digits: int = 0) -> str:
    return f"{_f(d.p50, digits)} / {_f(d.p90, digits)} / {_f(d.p95, digits)}"


def markdown(info: RunInfo, levels: Sequence[LevelResult]) -> str:
    """The tables (latency; delivery; barge-in; stage throughput), one row per concurrency level."""
    has_ref = any(level.reference is not None for level in levels)
    lines = [
        f"Model: {info.model}; device: {info.device}; transport: {info.transport}; server: {info.server}.",
        f"Workload: {info.workload}; inputs: {info.wavs}; input transcription: "
        + ("on." if info.transcription else "off.")
        + f" Camera: {'on (' + info.camera['sent_as'] + ')' if info.camera else 'off'}.",
        *(
            [f"**lighter workload: {info.lighter_workload}** (not the default conversation)."]
            if info.lighter_workload
            else []
        ),
        "",
        *_latency_table(levels),
    ]
    lines += ["", _goal_line(info, levels)]
    lines += ["", "Delivery (replies played to their end)", ""]
    head = (
        ["users", "RTF p50 / p90 (ours)"]
        + (["RTF p50 (reference)"] if has_ref else [])
        + ["turns", "played to their end", "with underruns", "underruns", "starved ms p95", "replies ended"]
    )
    lines += [_row(head), _row(["---:"] * (len(head) - 1) + [":---"])]
    for level in levels:
        lines.append(_row(_delivery_row(level, has_ref)))
    lines += _delivery_notes(info, levels)
    lines += ["", *_barge_in_table(levels)]
    lines += ["", *_throughput_table(levels, has_ref)]
    lines += ["", *_client_load_table(levels)]
    if info.transcription:
        lines += ["", *_transcription_table(levels)]
    if info.camera:
        lines += ["", *_camera_table(levels)]
    return "\n".join(lines) + "\n"


REFERENCE_ROW = "transformers reference, 1 user"
"""The latency table's row of transformers' ``generate`` serving one user."""


def _latency_table(levels: Sequence[LevelResult]) -> list[str]:
    """First audio after ``speech_stopped``, voice-to-voice and first transcript per level, with the replies' audio
    length; the reference's row (:data:`REFERENCE_ROW`) and columns (module docstring)."""
    has_ref = any(level.reference is not None for level in levels)
    ref_columns = any(level.reference is not None and level.concurrency > 1 for level in levels)
    lines = [
        "Latency, ms, p50 / p90 / p95 (TTFA: speech_stopped → first audio); reply audio: seconds, p50 over the replies "
        "played to their end" + (" (reference: transformers `generate`, one request at a time)" if has_ref else ""),
        "",
    ]
    head = ["users", "turns", "TTFA", "voice-to-voice", "first transcript", "reply audio s"]
    if ref_columns:
        head += ["TTFA (reference)", "voice-to-voice (reference)"]
    lines += [_row(head), _row(["---:"] * len(head))]
    for level in levels:
        row = [str(level.concurrency), *_latency_cells(level.turns)]
        if ref_columns:
            ref = summarize(level.reference_metrics())
            row += [_ppp(ref["ttfa_ms"]), _ppp(ref["voice_to_voice_ms"])]
        lines.append(_row(row))
    alone = next((level for level in levels if level.concurrency == 1 and level.reference), None)
    if alone is not None:
        lines.append(
            _row([REFERENCE_ROW, *_latency_cells(alone.reference_metrics())] + (["–", "–"] if ref_columns else []))
        )
        lines += [
            "",
            f"{REFERENCE_ROW}: transformers' `generate` on the same weights, forced lengths and turns, one request at "
            "a time: it returns the reply's audio only once the whole reply is made, so its TTFA is request → its "
            "only audio (feature extraction included) and its first transcript comes with it.",
        ]
    return lines


def _latency_cells(turns: Sequence[TurnMetrics]) -> list[str]:
    """Turns, TTFA, voice-to-voice, first transcript and reply audio seconds of ``turns``."""
    summary = summarize(turns)
    audio_s = summary["audio_ms"].p50 / 1000.0
    return [
        str(len(turns)),
        _ppp(summary["ttfa_ms"]),
        _ppp(summary["voice_to_voice_ms"]),
        _ppp(summary["first_transcript_ms"]),
        _f(audio_s, 1),
    ]


def _goal_line(info: RunInfo, levels: Sequence[LevelResult]) -> str:
    goal = LatencyGoal(info.goal_p95_ttfa_ms)
    met = [level.concurrency for level in levels if goal.meets(level.turns)]
    users = goal.users_at_goal([(level.concurrency, level.turns) for level in levels])
    return (
        f"**Users at the goal** ({info.goal}): {users if users else 'none of the levels'}"
        + f"; levels meeting it: {', '.join(map(str, met)) if met else 'none'}."
    )


def _client_load_table(levels: Sequence[LevelResult]) -> list[str]:
    """Per level: the simulated users' own load (client worker processes, their event loops' lag, CPU per user). A
    lag near the media frame (20 ms) or above means the clients, not the server, held the measurement back."""
    lines = [
        "Client load (the simulated users' own processes; loop lag of the worst process, ms)",
        "",
        _row(["users", "client processes", "loop lag p50 / p99 / max", "client CPU % per user"]),
        _row(["---:"] * 4),
    ]
    for level in levels:
        shares = level.client_processes
        if not shares:
            continue
        worst = max(shares, key=lambda s: s["loop_lag_ms"]["p99_ms"])["loop_lag_ms"]
        cpu = sum(s["cpu_s"] for s in shares)
        wall = max(s["wall_s"] for s in shares)
        per_user = 100.0 * cpu / wall / level.concurrency if wall > 0 else float("nan")
        lag = f"{_f(worst['p50_ms'], 1)} / {_f(worst['p99_ms'], 1)} / {_f(worst['max_ms'], 1)}"
        lines.append(_row([str(level.concurrency), str(len(shares)), lag, _f(per_user, 1)]))
    return lines


def _camera_table(levels: Sequence[LevelResult]) -> list[str]:
    """Per level: what the users' cameras sent and what reached the model (``--camera``)."""
    from realtime.bench.client import PICTURES_SENT, USAGE_IMAGE_TOKENS, USAGE_RESPONSES
    from realtime.media.video_settings import CAMERA_OUTCOMES

    lines = [
        "Camera (all users; WebRTC frames as the server counted them during the level, by outcome)",
        "",
        _row(["users", "pictures sent", *(f"frames {o}" for o in CAMERA_OUTCOMES), "image tokens per reply (mean)"]),
        _row(["---:"] * (3 + len(CAMERA_OUTCOMES))),
    ]
    for level in levels:
        counts, frames = level.event_counts, level.camera_frames
        replies = counts.get(USAGE_RESPONSES, 0)
        per_reply = _f(counts.get(USAGE_IMAGE_TOKENS, 0) / replies) if replies else NA
        by_outcome = [str(frames.get(o, 0)) if frames is not None else "–" for o in CAMERA_OUTCOMES]
        lines.append(_row([str(level.concurrency), str(counts.get(PICTURES_SENT, 0)), *by_outcome, per_reply]))
    lines += [
        "",
        "pictures sent: input_image items (WebSocket). frames: delivered to a spoken message, skipped by the server's "
        "sampling rate, idle (replaced while no message was open), invalid, no_vision (the model cannot see), overflow "
        "(dropped waiting to cross from a media worker to the server); – : "
        "not counted (the server exports no camera metrics). image tokens per reply: the usage's "
        "input_token_details.image_tokens, the image and video positions in each reply's context.",
    ]
    return lines


_TRANSCRIPTION_COLUMNS = {
    "input_audio_buffer.committed": "commits",
    "conversation.item.input_audio_transcription.completed": "transcripts completed",
    "conversation.item.input_audio_transcription.failed": "transcripts failed",
    "conversation.item.input_audio_transcription.delta": "transcript deltas",
}


def _transcription_table(levels: Sequence[LevelResult]) -> list[str]:
    """Per level: the commits the users saw and the input transcription events that answered them (all users,
    warm-up excluded)."""
    lines = ["Input transcription (events received, all users)", ""]
    head = ["users", *_TRANSCRIPTION_COLUMNS.values()]
    lines += [_row(head), _row(["---:"] * len(head))]
    for level in levels:
        counts = [str(level.event_counts.get(name, 0)) for name in _TRANSCRIPTION_COLUMNS]
        lines.append(_row([str(level.concurrency), *counts]))
    return lines


def _delivery_notes(info: RunInfo, levels: Sequence[LevelResult]) -> list[str]:
    """Why a delivery figure reads n/a (``null`` in results.json)."""
    summaries = [summarize(level.turns) for level in levels]
    notes = []
    if any(s["rtf"].n == 0 for s in summaries):
        notes.append(
            "RTF n/a: "
            + (
                "WebRTC audio is paced by the server in real time, so no synthesis speed shows on the wire"
                if info.transport == "webrtc"
                else "no reply played to its end over the WebSocket"
            )
        )
    if any(s["underruns"].n == 0 for s in summaries):
        notes.append("underruns n/a: no reply played to its end")
    lines = ["", FORCED_LENGTH_NOTE] if any(status_counts(level.turns)["incomplete"] for level in levels) else []
    if not notes:
        return lines
    return [
        *lines,
        "",
        "; ".join(notes)
        + " (a reply the user talked over, cancelled, failed or without sound has no delivery figures; "
        "`null` in results.json).",
    ]


FORCED_LENGTH_NOTE = (
    "incomplete (forced length): the reply reached the text or audio length the bench forces, which ends it with "
    "`response.done` status `incomplete` by design; not a failure."
)


BARGE_IN_HEAD = (
    "users",
    "barge-in turns",
    "cancelled while generating: n, onset → response.done ms p50 / p95",
    "stopped during playback: n, onset → stop signal ms p50 / p95",
    "nothing cut: played out / not stopped / no reply",
    "speech_started → response.done ms p50 / p95",
    "speech_started → last audio ms p50 / p95",
)


def _barge_in_table(levels: Sequence[LevelResult]) -> list[str]:
    """One row per level with barge-in turns, and what each column means; one line when there were none."""
    rows = [_row(_barge_in_row(level)) for level in levels if any(t.barge_in_kind for t in level.turns)]
    if not rows:
        return ["Barge-in: no turn talked over a reply (`--barge-in-every K` makes every K-th turn do so)."]
    return [
        "Barge-in (the user talks over the reply; onset: the interrupting speech's first sample sent)",
        "",
        _row(BARGE_IN_HEAD),
        _row(["---:"] * len(BARGE_IN_HEAD)),
        *rows,
        "",
        "cancelled while generating: the server cancelled the reply still being made (`response.done` cancelled, "
        "`turn_detected`). stopped during playback: generation had ended, and the client was told to stop playing "
        "while the reply still played (WebSocket: `input_audio_buffer.speech_started`; WebRTC: "
        "`output_audio_buffer.cleared`). played out: the reply had finished playing before the stop signal; not "
        "stopped: no stop signal came; no reply: no sound to talk over. The speech_started columns: cancelled "
        "replies (→ last audio: also stopped ones over WebRTC); n/a when there were none.",
    ]


def _barge_in_row(level: LevelResult) -> list[str]:
    counts = barge_in_counts(level.turns)
    ours = summarize(level.turns)
    total = sum(entry["count"] for entry in counts.values())

    def timed(kind: BargeInKind) -> str:
        entry = counts[kind.value]
        if not entry["count"]:
            return "0"
        return f"{entry['count']}, {_ppp_short(entry['ms'])}"

    stop, audio = ours["barge_in_stop_ms"], ours["barge_in_audio_stop_ms"]
    return [
        str(level.concurrency),
        str(total),
        timed(BargeInKind.CANCELLED),
        timed(BargeInKind.STOPPED_PLAYBACK),
        " / ".join(str(counts[k.value]["count"]) for k in BARGE_IN_UNCUT),
        _ppp_short(stop) if stop.n else NA,
        _ppp_short(audio) if audio.n else NA,
    ]


BARGE_IN_UNCUT = (BargeInKind.PLAYED_OUT, BargeInKind.NOT_STOPPED, BargeInKind.NO_REPLY)


def _ppp_short(d: Distribution) -> str:
    return f"{_f(d.p50)} / {_f(d.p95)}"


def _throughput_table(levels: Sequence[LevelResult], has_ref: bool) -> list[str]:
    """Stage rates and device memory, one row per level, with how to read them."""
    sources = {level.throughput.source for level in levels if level.throughput is not None}
    where = {"engine": "the in-process engine's counters", "metrics": "the server's /metrics"}
    lines = [
        "Stage throughput, ours per wall second of the level / per second with a reply in flight (from "
        + (" and ".join(where[s] for s in sorted(sources)) if sources else "no engine counters")
        + ")"
        + ("; reference: per second its one worker was busy" if has_ref else "")
        + "; device memory in GiB at the end of the level (peak: since the server started)",
        "",
    ]
    head = [
        "users",
        "thinker tok/s",
        "talker tok/s",
        "audio s/s",
        "replying %",
        "decode steps/s",
        "tokens/step",
        "GPU GiB allocated",
        "GPU GiB peak",
    ]
    if has_ref:
        head += ["thinker tok/s (reference)", "talker tok/s (reference)", "audio s/s (reference)"]
    lines += [_row(head), _row(["---:"] * len(head))]
    for level in levels:
        t = level.throughput
        row = [str(level.concurrency)]
        if t is None:
            row += ["–"] * 8
        else:
            row += [
                _pair(t.thinker_tokens_per_s, t.thinker_tokens_per_replying_s, 1),
                _pair(t.talker_tokens_per_s, t.talker_tokens_per_replying_s, 1),
                _pair(t.audio_s_per_s, t.audio_s_per_replying_s, 2),
                _f(100.0 * t.replying_s / t.window_s) if t.replying_s is not None else "–",
                _f(t.decode_steps_per_s, 1),
                _f(t.tokens_per_step, 2) if t.tokens_per_step is not None else "–",
                _gib(t.device_memory_bytes),
                _gib(t.device_memory_peak_bytes),
            ]
        if has_ref:
            r = level.reference_throughput()
            row += (
                ["–"] * 3
                if r is None
                else [_f(r.thinker_tokens_per_s, 1), _f(r.talker_tokens_per_s, 1), _f(r.audio_s_per_s, 2)]
            )
        lines.append(_row(row))
    pace = "compares with the reference's" if has_ref else "is the engine's pace while it had work"
    lines += [
        "",
        "audio s/s: seconds of reply audio token2wav produced per second (1.0 = one real-time stream). "
        "Per wall second includes the users' speaking and VAD time (delivered load, not capacity); "
        "per replying second (replying %: share of the level with a reply in flight, seen by the clients) "
        f"{pace}. tokens/step: thinker + talker tokens per engine decode step (grows as steps batch more "
        "responses). – : not reported (no engine counters from the server; GPU memory on the CPU).",
    ]
    return lines


def _pair(wall: float, replying: float | None, digits: int) -> str:
    return f"{_f(wall, digits)} / {_f(replying, digits) if replying is not None else '–'}"


def _gib(count: int) -> str:
    return "–" if count <= 0 else f"{count / GIB:.2f}"


def _delivery_row(level: LevelResult, has_ref: bool) -> list[str]:
    """RTF, underruns and how the replies ended of a level: "n/a" where no turn has the figure (``null`` in
    results.json). Every count is of the level's turns, as the latency table's."""
    ours = summarize(level.turns)
    rtf = ours["rtf"]
    row = [str(level.concurrency), f"{_f(rtf.p50, 2)} / {_f(rtf.p90, 2)}" if rtf.n else NA]
    if has_ref:
        ref_rtf = summarize(level.reference_metrics())["rtf"]
        row.append(_f(ref_rtf.p50, 2) if ref_rtf.n else NA)
    underruns = [t.underruns for t in level.turns if t.underruns is not None]
    starved = ours["starved_ms"]
    ended = ", ".join(f"{STATUS_WORDS.get(k, k)} {v}" for k, v in status_counts(level.turns).items() if v)
    row += [
        str(len(level.turns)),
        str(len(underruns)),
        str(sum(1 for u in underruns if u)) if underruns else NA,
        str(sum(underruns)) if underruns else NA,
        _f(starved.p95) if starved.n else NA,
        ended,
    ]
    return row


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


# --- plots ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PercentileSeries:
    """One source's percentiles at each level of a sweep, drawn as lines against the number of users."""

    label: str
    users: Sequence[int]
    values: Mapping[str, Sequence[float | None]]
    """Percentile (a key of :data:`PERCENTILE_STYLES`) -> one value per level of ``users``; None: no value there."""
    color: str | None = None
    """A matplotlib colour; None: the next of the colour cycle."""


PERCENTILE_STYLES = {"p50": ("-", "o"), "p90": ("--", "^"), "p95": (":", "s")}
"""Line style and marker of each percentile."""


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(out: Path, levels: Sequence[LevelResult], title: str) -> list[Path]:
    """The PNGs of :data:`PLOTS` in ``out``."""
    plt = pyplot()
    paths = [out / name for name in PLOTS]
    for path, draw in zip(paths, (_cdf, _ttfa_vs_level, _rtf_vs_level), strict=True):
        save_figure(plt, draw(plt, levels), path, title)
    return paths


def save_figure(plt, fig, path: Path, title: str) -> None:
    """``fig`` titled ``title``, written to ``path`` as PNG and closed."""
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _cdf(plt, levels: Sequence[LevelResult]):
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, level in enumerate(levels):
        color = colors[i % len(colors)]
        for ax, metric in zip(axes, ("ttfa_ms", "voice_to_voice_ms"), strict=True):
            _cdf_line(ax, [getattr(t, metric) for t in level.turns], color, "-", f"ours, {level.concurrency} users")
            if level.reference is not None:
                _cdf_line(
                    ax,
                    [getattr(t, metric) for t in level.reference_metrics()],
                    color,
                    "--",
                    f"reference, {level.concurrency} users",
                )
    for ax, label in zip(axes, ("time to first audio (ms)", "voice-to-voice (ms)"), strict=True):
        ax.set_xscale("log")
        _plain_ticks(ax.xaxis)
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of turns")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7)
    return fig


def _cdf_line(ax, values: list, color: str, style: str, label: str) -> None:
    data = sorted(v for v in values if v is not None and math.isfinite(v) and v > 0)
    if data:
        fractions = [0.0] + [(i + 1) / len(data) for i in range(len(data))]
        ax.step([data[0], *data], fractions, where="post", color=color, linestyle=style, label=label)


def _plain_ticks(axis) -> None:
    """Log-scale ticks at 1, 2, 5 × 10^k, written as plain numbers."""
    from matplotlib.ticker import LogLocator, NullFormatter, NullLocator, ScalarFormatter

    formatter = ScalarFormatter()
    formatter.set_scientific(False)
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(formatter)
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def percentile_figure(
    plt, series: Sequence[PercentileSeries], ylabel: str, *, log_y: bool = False, line_at: float | None = None
):
    """A figure of ``series`` against the number of users (log2 axis, a tick at every level any series has): one
    colour per series, one line style per percentile; ``log_y`` with plain-number ticks; a grey line at ``line_at``."""
    fig, ax = plt.subplots(figsize=(6, 4))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, s in enumerate(series):
        color = s.color or cycle[i % len(cycle)]
        for q, values in s.values.items():
            style, marker = PERCENTILE_STYLES[q]
            ax.plot(s.users, values, color=color, linestyle=style, marker=marker, label=f"{s.label} {q}")
    xs = sorted({x for s in series for x in s.users})
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("concurrent users")
    ax.set_ylabel(ylabel)
    if log_y:
        ax.set_yscale("log")
        _plain_ticks(ax.yaxis)
    if line_at is not None:
        ax.axhline(line_at, color="grey", linewidth=0.8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def _sources(levels: Sequence[LevelResult], metric: str) -> list[PercentileSeries]:
    """p50 / p90 / p95 of ``metric`` per level: ours, and the reference's when the run had one."""
    xs = [level.concurrency for level in levels]
    found = []
    for source, color in (("ours", "tab:blue"), ("reference", "tab:red")):
        if source == "reference" and all(level.reference is None for level in levels):
            continue
        summaries = [summarize(level.turns if source == "ours" else level.reference_metrics()) for level in levels]
        values = {q: [getattr(s[metric], q) for s in summaries] for q in PERCENTILE_STYLES}
        found.append(PercentileSeries(source, xs, values, color))
    return found


def _ttfa_vs_level(plt, levels: Sequence[LevelResult]):
    return percentile_figure(plt, _sources(levels, "ttfa_ms"), "time to first audio (ms)", log_y=True)


def _rtf_vs_level(plt, levels: Sequence[LevelResult]):
    return percentile_figure(plt, _sources(levels, "rtf"), "real-time factor (synthesis time / audio)", line_at=1.0)


def write_report(out: Path, info: RunInfo, levels: Sequence[LevelResult], *, plots: bool = True) -> list[Path]:
    """Write ``results.json``, ``report.md`` and (``plots``) the PNGs into ``out``; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / RESULTS_JSON, info, levels)
    md = f"Command: `{info.command}`\n\n{markdown(info, levels)}"
    (out / REPORT_MD).write_text(md, encoding="utf-8")
    paths = [out / RESULTS_JSON, out / REPORT_MD]
    if plots and levels:
        paths += write_plots(out, levels, f"{info.model} · {info.device} · {info.transport}")
    return paths


def where_written(out: Path, paths: Sequence[Path]) -> str:
    """The line that ends a run: the output folder (absolute) and the files written there."""
    names = ", ".join(path.name for path in paths)
    return f"Wrote {names} to {out.resolve()} (the log above is not saved)."

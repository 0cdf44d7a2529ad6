"""Smart Turn v3.2 and the semantic_vad policy on the spoken turn fixtures: accuracy, pause handling, cost.

Renders the fixtures (:mod:`realtime.bench.turn_fixtures`: every sentence by every voice, complete, cut mid-sentence,
and with a 0.6–1.2 s mid-sentence pause), scores each complete and cut turn as the server would after
``score_after_ms`` of silence, and prints:

- the model alone: its decisions at 0.5 (complete turns scored complete, cut turns scored incomplete), the area under
  its ROC curve, per voice;
- the policy at each eagerness (:class:`realtime.turns.semantic.SemanticPolicy`): the share of pauses in which the
  server takes the turn (the turn ends before the pause does), the share of cut turns ended at once, and when
  complete turns end (ms of silence: at once, median, 90th percentile);
- the model's CPU cost on one thread: one turn a call, and batches of 8.

Usage, from the repository root: ``python -m scripts.turn_accuracy [--voices N] [--sentences N]`` (needs the
``turn`` extra, ``espeak-ng`` and ``sox``; the whole set takes a few minutes on one core).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from realtime.bench.turn_fixtures import SENTENCES, VOICES, TurnClip, TurnKind, render_all
from realtime.turns.semantic import Eagerness, SemanticPolicy, SemanticVadConfig
from realtime.turns.smart_turn import SmartTurnModel

BATCH = 8


def score(model: SmartTurnModel, audios: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([model(audios[i : i + BATCH]) for i in range(0, len(audios), BATCH)])


def auc(positive: np.ndarray, negative: np.ndarray) -> float:
    """P(a random complete turn scores above a random cut one), ties counting half."""
    above = (positive[:, None] > negative[None, :]).mean()
    ties = (positive[:, None] == negative[None, :]).mean()
    return float(above + ties / 2)


def model_table(clips: list[TurnClip], complete: np.ndarray, cut: np.ndarray) -> list[str]:
    lines = ["| voice | complete scored complete | cut scored incomplete | accuracy | AUC |", "|---|---|---|---|---|"]
    voices = [c.voice for c in clips if c.kind is TurnKind.COMPLETE]
    for voice in [*dict.fromkeys(voices), None]:
        mask = np.array([voice is None or v == voice for v in voices])
        c, x = complete[mask], cut[mask]
        right_c, right_x = float((c >= 0.5).mean()), float((x < 0.5).mean())
        label = "all" if voice is None else voice.label
        lines.append(f"| {label} | {right_c:.0%} | {right_x:.0%} | {(right_c + right_x) / 2:.0%} | {auc(c, x):.2f} |")
    return lines


def policy_table(config: SemanticVadConfig, complete: np.ndarray, cut: np.ndarray, pauses: np.ndarray) -> list[str]:
    lines = [
        "| eagerness | pauses taken over | cut turns ended at once | complete ended at once "
        "| complete end p50 (ms) | complete end p90 (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for eagerness in Eagerness:
        policy = SemanticPolicy(eagerness, config)
        cut_end = np.array([policy.end_of_turn_ms(float(p)) for p in cut])
        complete_end = np.array([policy.end_of_turn_ms(float(p)) for p in complete])
        at_once = config.score_after_ms
        lines.append(
            f"| {eagerness.value} | {(cut_end < pauses).mean():.0%} | {(cut_end <= at_once).mean():.0%} "
            f"| {(complete_end <= at_once).mean():.0%} | {np.percentile(complete_end, 50):.0f} "
            f"| {np.percentile(complete_end, 90):.0f} |"
        )
    return lines


def cost_lines(model: SmartTurnModel, audio: np.ndarray, repeats: int) -> list[str]:
    lines = []
    for batch in (1, BATCH):
        audios = [audio] * batch
        model(audios)  # warm-up: onnxruntime plans its kernels on the first run
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model(audios)
            times.append(time.perf_counter() - start)
        median, least = 1000 * float(np.median(times)), 1000 * min(times)
        lines.append(
            f"- batch of {batch}: {median:.1f} ms a call (fastest {least:.1f}), {median / batch:.1f} ms a turn; "
            f"{repeats} calls"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--voices", type=int, default=len(VOICES), help="the first N voices")
    parser.add_argument("--sentences", type=int, default=len(SENTENCES), help="the first N sentences")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per batch size")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    config = SemanticVadConfig()
    clips = render_all(SENTENCES[: args.sentences], VOICES[: args.voices])
    model = SmartTurnModel.bundled(threads=1)
    silence = config.score_after_ms
    complete = score(model, [c.with_silence(silence) for c in clips if c.kind is TurnKind.COMPLETE])
    cut = score(model, [c.until_pause(silence) for c in clips if c.kind is TurnKind.PAUSE])
    pauses = np.array([c.pause_ms for c in clips if c.kind is TurnKind.PAUSE])
    print(f"{len(complete)} complete and {len(cut)} cut turns, scored after {silence} ms of silence; ", end="")
    print(f"pauses {pauses.min()}–{pauses.max()} ms (measured)\n")
    print("\n".join(model_table(clips, complete, cut)), end="\n\n")
    print("\n".join(policy_table(config, complete, cut, pauses)), end="\n\n")
    longest = max((c for c in clips if c.kind is TurnKind.COMPLETE), key=lambda c: len(c.audio))
    print("\n".join(cost_lines(model, longest.with_silence(silence), args.repeats)))


if __name__ == "__main__":
    main()

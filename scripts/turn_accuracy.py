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
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from realtime.bench.turn_fixtures import RATE, SENTENCES, VOICES, TurnClip, TurnKind, read_folder, render_all
from realtime.turns.semantic import Eagerness, SemanticPolicy, SemanticVadConfig
from realtime.turns.smart_turn import SmartTurnModel

BATCH = 8

# Words after which an English sentence cannot end, written from grammar before any transcript was looked at: each
# needs a complement that has not been said yet. Left out on purpose, because they end sentences often: words that are
# also pronouns or objects ("that", "you", "it", "her", "his", "some", "each", "either"), phrasal-verb particles or
# adverbs ("in", "on", "up", "out", "off", "over", "down", "by", "through", "between", "without"), verbs that end
# elliptical answers ("do", "have", "be", "been", "like": "what is it like?"), wh-words ("who", "which", "what"),
# "so", "then", "not", "too". Known misses the other way, held although complete: a stranded preposition ending a
# wh-question ("what is it for?") and an elided verb phrase after a modal or "is" ("call me when you can").
INCOMPLETE_WORDS = frozenset(
    # articles and determiners that need a noun
    "a an the every "
    # possessive determiners (not "his" / "her": both also stand alone)
    "my your our their its whose "
    # coordinating conjunctions
    "and or but nor "
    # subordinating conjunctions and comparatives that need a clause or a term
    "because although if unless whereas whether than as "
    # prepositions that are not also phrasal-verb particles
    "of to for from with at into onto upon about towards toward during among per via "
    # modals, the copula and auxiliary forms of "be" (an auxiliary needs its verb phrase)
    "can could would should will shall may might must is are was were am "
    # subject pronouns (need a verb)
    "i we they he she "
    # a subject with a contracted auxiliary cannot end a sentence ("yes, I'm" is not English)
    "i'm i'll i'd i've we're we'll we'd we've they're they'll they'd they've you're you'll you'd you've "
    "he's he'll he'd she's she'll she'd it'll there's "
    # degree words that need what they modify
    "very "
    # hesitations: the speaker holds the floor
    "um uh er".split()
)


def score(model: SmartTurnModel, audios: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([model(audios[i : i + BATCH]) for i in range(0, len(audios), BATCH)])


def auc(positive: np.ndarray, negative: np.ndarray) -> float:
    """P(a random complete turn scores above a random cut one), ties counting half."""
    above = (positive[:, None] > negative[None, :]).mean()
    ties = (positive[:, None] == negative[None, :]).mean()
    return float(above + ties / 2)


def last_word(text: str) -> str:
    """The last word of ``text``, lower case, without punctuation (apostrophes kept); "" for no word."""
    words = re.findall(r"[a-z']+", text.lower())
    return words[-1] if words else ""


def ends_incomplete(text: str) -> bool:
    """The lexical cue: ``text`` ends on a word of :data:`INCOMPLETE_WORDS` (an empty text says nothing: False)."""
    return last_word(text) in INCOMPLETE_WORDS


class Transcriber:
    """pocketsphinx's bundled en-US acoustic model, language model and dictionary, one utterance a call, on the calling
    thread (pocketsphinx decodes on one thread)."""

    def __init__(self) -> None:
        from pocketsphinx import Decoder

        # dither: the fixtures' digital silence (exact zeros, which no microphone gives) upsets the features' log
        # energies; with it, half as many again of the final words were right on two voices
        self._decoder = Decoder(samprate=RATE, dither=True, loglevel="FATAL")

    def __call__(self, audio: np.ndarray) -> str:
        """The transcript of 16 kHz mono float32 ``audio``: lower-case words separated by spaces."""
        pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
        self._decoder.start_utt()
        self._decoder.process_raw(pcm, full_utt=True)
        self._decoder.end_utt()
        hyp = self._decoder.hyp()
        return hyp.hypstr.lower() if hyp is not None else ""


@dataclass(frozen=True)
class Heard:
    """One scored turn: what was said and heard, Smart Turn's probability, the decode's wall time (ms)."""

    voice: str
    complete: bool
    said: str
    heard: str
    probability: float
    decode_ms: float

    @property
    def word_right(self) -> bool:
        return last_word(self.heard) == last_word(self.said)

    @property
    def lexical(self) -> float:
        """The lexical cue as a score: 0 when the transcript ends on an incomplete word, else 1."""
        return 0.0 if ends_incomplete(self.heard) else 1.0

    @property
    def combined(self) -> float:
        """0 when the transcript ends on an incomplete word, else Smart Turn's probability."""
        return 0.0 if ends_incomplete(self.heard) else self.probability


def transcribe_turns(clips: list[TurnClip], silence_ms: int, complete: np.ndarray, cut: np.ndarray) -> list[Heard]:
    """Every complete and cut turn transcribed as the detector would have heard it (``silence_ms`` into the silence),
    beside its Smart Turn probability: complete turns first, then cut turns, in ``clips`` order."""
    transcriber = Transcriber()
    before = {s.text: s.before for s in SENTENCES}
    turns = [(c, True, c.text, c.with_silence(silence_ms)) for c in clips if c.kind is TurnKind.COMPLETE]
    turns += [(c, False, before[c.text], c.until_pause(silence_ms)) for c in clips if c.kind is TurnKind.PAUSE]
    transcriber(turns[0][3])  # warm-up: the first decode loads the language model's pages
    heard = []
    for (clip, is_complete, said, audio), probability in zip(turns, [*complete, *cut], strict=True):
        start = time.perf_counter()
        text = transcriber(audio)
        heard.append(
            Heard(clip.voice.label, is_complete, said, text, float(probability), 1000 * (time.perf_counter() - start))
        )
    return heard


def lexical_table(heard: list[Heard]) -> list[str]:
    lines = [
        "| voice | final word right, complete / cut | Smart Turn AUC / acc. | lexical AUC / acc. "
        "| combined AUC / acc. | decode ms p50 / p90 |",
        "|---|---|---|---|---|---|",
    ]
    for voice in [*dict.fromkeys(h.voice for h in heard), None]:
        rows = [h for h in heard if voice is None or h.voice == voice]
        cells = [
            f"{np.mean([h.word_right for h in rows if h.complete]):.0%} / "
            f"{np.mean([h.word_right for h in rows if not h.complete]):.0%}"
        ]
        for signal in ("probability", "lexical", "combined"):
            c = np.array([getattr(h, signal) for h in rows if h.complete])
            x = np.array([getattr(h, signal) for h in rows if not h.complete])
            cells.append(f"{auc(c, x):.2f} / {((c >= 0.5).mean() + (x < 0.5).mean()) / 2:.0%}")
        ms = [h.decode_ms for h in rows]
        cells.append(f"{np.percentile(ms, 50):.0f} / {np.percentile(ms, 90):.0f}")
        lines.append(f"| {'all' if voice is None else voice} | {' | '.join(cells)} |")
    return lines


def lexical_summary(heard: list[Heard]) -> list[str]:
    cut = [h for h in heard if not h.complete]
    complete = [h for h in heard if h.complete]
    said_cut = np.mean([ends_incomplete(h.said) for h in cut])
    return [
        f"- cut points ending on a listed word (the fixture text): {said_cut:.0%}; "
        f"complete sentences ending on one: {np.mean([ends_incomplete(h.said) for h in complete]):.0%}",
        f"- transcripts ending on a listed word: cut {np.mean([ends_incomplete(h.heard) for h in cut]):.0%}, "
        f"complete {np.mean([ends_incomplete(h.heard) for h in complete]):.0%}",
        f"- empty transcripts: {sum(not h.heard for h in heard)} of {len(heard)}",
    ]


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
    parser.add_argument("--fixtures", type=Path, help="a folder from `python -m realtime.bench.turn_fixtures DIR`")
    parser.add_argument(
        "--words", action="store_true", help="also transcribe each turn (pocketsphinx): the lexical cue"
    )
    parser.add_argument("--show", action="store_true", help="with --words: print every transcript")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    config = SemanticVadConfig()
    sentences, voices = SENTENCES[: args.sentences], VOICES[: args.voices]
    if args.fixtures is not None:
        texts, labels = {s.text for s in sentences}, {v.label for v in voices}
        clips = [c for c in read_folder(args.fixtures).values() if c.text in texts and c.voice.label in labels]
    else:
        clips = render_all(sentences, voices)
    model = SmartTurnModel.bundled(threads=1)
    silence = config.score_after_ms
    complete = score(model, [c.with_silence(silence) for c in clips if c.kind is TurnKind.COMPLETE])
    cut = score(model, [c.until_pause(silence) for c in clips if c.kind is TurnKind.PAUSE])
    pauses = np.array([c.pause_ms for c in clips if c.kind is TurnKind.PAUSE])
    print(f"{len(complete)} complete and {len(cut)} cut turns, scored after {silence} ms of silence; ", end="")
    print(f"pauses {pauses.min()}–{pauses.max()} ms (measured)\n")
    print("\n".join(model_table(clips, complete, cut)), end="\n\n")
    print("\n".join(policy_table(config, complete, cut, pauses)), end="\n\n")
    if args.words:
        heard = transcribe_turns(clips, silence, complete, cut)
        if args.show:
            for h in heard:
                kind = "complete" if h.complete else "cut"
                print(f"{h.voice:22} {kind:8} {h.probability:.2f} {h.said!r} -> {h.heard!r}")
        print("\n".join(lexical_table(heard)), end="\n\n")
        print("\n".join(lexical_summary(heard)), end="\n\n")
        n = len(complete)
        combined = np.array([h.combined for h in heard])
        print("The policy reading the combined score in place of Smart Turn's:")
        print("\n".join(policy_table(config, combined[:n], combined[n:], pauses)), end="\n\n")
    longest = max((c for c in clips if c.kind is TurnKind.COMPLETE), key=lambda c: len(c.audio))
    print("\n".join(cost_lines(model, longest.with_silence(silence), args.repeats)))


if __name__ == "__main__":
    main()

"""Spoken turns for end-of-turn detection, synthesized reproducibly with espeak-ng and sox.

Each :class:`Sentence` is spoken by each :class:`Voice` twice:

- plainly: a *complete* turn;
- with an SSML ``<break>`` of 0.6–1.2 s at a point where the sentence cannot end (after "for", "and", "the", ...):
  a *pause* turn (the user pauses mid-sentence and goes on). espeak speaks the words before the break with the
  intonation of an unfinished sentence, as a speaker who pauses does. The same audio cut at the pause is a *cut*
  turn (a sentence that stops mid-way).

The pause length of each (sentence, voice) is drawn from ``random.Random(f"{seed}/{sentence}/{voice}")``; with the
same espeak-ng and sox versions the audio is the same on every run (espeak and sox are deterministic). Audio is
16 kHz mono float32, peak-normalized by sox to -3 dBFS, with :data:`LEAD_MS` of digital silence before the speech
and none after it: a consumer appends the silence it studies (:meth:`TurnClip.with_silence`). Where the speech
starts and ends, and where the pause lies, is measured on the audio (:data:`SILENCE_LEVEL`).

Needs ``espeak-ng`` and ``sox`` on PATH (Debian: ``apt-get install espeak-ng sox``); ~40 ms of CPU a clip.
"""

from __future__ import annotations

import enum
import json
import random
import shutil
import subprocess
import tempfile
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

RATE = 16_000
"""Rate (Hz) of the clips."""
LEAD_MS = 300
SILENCE_LEVEL = 0.01
"""|sample| at or below this (after normalization to a 0.71 peak) counts as silence."""
RAW_FLOAT = ("-t", "raw", "-e", "floating-point", "-b", "32", "-c", "1", "-r", str(RATE))
"""sox's output format: headerless float32 mono at :data:`RATE`."""
MIN_PAUSE_MS, MAX_PAUSE_MS, PAUSE_STEP_MS = 600, 1200, 50
DEFAULT_SEED = 45


class TurnKind(enum.Enum):
    COMPLETE = "complete"  # the whole sentence, then silence
    CUT = "cut"  # the sentence stops mid-way (at its break), then silence
    PAUSE = "pause"  # the whole sentence with a 0.6–1.2 s pause mid-way


@dataclass(frozen=True)
class Sentence:
    """A user's sentence, ``|`` marking the mid-sentence pause: the words before it do not end a sentence."""

    marked: str

    def __post_init__(self) -> None:
        before, bar, after = self.marked.partition("|")
        if not bar or "|" in after or not before.strip() or not after.strip():
            raise ValueError(f"mark the pause with one '|' between two words: {self.marked!r}")

    @property
    def before(self) -> str:
        return self.marked.partition("|")[0].strip()

    @property
    def after(self) -> str:
        return self.marked.partition("|")[2].strip()

    @property
    def text(self) -> str:
        return f"{self.before} {self.after}"


@dataclass(frozen=True)
class Voice:
    """An espeak-ng voice (``-v``), its speed in words per minute (``-s``) and pitch 0–99 (``-p``)."""

    name: str
    wpm: int
    pitch: int = 50

    @property
    def label(self) -> str:
        return f"{self.name}@{self.wpm}"


SENTENCES = tuple(
    Sentence(marked)
    for marked in (
        "I would like to book a table for | two people at eight tonight.",
        "Could you tell me how to get to | the nearest train station?",
        "My name is John and I | live in a small town near the coast.",
        "What is the weather like in | Paris this weekend?",
        "I was thinking that maybe we could | go to the cinema later.",
        "Can you remind me to | call my mother after lunch tomorrow?",
        "The meeting has been moved from Monday to | Wednesday afternoon.",
        "Please add milk, eggs and | some bread to my shopping list.",
        "How long does it take to | cook a soft boiled egg?",
        "I need a recipe for a cake that | does not use any eggs.",
        "Tell me a story about a dragon who | was afraid of the dark.",
        "When I get home from work I usually | read for an hour.",
        "Do you know if the museum is open on | Sunday mornings?",
        "I have been learning to play the | guitar for about a year.",
        "Set an alarm for seven and | turn off the lights in the kitchen.",
        "What would happen if the | moon suddenly disappeared?",
        "My favourite kind of music is | jazz from the nineteen fifties.",
        "Could you explain why the sky is | blue during the day?",
        "I am looking for a good book about | the history of Rome.",
        "Yesterday we went to the beach and then | had dinner at a seafood restaurant.",
        "Is it better to | rent an apartment or buy a house?",
        "Translate the word | butterfly into Spanish, please.",
        "Send a message to Anna saying that | I will be ten minutes late.",
        "Which planet in our solar system has the | most moons?",
    )
)
"""Requests a voice assistant hears, each with a break after a word that cannot end it."""

VOICES = (
    Voice("en-us", 175, 50),
    Voice("en-gb", 150, 40),
    Voice("en-us+f3", 160, 65),
    Voice("en-gb-scotland", 190, 45),
    Voice("en-029", 140, 55),
    Voice("en-gb-x-rp+m3", 200, 35),
)
"""American, British, Scottish, Caribbean and RP English; male and female variants; 140–200 words per minute."""


@dataclass(frozen=True)
class TurnClip:
    """One spoken turn: 16 kHz mono float32 ``audio`` from its start (with :data:`LEAD_MS` of silence) to the end of
    its speech. For a pause turn, ``pause_start_ms`` / ``pause_end_ms`` bound the mid-sentence silence; for a cut
    turn, ``speech_end_ms`` is where the pause began."""

    name: str
    kind: TurnKind
    text: str
    voice: Voice
    audio: np.ndarray
    speech_start_ms: int
    speech_end_ms: int
    pause_start_ms: int | None = None
    pause_end_ms: int | None = None

    @property
    def pause_ms(self) -> int | None:
        if self.pause_start_ms is None or self.pause_end_ms is None:
            return None
        return self.pause_end_ms - self.pause_start_ms

    def with_silence(self, silence_ms: int) -> np.ndarray:
        """The audio followed by ``silence_ms`` of digital silence."""
        return np.concatenate([self.audio, np.zeros(silence_ms * RATE // 1000, np.float32)])

    def until_pause(self, silence_ms: int) -> np.ndarray:
        """A pause turn's audio up to ``silence_ms`` into its pause (what a detector has heard then)."""
        if self.pause_start_ms is None:
            raise ValueError(f"{self.name} has no pause")
        return self.audio[: (self.pause_start_ms + silence_ms) * RATE // 1000].copy()

    def manifest_entry(self) -> dict:
        return {
            "kind": self.kind.value,
            "text": self.text,
            "voice": self.voice.name,
            "wpm": self.voice.wpm,
            "pitch": self.voice.pitch,
            "sample_rate": RATE,
            "speech_start_ms": self.speech_start_ms,
            "speech_end_ms": self.speech_end_ms,
            "pause_start_ms": self.pause_start_ms,
            "pause_end_ms": self.pause_end_ms,
        }


def tools_missing() -> list[str]:
    """The programs this module needs that are not on PATH."""
    return [tool for tool in ("espeak-ng", "sox") if shutil.which(tool) is None]


def pause_for(sentence: Sentence, voice: Voice, seed: int = DEFAULT_SEED) -> int:
    """The pause (ms) asked of espeak for this sentence and voice: a fixed draw from 600–1200 ms in 50 ms steps."""
    steps = (MAX_PAUSE_MS - MIN_PAUSE_MS) // PAUSE_STEP_MS
    return MIN_PAUSE_MS + PAUSE_STEP_MS * random.Random(f"{seed}/{sentence.text}/{voice.label}").randint(0, steps)


def synthesize(ssml: str, voice: Voice, workdir: Path) -> np.ndarray:
    """espeak-ng's rendering of the SSML text ``ssml`` by ``voice``, resampled to 16 kHz and peak-normalized to
    -3 dBFS by sox: float32 samples."""
    wav = workdir / "espeak.wav"
    subprocess.run(
        ["espeak-ng", "-m", "-v", voice.name, "-s", str(voice.wpm), "-p", str(voice.pitch), "-w", str(wav), ssml],
        check=True,
        capture_output=True,
    )
    raw = subprocess.run(
        ["sox", str(wav), *RAW_FLOAT, "-", "gain", "-n", "-3"],
        check=True,
        capture_output=True,
    ).stdout
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


def _loud_bounds(x: np.ndarray) -> tuple[int, int]:
    loud = np.flatnonzero(np.abs(x) > SILENCE_LEVEL)
    if not len(loud):
        raise RuntimeError("espeak-ng produced silence")
    return int(loud[0]), int(loud[-1]) + 1


def _longest_gap(x: np.ndarray) -> tuple[int, int]:
    """[start, end) samples of the longest run of silence between two loud samples."""
    loud = np.flatnonzero(np.abs(x) > SILENCE_LEVEL)
    gaps = np.diff(loud)
    i = int(np.argmax(gaps))
    return int(loud[i]) + 1, int(loud[i + 1])


def _ms(samples: int) -> int:
    return samples * 1000 // RATE


def clip_base(sentence: Sentence, voice: Voice) -> str:
    """The name every clip of ``sentence`` by ``voice`` starts with (``<base>.complete``, ``.cut``, ``.pause``)."""
    return f"{'-'.join(sentence.text.lower().split()[:4]).strip('?,.')}.{voice.label}"


def render(sentence: Sentence, voice: Voice, workdir: Path, seed: int = DEFAULT_SEED) -> list[TurnClip]:
    """The complete, cut and pause turns of ``sentence`` spoken by ``voice``."""
    lead = np.zeros(LEAD_MS * RATE // 1000, np.float32)
    base = clip_base(sentence, voice)

    plain = synthesize(sentence.text, voice, workdir)
    start, end = _loud_bounds(plain)
    complete = np.concatenate([lead, plain[start:end]])
    clips = [
        TurnClip(f"{base}.complete", TurnKind.COMPLETE, sentence.text, voice, complete, LEAD_MS, _ms(len(complete)))
    ]

    ssml = f'{sentence.before} <break time="{pause_for(sentence, voice, seed)}ms"/> {sentence.after}'
    paused = synthesize(ssml, voice, workdir)
    start, end = _loud_bounds(paused)
    paused = np.concatenate([lead, paused[start:end]])
    gap_start, gap_end = _longest_gap(paused)
    cut = paused[:gap_start].copy()
    clips.append(TurnClip(f"{base}.cut", TurnKind.CUT, sentence.before, voice, cut, LEAD_MS, _ms(len(cut))))
    clips.append(
        TurnClip(
            f"{base}.pause",
            TurnKind.PAUSE,
            sentence.text,
            voice,
            paused,
            LEAD_MS,
            _ms(len(paused)),
            pause_start_ms=_ms(gap_start),
            pause_end_ms=_ms(gap_end),
        )
    )
    return clips


def render_all(
    sentences: tuple[Sentence, ...] = SENTENCES, voices: tuple[Voice, ...] = VOICES, seed: int = DEFAULT_SEED
) -> list[TurnClip]:
    """Every sentence by every voice: ``3 * len(sentences) * len(voices)`` clips, sentence-major."""
    missing = tools_missing()
    if missing:
        raise RuntimeError(f"{', '.join(missing)} not found on PATH (Debian: apt-get install espeak-ng sox)")
    with tempfile.TemporaryDirectory(prefix="turn-fixtures-") as tmp:
        return [clip for s in sentences for v in voices for clip in render(s, v, Path(tmp), seed)]


def write_folder(clips: list[TurnClip], out: Path) -> None:
    """The clips as 16-bit WAVs in ``out`` with a ``manifest.json`` ({file: entry}), for the bench or a listener."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for clip in clips:
        with wave.open(str(out / f"{clip.name}.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(RATE)
            w.writeframes((np.clip(clip.audio, -1, 1) * 32767).astype("<i2").tobytes())
        manifest[f"{clip.name}.wav"] = clip.manifest_entry()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def read_folder(folder: Path) -> dict[str, TurnClip]:
    """The clips :func:`write_folder` wrote, by name (audio back from 16-bit: within 1/32767 of the rendering), so
    that a machine without espeak-ng and sox plays the same turns. ``ValueError`` when the folder is not one."""
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        raise ValueError(f"{folder} holds no manifest.json (write one with realtime.bench.turn_fixtures)")
    voices = {(v.name, v.wpm, v.pitch): v for v in VOICES}
    clips = {}
    for file, entry in json.loads(manifest_path.read_text()).items():
        if entry["sample_rate"] != RATE:
            raise ValueError(f"{file}: sample rate {entry['sample_rate']}, expected {RATE}")
        with wave.open(str(folder / file), "rb") as w:
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        name = file.removesuffix(".wav")
        voice = voices.get((entry["voice"], entry["wpm"], entry["pitch"])) or Voice(
            entry["voice"], entry["wpm"], entry["pitch"]
        )
        clips[name] = TurnClip(
            name,
            TurnKind(entry["kind"]),
            entry["text"],
            voice,
            pcm.astype(np.float32) / 32767,
            entry["speech_start_ms"],
            entry["speech_end_ms"],
            entry["pause_start_ms"],
            entry["pause_end_ms"],
        )
    return clips


def main(argv: list[str] | None = None) -> int:
    """``python -m realtime.bench.turn_fixtures DIR``: render every clip into DIR (for a machine without espeak-ng)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m realtime.bench.turn_fixtures", description=main.__doc__)
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    try:
        clips = render_all()
    except RuntimeError as exc:
        parser.exit(2, f"error: {exc}\n")
    write_folder(clips, args.folder)
    print(f"{len(clips)} clips in {args.folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The voices that speak the turn fixtures (:mod:`realtime.bench.turn_fixtures`), on two synthesizers:

- :class:`EspeakVoice`: espeak-ng's formant voices. The pause is an SSML ``<break>``: espeak speaks the words before
  it with the intonation of an unfinished sentence.
- :class:`FestivalVoice`: festival's voices, among them an HTS voice (``cmu_us_slt_arctic_hts``: a statistical
  model trained on one speaker's recordings, with learned durations and intonation) and diphone voices (a speaker's
  recorded diphones, rule-based intonation). The sentence is synthesized whole; sox inserts the pause at the end of
  the word before it, as festival timed that word, so the words before the pause keep the intonation of a sentence
  that goes on.

Every rendering is 16 kHz mono float32, resampled and peak-normalized to -3 dBFS by sox. Both synthesizers and sox
are deterministic: the same versions give the same audio on every run. Each voice names the programs it needs
(:attr:`tools`); a missing one is reported by :func:`tools_missing` before anything runs, with the packages to
install.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

RATE = 16_000
"""Rate (Hz) of the renderings."""
RAW_FLOAT = ("-t", "raw", "-e", "floating-point", "-b", "32", "-c", "1", "-r", str(RATE))
"""sox's output format: headerless float32 mono at :data:`RATE`."""
NORMALIZE = ("gain", "-n", "-3")
"""sox's last effect: peak-normalized to -3 dBFS."""

INSTALL = {
    "espeak-ng": "espeak-ng",
    "sox": "sox",
    "festival": "festival festvox-us-slt-hts festvox-kallpc16k festvox-kdlpc16k",
}
"""Debian packages that provide each program (festival: with the voices :data:`FESTIVAL_VOICES` use)."""


def sox_to_float(wav: Path, *effects: str) -> np.ndarray:
    """``wav`` through sox's ``effects``, resampled to 16 kHz mono and peak-normalized: float32 samples."""
    raw = subprocess.run(
        ["sox", str(wav), *RAW_FLOAT, "-", *effects, *NORMALIZE], check=True, capture_output=True
    ).stdout
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


@dataclass(frozen=True)
class EspeakVoice:
    """An espeak-ng voice (``-v``), its speed in words per minute (``-s``) and pitch 0–99 (``-p``)."""

    name: str
    wpm: int
    pitch: int = 50

    engine: ClassVar[str] = "espeak-ng"
    tools: ClassVar[tuple[str, ...]] = ("espeak-ng", "sox")

    @property
    def label(self) -> str:
        return f"{self.name}@{self.wpm}"

    def speak(self, text: str, workdir: Path) -> np.ndarray:
        """``text`` spoken plainly."""
        return self._synthesize(text, workdir)

    def speak_paused(self, before: str, after: str, pause_ms: int, workdir: Path) -> np.ndarray:
        """``before``, an SSML break of ``pause_ms``, ``after``: one utterance."""
        return self._synthesize(f'{before} <break time="{pause_ms}ms"/> {after}', workdir)

    def manifest(self) -> dict:
        return {"engine": self.engine, "voice": self.name, "wpm": self.wpm, "pitch": self.pitch}

    def _synthesize(self, ssml: str, workdir: Path) -> np.ndarray:
        wav = workdir / "espeak.wav"
        subprocess.run(
            ["espeak-ng", "-m", "-v", self.name, "-s", str(self.wpm), "-p", str(self.pitch), "-w", str(wav), ssml],
            check=True,
            capture_output=True,
        )
        return sox_to_float(wav)


@dataclass(frozen=True)
class FestivalVoice:
    """A festival voice (``voice_<name>``) at ``rate`` times its own speed (an HTS voice: hts_engine's speed;
    others: festival's ``Duration_Stretch`` of ``1 / rate``)."""

    name: str
    rate: float = 1.0

    engine: ClassVar[str] = "festival"
    tools: ClassVar[tuple[str, ...]] = ("festival", "sox")

    def __post_init__(self) -> None:
        if not self.name.replace("_", "").isalnum() or not 0.5 <= self.rate <= 2.0:
            raise ValueError(f"a festival voice name and a rate in [0.5, 2], got {self.name!r} at {self.rate}")

    @property
    def label(self) -> str:
        return f"{self.name}@{self.rate:g}x"

    def speak(self, text: str, workdir: Path) -> np.ndarray:
        """``text`` spoken plainly."""
        wav, _ = self._synthesize(text, workdir)
        return sox_to_float(wav)

    def speak_paused(self, before: str, after: str, pause_ms: int, workdir: Path) -> np.ndarray:
        """``before`` and ``after`` spoken as one sentence, with ``pause_ms`` of silence inserted by sox where
        festival ended the last word of ``before``. ``RuntimeError`` when festival's words are not ``before``'s."""
        wav, word_ends = self._synthesize(f"{before} {after}", workdir)
        spoken = [word for word, _ in word_ends]
        wanted = [_word(w) for w in before.split()]
        if spoken[: len(wanted)] != wanted:
            raise RuntimeError(f"festival's words {spoken} do not begin with {wanted}: cannot place the pause")
        boundary_s = word_ends[len(wanted) - 1][1]
        return sox_to_float(wav, "pad", f"{pause_ms / 1000:.3f}@{boundary_s:.6f}")

    def manifest(self) -> dict:
        return {"engine": self.engine, "voice": self.name, "rate": self.rate}

    def _synthesize(self, text: str, workdir: Path) -> tuple[Path, list[tuple[str, float]]]:
        """festival's WAV of ``text`` (its own rate) and each word's end (s), in order."""
        wav, script = workdir / "festival.wav", workdir / "festival.scm"
        if self.name.endswith("_hts"):
            speed = f'(set! hts_engine_params (append hts_engine_params (list (list "-r" {self.rate}))))'
        else:
            speed = f"(Parameter.set 'Duration_Stretch {1 / self.rate})"
        quoted = text.replace("\\", "\\\\").replace('"', '\\"')
        script.write_text(
            f"(voice_{self.name})\n{speed}\n"
            f'(set! utt (utt.synth (Utterance Text "{quoted}")))\n'
            f'(utt.save.wave utt "{wav}" \'riff)\n'
            '(mapcar (lambda (w) (format t "word %s %f\\n" (item.name w) (item.feat w "word_end")))'
            " (utt.relation.items utt 'Word))\n"
        )
        done = subprocess.run(["festival", "--batch", str(script)], capture_output=True, text=True)
        if done.returncode != 0 or "SIOD ERROR" in done.stdout + done.stderr:
            raise RuntimeError(
                f"festival failed with voice {self.name} (is its voice package installed? "
                f"apt-get install {INSTALL['festival']}): {(done.stdout + done.stderr).strip()[-500:]}"
            )
        ends = []
        for line in done.stdout.splitlines():
            tag, _, rest = line.partition(" ")
            if tag == "word":
                word, end = rest.rsplit(" ", 1)
                ends.append((word.lower(), float(end)))
        if not ends or not wav.is_file():
            raise RuntimeError(f"festival spoke no words of {text!r} with voice {self.name}")
        return wav, ends


def _word(token: str) -> str:
    """A written word as festival names it in its Word relation: lower case, no punctuation."""
    return "".join(ch for ch in token.lower() if ch.isalnum() or ch == "'")


Voice = EspeakVoice | FestivalVoice
"""A voice of either synthesizer."""

ESPEAK_VOICES: tuple[Voice, ...] = (
    EspeakVoice("en-us", 175, 50),
    EspeakVoice("en-gb", 150, 40),
    EspeakVoice("en-us+f3", 160, 65),
    EspeakVoice("en-gb-scotland", 190, 45),
    EspeakVoice("en-029", 140, 55),
    EspeakVoice("en-gb-x-rp+m3", 200, 35),
)
"""American, British, Scottish, Caribbean and RP English; male and female variants; 140–200 words per minute."""

FESTIVAL_VOICES: tuple[Voice, ...] = (
    FestivalVoice("cmu_us_slt_arctic_hts", 1.0),
    FestivalVoice("cmu_us_slt_arctic_hts", 1.15),
    FestivalVoice("cmu_us_slt_arctic_hts", 0.9),
    FestivalVoice("kal_diphone", 1.0),
    FestivalVoice("kal_diphone", 1.15),
    FestivalVoice("ked_diphone", 1.0),
)
"""festival's HTS voice (US English, female) at three speeds, and two US English male diphone voices."""


def voice_from_manifest(entry: dict) -> Voice:
    """The voice a clip's manifest entry names (:meth:`EspeakVoice.manifest`, :meth:`FestivalVoice.manifest`); an
    entry without ``engine`` is espeak-ng's. ``ValueError`` for an unknown engine."""
    engine = entry.get("engine", EspeakVoice.engine)
    if engine == EspeakVoice.engine:
        return EspeakVoice(entry["voice"], entry["wpm"], entry["pitch"])
    if engine == FestivalVoice.engine:
        return FestivalVoice(entry["voice"], entry["rate"])
    raise ValueError(f"unknown speech engine {engine!r} in a manifest entry")


def tools_missing(voices: tuple[Voice, ...]) -> list[str]:
    """The programs ``voices`` need that are not on PATH."""
    needed = dict.fromkeys(tool for voice in voices for tool in voice.tools)
    return [tool for tool in needed if shutil.which(tool) is None]


def install_hint(tools: list[str]) -> str:
    """``'<tools> not found on PATH (Debian: apt-get install <packages>)'``."""
    packages = " ".join(INSTALL[t] for t in tools)
    return f"{', '.join(tools)} not found on PATH (Debian: apt-get install {packages})"

"""Synthesize the spoken test fixtures in tests/fixtures/speech/ with espeak-ng.

Each clip is 16-bit mono 24 kHz WAV (the Realtime API's ``audio/pcm`` rate): the synthesized speech,
trimmed of espeak's own edge silence and normalized to a fixed peak, with exact digital silence
added before (0.3 s) and after (1.0 s). ``manifest.json`` records each clip's text and where its
speech starts and ends, so tests and latency benchmarks know the true boundaries.

Usage, from the repository root: ``python -m scripts.make_speech_fixtures [--out DIR]`` (needs ``espeak-ng`` on PATH:
``apt-get install espeak-ng``). Output depends on the espeak-ng version; the committed files were
made with espeak-ng 1.51.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from realtime.media.audio import encode_pcm16, float_to_pcm16, resample

RATE = 24_000
LEAD_S = 0.3
TAIL_S = 1.0
PEAK = 0.7  # -3 dBFS: loud enough for any VAD, far from clipping after resampling
EDGE_LEVEL = 0.01  # |sample| above this counts as speech when trimming espeak's edges
VOICE = "en-us"
WORDS_PER_MINUTE = 165


@dataclass(frozen=True)
class Clip:
    name: str
    text: str


CLIPS = [
    Clip("capital_of_france", "What is the capital of France?"),
    Clip("short_joke", "Tell me a short joke."),
    Clip("weather_today", "How is the weather today?"),
    Clip("count_to_five", "Can you count to five?"),
    # a two-turn conversation: the second question needs the first turn's context
    Clip("pair_turn1_name", "Hi, my name is Anna, and I live in Berlin."),
    Clip("pair_turn2_recall", "Do you remember my name and where I live?"),
    # ~20 s of continuous speech for latency tests; commas keep espeak's pauses short of a turn end
    Clip(
        "long_story",
        "I would like you to help me plan a weekend trip, because my sister is visiting from abroad, "
        "and she has never been to the mountains before, so we are thinking about renting a small cabin "
        "near a lake, going for long walks in the forest, cooking dinner together in the evening, "
        "so what should we pack, and what else could we do there together?",
    ),
]


def synthesize(text: str) -> tuple[np.ndarray, int]:
    """espeak-ng's rendering of ``text``: float samples and their rate."""
    wav_bytes = subprocess.run(
        ["espeak-ng", "-v", VOICE, "-s", str(WORDS_PER_MINUTE), "--stdout", text],
        check=True,
        capture_output=True,
    ).stdout
    with wave.open(io.BytesIO(wav_bytes)) as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise RuntimeError("espeak-ng did not produce 16-bit mono audio")
        rate = w.getframerate()
        # espeak writes to a pipe, so the header's frame count is a placeholder: read everything
        frames = w.readframes(2**31 - 1)
    pcm = np.frombuffer(frames, dtype="<i2")
    return pcm.astype(np.float32) / 32768.0, rate


def render(clip: Clip) -> tuple[np.ndarray, dict]:
    """The fixture's 24 kHz float samples and its manifest entry."""
    speech, rate = synthesize(clip.text)
    loud = np.flatnonzero(np.abs(speech) > EDGE_LEVEL)
    speech = resample(speech[loud[0] : loud[-1] + 1], rate, RATE)
    speech *= PEAK / np.abs(speech).max()
    lead, tail = np.zeros(round(LEAD_S * RATE), np.float32), np.zeros(round(TAIL_S * RATE), np.float32)
    samples = np.concatenate([lead, speech, tail])
    entry = {
        "text": clip.text,
        "sample_rate": RATE,
        "duration_ms": round(1000 * len(samples) / RATE),
        "speech_start_ms": round(1000 * len(lead) / RATE),
        "speech_end_ms": round(1000 * (len(lead) + len(speech)) / RATE),
    }
    return samples, entry


def write_wav(path: Path, samples: np.ndarray) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(encode_pcm16(float_to_pcm16(samples)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests/fixtures/speech")
    args = parser.parse_args()
    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng not found: apt-get install espeak-ng")
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for clip in CLIPS:
        samples, entry = render(clip)
        write_wav(args.out / f"{clip.name}.wav", samples)
        manifest[f"{clip.name}.wav"] = entry
        print(f"{clip.name}.wav  {entry['duration_ms'] / 1000:.2f} s  {clip.text!r}")
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""The spoken inputs of a benchmark: any folder of WAVs, as 24 kHz mono float32 with the real
start and end of speech in each file.

Speech bounds come from the folder's ``manifest.json`` when it names the file (the fixtures in
``tests/fixtures/speech`` have one: ``{file: {"speech_start_ms", "speech_end_ms", ...}}``), else
from :func:`energy_speech_bounds`. Files are played whole (leading and trailing silence included),
as a microphone would deliver them; :func:`with_pause` makes the user pause once mid-sentence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

RATE = 24_000
"""Rate (Hz) of the audio the bench plays: the Realtime API's ``audio/pcm``."""

MANIFEST = "manifest.json"
DEFAULT_FOLDER = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "speech"
"""The spoken fixtures of a source checkout (English questions made with espeak-ng)."""


class SpeechFolderError(ValueError):
    """A WAV folder the bench cannot use (message says why)."""


@dataclass(frozen=True)
class Speech:
    """One spoken input. ``pcm``: float32 mono at :data:`RATE`; bounds in ms from the file start."""

    name: str
    pcm: np.ndarray
    speech_start_ms: float
    speech_end_ms: float
    bounds_from: str
    """``manifest`` or ``energy``."""

    @property
    def duration_ms(self) -> float:
        return 1000.0 * len(self.pcm) / RATE


def energy_speech_bounds(
    pcm: np.ndarray, rate: int, *, frame_ms: float = 20.0, below_peak_db: float = 35.0, floor_dbfs: float = -55.0
) -> tuple[float, float] | None:
    """(start_ms, end_ms) of speech: the first and last ``frame_ms`` frame whose RMS is within
    ``below_peak_db`` of the loudest frame and above ``floor_dbfs``. ``None`` for a silent file.
    A simple energy gate: good for clean recordings (TTS, studio), not for noisy ones."""
    frame = max(1, int(rate * frame_ms / 1000))
    n = len(pcm) // frame
    if n == 0:
        return None
    frames = np.asarray(pcm[: n * frame], dtype=np.float64).reshape(n, frame)
    rms_db = 10.0 * np.log10(np.mean(frames**2, axis=1) + 1e-20)
    gate = max(float(rms_db.max()) - below_peak_db, floor_dbfs)
    loud = np.flatnonzero(rms_db >= gate)
    if not len(loud):
        return None
    return float(loud[0] * frame_ms), float((loud[-1] + 1) * frame_ms)


def load_wav(path: Path) -> np.ndarray:
    """A WAV (any rate, any channel count) as float32 mono at :data:`RATE`."""
    import soundfile as sf
    import soxr

    pcm, rate = sf.read(str(path), dtype="float32", always_2d=True)
    mono = pcm.mean(axis=1)
    if rate != RATE:
        mono = soxr.resample(mono, rate, RATE)
    return np.ascontiguousarray(mono, dtype=np.float32)


def load_speech_folder(folder: Path, *, max_seconds: float | None = None) -> list[Speech]:
    """Every ``*.wav`` of ``folder`` in name order, longer files than ``max_seconds`` left out.
    Raises :class:`SpeechFolderError` when nothing usable is left."""
    folder = Path(folder)
    paths = sorted(folder.glob("*.wav"))
    if not paths:
        raise SpeechFolderError(f"no .wav files in {folder}")
    manifest = _manifest(folder)
    found = []
    for path in paths:
        pcm = load_wav(path)
        if max_seconds is not None and len(pcm) > max_seconds * RATE:
            continue
        found.append(_speech(path.name, pcm, manifest.get(path.name)))
    speeches = [s for s in found if s is not None]
    if not speeches:
        raise SpeechFolderError(f"no WAV in {folder} has speech (and is at most {max_seconds} s long)")
    return speeches


def _speech(name: str, pcm: np.ndarray, entry: dict | None) -> Speech | None:
    if entry is not None and "speech_end_ms" in entry:
        return Speech(name, pcm, float(entry.get("speech_start_ms", 0.0)), float(entry["speech_end_ms"]), "manifest")
    bounds = energy_speech_bounds(pcm, RATE)
    if bounds is None:
        return None
    return Speech(name, pcm, bounds[0], bounds[1], "energy")


def with_pause(speech: Speech, pause_ms: float, *, frame_ms: float = 20.0) -> Speech:
    """``speech`` with ``pause_ms`` of digital silence inserted inside the utterance: at the middle of its quietest
    ``frame_ms`` frame between 35 % and 65 % of the speech (a gap between words, in clean speech), so the user pauses
    once mid-sentence and goes on. The speech end moves by ``pause_ms``; the name says what was done. A pause shorter
    than the server's silence window (``silence_duration_ms``, minus the word gap it lands in) must not end the turn;
    one longer than ``preemptive_response_ms`` starts a reply that the resumed speech withdraws."""
    if pause_ms <= 0:
        raise ValueError(f"pause_ms must be > 0, got {pause_ms}")
    frame = max(1, int(RATE * frame_ms / 1000))
    span = speech.speech_end_ms - speech.speech_start_ms
    first = int(RATE * (speech.speech_start_ms + 0.35 * span) / 1000) // frame
    last = max(first + 1, int(RATE * (speech.speech_start_ms + 0.65 * span) / 1000) // frame)
    frames = speech.pcm[first * frame : last * frame]
    frames = frames[: len(frames) // frame * frame].reshape(-1, frame)
    quietest = first + int(np.argmin(np.mean(frames.astype(np.float64) ** 2, axis=1)))
    at = quietest * frame + frame // 2
    pcm = np.concatenate([speech.pcm[:at], np.zeros(int(RATE * pause_ms / 1000), np.float32), speech.pcm[at:]])
    name = f"{speech.name}+pause{pause_ms:g}ms@{1000 * at / RATE:.0f}"
    return Speech(name, pcm, speech.speech_start_ms, speech.speech_end_ms + pause_ms, speech.bounds_from)


def without_tail(speech: Speech, keep_ms: float) -> Speech:
    """``speech`` cut ``keep_ms`` after its speech end (unchanged when its tail is shorter): what follows on an
    open microphone is silence anyway, and the next utterance may start as soon as the cut file ends. Same name."""
    end = int(RATE * (speech.speech_end_ms + keep_ms) / 1000)
    if end >= len(speech.pcm):
        return speech
    return Speech(speech.name, speech.pcm[:end], speech.speech_start_ms, speech.speech_end_ms, speech.bounds_from)


def _manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise SpeechFolderError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise SpeechFolderError(f"{path} must map file names to their speech bounds")
    return data

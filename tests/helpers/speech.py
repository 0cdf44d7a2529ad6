"""The spoken fixtures (``tests/fixtures/speech/``) as tests send them: 24 kHz pcm16 for the WebSocket,
base64 for its events, 16 kHz float for the VAD."""

from __future__ import annotations

import base64
import wave
from pathlib import Path

import numpy as np

from realtime.media.audio import decode_audio, resample
from realtime.protocol.audio_format import AudioFormat
from realtime.turns.vad import VAD_SAMPLE_RATE

SPEECH_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "speech"

FRAME_BYTES = 24000 * 20 // 1000 * 2  # 20 ms of pcm16 at 24 kHz


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def wav_pcm(name: str, start_ms: int = 0, end_ms: int | None = None) -> bytes:
    with wave.open(str(SPEECH_DIR / name)) as wav:
        pcm = wav.readframes(wav.getnframes())
    end = len(pcm) if end_ms is None else end_ms * 48
    return pcm[start_ms * 48 : end]


def load_16k(name: str) -> np.ndarray:
    with wave.open(str(SPEECH_DIR / name)) as w:
        rate, frames = w.getframerate(), w.readframes(w.getnframes())
    return resample(decode_audio(frames, AudioFormat.PCM), rate, VAD_SAMPLE_RATE)

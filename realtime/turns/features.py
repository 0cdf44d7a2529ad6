"""The input of the Smart Turn v3 end-of-turn model: Whisper log-mel features of the last 8 s of a turn's audio.

Contract (what the model was trained on, as pipecat's analyzer prepares it):

- 16 kHz mono float32 audio; the last :data:`WINDOW_SAMPLES` (8 s) of the turn are kept, a shorter turn is
  zero-padded *at the front*, so the end of the turn is always the window's last sample;
- the whole window (its padding included) is normalized to zero mean and unit variance;
- Whisper's log-mel (80 mel bins of a centred 400-point STFT, hop 160, reflect-padded, its last frame dropped:
  800 frames), floored at 8 decades below the window's maximum, mapped by ``(x + 4) / 4``.

Batched: each row is computed exactly as a lone row would be (every normalisation is per row). The normalization is
numpy's float32 arithmetic, as the reference's; the spectrum is computed in float64 (the reference promotes to float64
before its FFT, whose result differs from the reference's by ~1e-16 relative) and returned as float32: the features
equal the reference's to float32 rounding (bit for bit on the turns tested).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pipeline.errors import InvalidAudioError

SAMPLE_RATE = 16_000
"""Rate (Hz) of the audio the model hears."""
WINDOW_SECONDS = 8
WINDOW_SAMPLES = WINDOW_SECONDS * SAMPLE_RATE
"""Samples of the window the model scores: a turn's last 8 s."""
N_FFT = 400
HOP = 160
N_MELS = 80
FRAMES = WINDOW_SAMPLES // HOP
"""Feature frames per window (the STFT's last frame is dropped)."""

NORMALIZE_EPSILON = 1e-7
"""Added to the window's variance before the square root, so a silent window divides by ~3e-4, not 0."""
MEL_POWER_FLOOR = 1e-10
DYNAMIC_RANGE_LOG10 = 8.0
"""Whisper keeps 8 decades (80 dB) below the loudest mel bin."""


def last_window(audio: np.ndarray) -> np.ndarray:
    """``audio``'s last :data:`WINDOW_SAMPLES` samples, zero-padded at the front when shorter (a new float32 array).

    Raises :class:`~pipeline.errors.InvalidAudioError` for anything but finite 1-D float audio."""
    x = np.asarray(audio)
    if x.ndim != 1 or not np.issubdtype(x.dtype, np.floating):
        raise InvalidAudioError(f"expected 1-D float audio, got {x.dtype} with shape {x.shape}", param="audio")
    if not np.isfinite(x).all():
        raise InvalidAudioError("audio contains NaN or infinite samples", param="audio")
    window = np.zeros(WINDOW_SAMPLES, dtype=np.float32)
    tail = x[-WINDOW_SAMPLES:]
    if len(tail):
        window[-len(tail) :] = tail
    return window


def normalize(window: np.ndarray) -> np.ndarray:
    """One float32 window to zero mean and unit variance, in float32 with numpy's own reductions, as the reference
    normalizes its float32 buffer before the FFT promotes it. Numpy's (pairwise) summation order matters: torch's
    float32 mean and variance differ from it by a few ulps, which moves some features by ~1e-5 and, through the
    model's int8 quantization of its input, some probabilities by as much as 0.2."""
    return (window - window.mean()) / np.sqrt(window.var() + NORMALIZE_EPSILON)


class WhisperFeatures:
    """Log-mel features (B, :data:`N_MELS`, :data:`FRAMES`) float32 of a batch of turns (see the module docstring).

    Holds the mel filters and the window (made once; the filters are Whisper's: Slaney-scale and Slaney-normalized,
    0–8 kHz, from ``transformers``). Stateless across calls; safe to call from one thread at a time."""

    def __init__(self) -> None:
        from transformers.audio_utils import mel_filter_bank  # deferred: importing transformers takes ~1 s

        filters = mel_filter_bank(
            num_frequency_bins=N_FFT // 2 + 1,
            num_mel_filters=N_MELS,
            min_frequency=0.0,
            max_frequency=SAMPLE_RATE / 2,
            sampling_rate=SAMPLE_RATE,
            norm="slaney",
            mel_scale="slaney",
        )
        self._mel_filters = torch.from_numpy(np.ascontiguousarray(filters.T))  # (n_mels, bins) float64
        self._window = torch.hann_window(N_FFT, periodic=True, dtype=torch.float64)

    def __call__(self, audios: Sequence[np.ndarray]) -> np.ndarray:
        """The features of each turn's :func:`last_window`, row b for ``audios[b]``."""
        if not len(audios):
            raise InvalidAudioError("no audio to compute features of", param="audios")
        normalized = torch.from_numpy(np.stack([normalize(last_window(a)) for a in audios])).to(torch.float64)
        with torch.inference_mode():
            spectrum = torch.stft(
                normalized,
                N_FFT,
                HOP,
                window=self._window,
                center=True,
                pad_mode="reflect",
                return_complex=True,
            )
            power = spectrum.abs() ** 2  # (B, bins, FRAMES + 1)
            log_mel = torch.clamp(self._mel_filters @ power, min=MEL_POWER_FLOOR).log10()[:, :, :FRAMES]
            floor = log_mel.amax(dim=(1, 2), keepdim=True) - DYNAMIC_RANGE_LOG10
            features = (torch.maximum(log_mel, floor) + 4.0) / 4.0
        return features.to(torch.float32).numpy()

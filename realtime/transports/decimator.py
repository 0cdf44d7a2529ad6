"""Streaming downsampling by a whole factor with a short filter: a WebRTC microphone (48 kHz) to the session's rate.

A call's microphone arrives in 20 ms frames, and everything downstream (voice activity detection, the end of the
user's turn) waits for the samples the downsampler hands on. A general resampler working in blocks (soxr) hands a
20 ms frame on partly, holding back about 20 ms on average (up to about 40 ms). :class:`Decimator` hands on every
output sample its input completes, delayed only by its filter's linear-phase delay (:attr:`Decimator.delay_s`,
well under 1 ms at 48 kHz).

The filter is a Kaiser-windowed sinc low-pass at :data:`CUTOFF` of the output rate's Nyquist frequency, with
:data:`TAPS_PER_FACTOR` taps per unit of factor: the band a voice needs passes flat, what would fold back is
attenuated by some 80 dB.
"""

from __future__ import annotations

import numpy as np

TAPS_PER_FACTOR = 32
"""Filter length: ``TAPS_PER_FACTOR * factor + 1`` taps (odd: a whole-sample delay)."""
CUTOFF = 0.9
"""The low-pass cutoff, as a fraction of the output's Nyquist frequency."""
KAISER_BETA = 8.0
"""The window's shape: about 80 dB of stopband attenuation."""


def lowpass(factor: int) -> np.ndarray:
    """The anti-alias filter of a ``factor`` decimator: float64 taps summing to 1 (unit gain at 0 Hz)."""
    taps = TAPS_PER_FACTOR * factor + 1
    n = np.arange(taps) - (taps - 1) / 2
    cutoff = CUTOFF / (2 * factor)  # cycles per input sample
    h = 2 * cutoff * np.sinc(2 * cutoff * n) * np.kaiser(taps, KAISER_BETA)
    return h / h.sum()


class Decimator:
    """Mono float audio at ``in_rate`` → ``in_rate / factor``, streaming: after chunks totalling *n* input samples
    it has returned exactly ``n // factor`` output samples (output sample *m* is input sample ``m * factor``,
    filtered). Not thread-safe: one stream."""

    def __init__(self, factor: int) -> None:
        if factor < 2:
            raise ValueError(f"a decimation factor is 2 or more, got {factor}")
        self.factor = factor
        self._h = lowpass(factor).astype(np.float32)
        self._history = np.zeros(len(self._h) - 1, dtype=np.float32)
        self._phase = 0
        """Input samples to skip before the next output sample (0 to factor - 1)."""

    @property
    def delay_samples(self) -> int:
        """The filter's delay, in input samples."""
        return (len(self._h) - 1) // 2

    def delay_s(self, in_rate: int) -> float:
        return self.delay_samples / in_rate

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """The next chunk of the signal (float32 mono) → the output samples it completes (float32)."""
        x = np.asarray(chunk, dtype=np.float32).reshape(-1)
        if not len(x):
            return np.zeros(0, dtype=np.float32)
        signal = np.concatenate([self._history, x])
        filtered = np.convolve(signal, self._h, mode="valid")  # one value per sample of x
        out = filtered[self._phase :: self.factor]
        self._phase = (self._phase - len(x)) % self.factor
        self._history = signal[len(signal) - len(self._history) :]
        return out.astype(np.float32, copy=False)

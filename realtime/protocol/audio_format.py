"""Wire audio formats of the OpenAI Realtime API, by name (the codecs are :mod:`realtime.media.audio`)."""

from __future__ import annotations

import enum

from realtime.errors import RealtimeError


class AudioFormat(str, enum.Enum):
    """A wire audio format, named by its GA ``type`` (``audio/pcm`` …); beta names parse too."""

    PCM = "audio/pcm"
    PCMU = "audio/pcmu"
    PCMA = "audio/pcma"

    @property
    def sample_rate(self) -> int:
        """Samples per second on the wire."""
        return 24_000 if self is AudioFormat.PCM else 8_000

    @property
    def bytes_per_sample(self) -> int:
        return 2 if self is AudioFormat.PCM else 1

    @property
    def beta_name(self) -> str:
        """The name beta clients (``OpenAI-Beta: realtime=v1``) use for this format."""
        return _BETA_NAMES[self]

    def duration_ms(self, n_bytes: int) -> float:
        """Playback duration of ``n_bytes`` of this format, in milliseconds."""
        return 1000.0 * n_bytes / (self.bytes_per_sample * self.sample_rate)

    @classmethod
    def parse(cls, name: str) -> AudioFormat:
        """The format called ``name`` (GA or beta spelling); unknown names raise ``RealtimeError``."""
        for fmt in cls:
            if name in (fmt.value, _BETA_NAMES[fmt]):
                return fmt
        known = ", ".join([f.value for f in cls] + [_BETA_NAMES[f] for f in cls])
        raise RealtimeError(f"unsupported audio format {name!r}; expected one of: {known}", param="format")


_BETA_NAMES = {AudioFormat.PCM: "pcm16", AudioFormat.PCMU: "g711_ulaw", AudioFormat.PCMA: "g711_alaw"}

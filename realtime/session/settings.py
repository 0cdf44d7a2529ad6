"""What a :class:`~realtime.session.Session` is told about its server and transport: :class:`SessionSettings` (with
its :class:`SessionLimits` and :class:`AudioTransport`) and how it encodes reply audio (:data:`EncoderFactory`)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pipeline.api import EngineHandle
from realtime.media.images import ImageLimits
from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.names import Dialect


class AudioTransport(enum.Enum):
    """How reply audio reaches the client."""

    EVENTS = "events"
    """As base64 ``response.output_audio.delta`` events (WebSocket)."""
    MEDIA = "media"
    """On a media track (WebRTC): :class:`PlayAudio` actions, ``output_audio_buffer.*`` events."""


@dataclass(frozen=True)
class SessionLimits:
    max_buffer_ms: int = 300_000
    """Most audio the input buffer holds before a commit; appends beyond it are refused."""
    min_commit_ms: int = 100
    """A manual commit needs at least this much audio (the OpenAI API's rule)."""
    vad_lookback_ms: int = 500
    """With server_vad, audio held back before speech beyond the prefix padding: the detector
    reports a start up to its frame and resampler latency after the audio arrived."""


@dataclass(frozen=True)
class SessionSettings:
    """What a session needs to know about its server and transport."""

    model: str
    voices: tuple[str, ...]
    default_voice: str | None
    """None when the engine has no audio output."""
    default_instructions: str
    max_output_tokens: int | None = None
    """The engine's reply cap in text tokens (``EngineHandle.max_output_tokens``); a response asking for more, or for
    ``"inf"``, gets this limit, and its ``response.created`` / ``response.done`` show it. None: no cap."""
    voice_aliases: tuple[tuple[str, str], ...] = ()
    """``(name, speaker)`` pairs accepted as voices besides ``voices`` (:mod:`realtime.voices`): the session reports
    ``name``, the engine speaks with ``speaker``. Pairs whose speaker is not one of ``voices`` are left out."""
    dialect: Dialect = Dialect.GA
    audio_transport: AudioTransport = AudioTransport.EVENTS
    limits: SessionLimits = SessionLimits()
    image_limits: ImageLimits = ImageLimits()
    """What a client's pictures may be and how large the model sees them (``input_image``)."""
    audio_output: bool = True
    """Whether the engine speaks (``EngineHandle.audio_output``). If not, the session's output modality is text and
    a ``session.update`` or ``response.create`` asking for audio is refused (``unsupported_value``)."""
    preemptive_replies: bool = False
    """The turn detector reports pauses (``ServerConfig.preemptive_response_ms``): a ``SpeechPaused`` starts a
    tentative reply, and the current message's chunks are kept until its commit, to be streamed again if that reply
    is withdrawn (up to ``limits.max_buffer_ms`` of audio). Without it ``SpeechPaused`` is ignored."""

    @classmethod
    def for_engine(cls, engine: EngineHandle, **overrides: object) -> SessionSettings:
        base = {
            "model": engine.model_name,
            "voices": tuple(engine.voices),
            "default_voice": engine.default_voice,
            "default_instructions": engine.default_instructions,
            "max_output_tokens": engine.max_output_tokens,
            "audio_output": engine.audio_output,
        }
        return cls(**(base | overrides))  # type: ignore[arg-type]


class AudioEncoder(Protocol):
    """Streaming float32 24 kHz → wire bytes (``realtime.media.audio.OutputEncoder`` is one)."""

    def encode(self, samples: np.ndarray) -> bytes: ...

    def flush(self) -> bytes: ...


EncoderFactory = Callable[[AudioFormat], AudioEncoder]

"""The seam between the session layer and the engine, as typing Protocols.

``realtime`` depends on these protocols only (never on model tensors), so its tests can run
against a fake engine. :mod:`pipeline.engine` provides the real implementation.

Units: user audio handed to the engine is float32 mono at :data:`INPUT_SAMPLE_RATE` (16 kHz),
values in [-1, 1]; reply audio comes back at 24 kHz (see :mod:`pipeline.response_events`).

Ordering: operations on one conversation take effect in call order. A conversation runs at most
one response at a time; items may be appended while a response runs (they join the context of the
next response), but inserting an item before the end, deleting or truncating items needs the conversation idle.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Literal, Protocol, overload

import numpy as np

from pipeline.errors import InvalidImageError, InvalidInputError
from pipeline.response_events import EngineStats, ResponseDone, ResponseEvent
from pipeline.tools import AUTO, Tool, ToolChoice

INPUT_SAMPLE_RATE = 16_000
"""Sample rate (Hz) of user audio handed to the engine."""

Role = Literal["system", "user", "assistant"]
ContentPart = str | np.ndarray
"""One part of a user message with pictures (:meth:`ConversationHandle.add_content`): text, or an image as uint8 RGB
``(H, W, 3)``."""
Modality = Literal["text", "audio"]

ROOT_ITEM_ID = "root"
"""``previous_item_id`` meaning "before every item" (the start of the conversation, right after the instructions);
no item may have this id."""


@overload
def reply_token_limit(requested: int | None, cap: int) -> int: ...
@overload
def reply_token_limit(requested: int | None, cap: int | None) -> int | None: ...
def reply_token_limit(requested: int | None, cap: int | None) -> int | None:
    """The text tokens a reply may really write: ``requested`` (None: no limit of its own) within the engine's
    ``cap`` (None: not known here). The one place the rule lives: the engine applies it to every response, and the
    session reports the same figure to its client. A ``requested`` below 1 is an :class:`InvalidInputError`."""
    if requested is not None and requested <= 0:
        raise InvalidInputError("max_output_tokens must be positive", param="max_output_tokens")
    if cap is None:
        return requested
    return cap if requested is None else min(requested, cap)


@dataclass(frozen=True)
class ContextPolicy:
    """How one conversation makes room when a response's prompt plus its reply room would not fit the context
    (:meth:`ConversationHandle.set_context_policy`; the engine's own is the stage config's ``thinker.context_policy``
    and ``thinker.context_retention_ratio``).

    ``drop_oldest`` False: the response fails with ``context_length_exceeded`` and nothing is dropped. True: the
    oldest turns are dropped, whole turns at a time, until the prompt takes at most ``retention_ratio`` (0 to 1) of
    the room beside the reply; the instructions and the turn being answered are never dropped.
    ``max_history_tokens``: a lower limit than the context for the items after the instructions (the prompt then must
    fit both); None: only the context limits them."""

    drop_oldest: bool
    retention_ratio: float = 1.0
    max_history_tokens: int | None = None


@dataclass(frozen=True)
class TranscriptionPrompt:
    """How a model family's thinker is asked to write down a spoken message (input transcription): a side
    conversation with ``instructions`` as its system prompt, the audio as a user message, then the text of
    :meth:`request` as a user message, answered in text only."""

    instructions: str
    request: str
    """The instruction that follows the audio: write down exactly what was said."""
    language_hint: str
    """Added to the request when the client names the audio's language; ``{language}`` is replaced by it."""
    context_hint: str
    """Added to the request when the client gives a transcription prompt; ``{prompt}`` is replaced by it."""

    def render_request(self, *, language: str | None = None, prompt: str | None = None) -> str:
        """The request text, with the client's language and prompt (either may be None or empty) as hints."""
        parts = [self.request]
        if language:
            parts.append(self.language_hint.format(language=language))
        if prompt:
            parts.append(self.context_hint.format(prompt=prompt))
        return " ".join(parts)


MAX_ASPECT_RATIO = 200
"""Longest to shortest side a picture may have (the reference image processor refuses more)."""


@dataclass(frozen=True)
class VisionInfo:
    """What the engine's vision tower takes (:attr:`EngineHandle.vision`; None there: the checkpoint has none).

    Pictures of any size are resized by the engine to a multiple of ``patch_size * merge_size`` pixels on each side
    with between ``min_pixels`` and ``max_pixels`` pixels; a video's frames go in pairs (``temporal_patch_size``).
    """

    fps: float
    """Video frames per second the model was trained at: the default camera sampling rate."""
    min_pixels: int
    max_pixels: int
    patch_size: int
    merge_size: int
    temporal_patch_size: int

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) in pixels the engine resizes a ``height`` x ``width`` picture to: each side rounded to the
        nearest multiple of ``patch_size * merge_size``; if that area is above ``max_pixels`` both sides are scaled
        down to fit (each rounded down to a multiple, at least one multiple), if below ``min_pixels`` scaled up (each
        rounded up). The rule of the reference image processor: at extreme aspect ratios the result may exceed
        ``max_pixels`` by the one-multiple floor. Raises :class:`~pipeline.errors.InvalidImageError` for an empty
        picture or one whose longer side is more than :data:`MAX_ASPECT_RATIO` times its shorter side."""
        if height <= 0 or width <= 0:
            raise InvalidImageError(f"picture of {height}x{width} pixels is empty", param="image")
        if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
            raise InvalidImageError(
                f"picture of {height}x{width} pixels: the aspect ratio must be at most {MAX_ASPECT_RATIO}:1",
                param="image",
            )
        factor = self.patch_size * self.merge_size
        h = round(height / factor) * factor
        w = round(width / factor) * factor
        if h * w > self.max_pixels:
            scale = math.sqrt(height * width / self.max_pixels)
            h = max(factor, math.floor(height / scale / factor) * factor)
            w = max(factor, math.floor(width / scale / factor) * factor)
        elif h * w < self.min_pixels:
            scale = math.sqrt(self.min_pixels / (height * width))
            h = math.ceil(height * scale / factor) * factor
            w = math.ceil(width * scale / factor) * factor
        return h, w

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """(rows, columns) of vision patches of a ``height`` x ``width`` picture after the engine resizes it."""
        h, w = self.resized(height, width)
        return h // self.patch_size, w // self.patch_size

    def tokens(self, height: int, width: int, frames: int = 1) -> int:
        """Thinker positions of an image (``frames`` 1) or of ``frames`` video frames of that size."""
        rows, cols = self.grid(height, width)
        pairs = -(-frames // self.temporal_patch_size)
        return pairs * rows * cols // (self.merge_size * self.merge_size)


class ResponseHandle(Protocol):
    """One streaming reply. Iterate it for events; ``ResponseDone`` is always last.

    ``cancel`` may be called any number of times from any coroutine; it takes effect within one
    engine step, after which no more text or audio events are yielded, only the final
    ``ResponseDone(status=CANCELLED, reason=reason)``. Cancelling after completion is a no-op.
    """

    id: str
    item_id: str

    def __aiter__(self) -> AsyncIterator[ResponseEvent]: ...

    def cancel(self, reason: str = "client_cancelled") -> None: ...

    async def wait(self) -> ResponseDone:
        """Drain the stream and return its ``ResponseDone``."""
        ...


class AudioInputHandle(Protocol):
    """A user audio message being spoken. ``append`` never blocks on model work: complete
    encoder blocks may be prefilled in the background. ``commit`` closes the message (it becomes
    part of the context); ``discard`` drops it and whatever was prefilled for it.

    ``commit`` reaches the engine when it is *called*, not when its result is awaited: a command issued
    after the call (``respond`` on the same conversation) runs after the commit, so a caller may ask for
    the response at once and await the commit's outcome (its errors) later, saving a round trip to the
    engine at the end of every spoken turn."""

    item_id: str

    def append(self, pcm: np.ndarray) -> None: ...

    def commit(self) -> Awaitable[None]: ...

    async def discard(self) -> None: ...

    def add_video_frame(self, frame: np.ndarray, t: float) -> None:
        """A camera frame (uint8 RGB ``(H, W, 3)``) seen ``t`` seconds after the message's first audio sample; ``t``
        never decreases from one call to the next. The message becomes audio with video: its frames and its audio
        are interleaved in the model's time chunks and prefilled in the background as both arrive. Never blocks on
        model work. Raises ``UnsupportedInputError`` when the checkpoint has no vision tower, ``InvalidImageError``
        for a frame that is not such an array (the message carries on without it)."""
        ...


class ConversationHandle(Protocol):
    id: str

    async def set_instructions(self, instructions: str) -> None:
        """Replace the system prompt (the history is re-prefilled lazily)."""
        ...

    async def set_tools(self, tools: tuple[Tool, ...]) -> None:
        """Replace the function tools offered to the model (part of the system prompt: the history is re-prefilled
        lazily from it on). Needs the conversation idle."""
        ...

    async def add_function_call(self, item_id: str, name: str, arguments: str) -> None:
        """An assistant's call the client adds (history); ``arguments``: JSON text of an object."""
        ...

    async def add_function_output(self, item_id: str, output: str) -> None:
        """A tool's result; the next response continues from it."""
        ...

    async def add_text(
        self, item_id: str, text: str, role: Role = "user", *, previous_item_id: str | None = None
    ) -> None:
        """A text message, appended (``previous_item_id`` None) or inserted right after the item
        ``previous_item_id`` (:data:`ROOT_ITEM_ID`: first). An item the context policy dropped counts as being before
        every kept item. Inserting before the end needs the conversation idle; the next prefill keeps the cached
        positions before the inserted item and prefills from there."""
        ...

    async def add_audio(self, item_id: str, pcm: np.ndarray, *, previous_item_id: str | None = None) -> None:
        """A complete user audio message (float32, 16 kHz mono), placed as :meth:`add_text` places it."""
        ...

    async def add_content(
        self, item_id: str, parts: tuple[ContentPart, ...], *, previous_item_id: str | None = None
    ) -> None:
        """A user message of text and images in order (see :data:`ContentPart`), placed as :meth:`add_text` places
        it; its images go through the vision tower and are prefilled in the background like text. Raises
        ``UnsupportedInputError`` when the checkpoint has no vision tower, ``InvalidImageError`` for a part that is
        not text or an image array."""
        ...

    async def set_context_policy(self, policy: ContextPolicy | None) -> None:
        """This conversation's context policy from its next response on; None: the engine's."""
        ...

    def open_audio(self, item_id: str) -> AudioInputHandle: ...

    async def delete_item(self, item_id: str) -> None: ...

    async def truncate_item(self, item_id: str, audio_end_ms: int) -> None:
        """Keep only what the user heard of an assistant reply: its audio up to
        ``audio_end_ms`` and the share of its text spoken by then."""
        ...

    def respond(
        self,
        *,
        item_id: str,
        modalities: frozenset[Modality] = frozenset({"text", "audio"}),
        voice: str | None = None,
        max_output_tokens: int | None = None,
        tool_choice: ToolChoice = AUTO,
        call_item_ids: tuple[str, ...] = (),
    ) -> ResponseHandle:
        """Start a reply; its assistant message joins the conversation as ``item_id``, and its function calls (when the
        conversation has tools) as ``call_item_ids``, in order (it makes at most that many). A conversation with no
        items is answered too: the reply answers the instructions alone (a greeting). Raises before anything runs:
        ``UnsupportedInputError`` (param ``modalities``) for audio from an engine without audio output,
        ``UnknownVoiceError`` for a voice it does not have."""
        ...

    async def close(self) -> None:
        """Cancel any running response and free the conversation's state (KV cache)."""
        ...


class EngineHandle(Protocol):
    model_name: str
    voices: tuple[str, ...]
    """The voices a spoken reply may ask for; empty when the engine has no audio output."""
    default_voice: str | None
    """None when the engine has no audio output."""
    audio_output: bool
    """Whether the engine speaks. If not (a checkpoint without a talker), it answers in text only: ``respond`` with
    the audio modality, or with any voice, raises (``UnsupportedInputError``, ``UnknownVoiceError``)."""
    default_instructions: str
    random_weights: bool
    """True when the checkpoint is one of our random-weight test models: never an assistant."""
    max_output_tokens: int
    """The longest reply in text tokens the engine makes: a response that asks for more, or for no
    limit, stops there (status ``incomplete``, reason ``max_output_tokens``)."""
    transcription_prompt: TranscriptionPrompt
    """How to ask the thinker for a transcript of a user's audio (the model family's)."""
    vision: VisionInfo | None
    """What the vision tower takes; None: the checkpoint cannot see (images and video frames are refused)."""

    def conversation(self, *, instructions: str | None = None) -> ConversationHandle: ...

    async def stats(self) -> EngineStats:
        """What the engine holds now (for hygiene checks and /metrics)."""
        ...

"""What the engine needs of a family's chat format: the prompt renderer (:class:`PromptRenderer`, made by
:meth:`pipeline.models.family.ModelFamily.renderer`), its special ids (:class:`SpecialIds`) and its function-calling
format (:class:`ToolFormat`, whose :class:`CallParser` reads a call as it is generated).

Every token id list here is thinker-vocabulary ids, in prompt order. The engine thread uses a renderer; nothing here
may hold per-conversation state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pipeline.tools import Tool

__all__ = ["CallParser", "ParsedCall", "PromptRenderer", "SpecialIds", "ToolFormat"]


class SpecialIds(Protocol):
    """The special ids the engine reads by name (the family's :meth:`~pipeline.models.family.ModelFamily.special`),
    all from the checkpoint's config."""

    im_end: int
    """A reply's text ends (with :attr:`endoftext`)."""
    endoftext: int
    tts_text_end: int
    """Thinker-vocabulary id fed to the talker once the reply's text ended (then :attr:`tts_text_pad`)."""
    tts_text_pad: int
    codec_bos: int
    """The talker's prefill and its sampler's seen ids (with :attr:`codec_pad`, :attr:`codec_mask`)."""
    codec_pad: int
    codec_mask: int
    audio_start: int
    """A spoken message: ``audio_start``, one ``audio_token`` per audio-encoder output, ``audio_end``."""
    audio_token: int
    audio_end: int
    vision_start: int
    """Around a picture's or a video's positions (families with a vision tower)."""
    vision_end: int
    image_token: int
    video_token: int


@dataclass
class ParsedCall:
    """A function call the model wrote, checked complete."""

    name: str
    arguments: str
    """JSON text of an object."""


class CallParser(Protocol):
    """One call's text between the call markers, fed as it is generated (one parser per call)."""

    def feed(self, text: str) -> tuple[str | None, str]:
        """``(name, arguments delta)`` after ``text``: the name once, when it is first complete (else None), and the
        arguments' new text (possibly empty)."""
        ...

    def close(self) -> tuple[ParsedCall, str | None, str]:
        """The complete call, its name if :meth:`feed` never reported it, and the arguments' last delta (the deltas
        joined equal ``arguments``). Raises ``FunctionCallError`` for a call that names a function not in the
        parser's tools or is not a well-formed call."""
        ...


class ToolFormat(Protocol):
    """A family's function-calling format (the renderer's ``tools``)."""

    call_open: int
    """The token id that opens a call in a reply."""
    call_close: int
    """The token id that closes it."""

    def system_text(self, instructions: str, tools: tuple[Tool, ...]) -> str:
        """The system message's text: ``instructions`` with the tools described."""
        ...

    def call(self, name: str, arguments: str) -> list[int]:
        """A call the client added to the history, markers included."""
        ...

    def call_separator(self) -> list[int]:
        """Between two calls of one turn."""
        ...

    def response_text(self, output: str, *, first: bool, more: bool) -> str:
        """One tool response in a user turn of tool responses (``first``: it opens the turn's text; ``more``:
        another response follows in the same turn)."""
        ...

    def forced(self, name: str | None) -> list[int]:
        """The token ids a reply that must call (``name``, or any tool for None) starts with."""
        ...

    def parser(self, tools: frozenset[str]) -> CallParser:
        """A parser of one call of a reply that may call ``tools``."""
        ...


class PromptRenderer(Protocol):
    """A family's chat format, message by message, so that each message can be prefilled as it arrives; a message's
    ids never depend on the messages after it.

    The engine calls :meth:`content_message` only for a family with a vision tower, and :meth:`open_message`,
    :meth:`text` and :attr:`tools` only when :attr:`tools` is not None."""

    special: SpecialIds

    tools: ToolFormat | None
    """The family's function-calling format; None (or absent): the family has none."""

    def header(self, role: str) -> list[int]:
        """What opens a message of ``role``; ``header("assistant")`` is also the generation prompt."""
        ...

    def footer(self) -> list[int]:
        """What closes a message or a reply."""
        ...

    def text_message(self, role: str, text: str) -> list[int]:
        """A whole text message: header, ``text``, footer."""
        ...

    def open_message(self, role: str, text: str) -> list[int]:
        """A message's header and ``text`` without its footer (a turn written in parts)."""
        ...

    def text(self, text: str) -> list[int]:
        """Plain text inside a message (a later part of a turn)."""
        ...

    def content_message(self, role: str, parts: Sequence[str | int]) -> list[list[int] | int]:
        """A message of text parts (``str``) and pictures (``int``: the picture's thinker positions), in order, as
        segments: token id lists and, for each picture, its position count (the caller places that many
        :attr:`SpecialIds.image_token` positions there)."""
        ...

    def decode(self, token_ids: list[int]) -> str:
        """Text of a reply's ids, special ids skipped."""
        ...

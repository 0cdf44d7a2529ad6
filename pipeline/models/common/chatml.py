"""Qwen's ChatML prompt layout, built message by message so the engine can prefill each message as it arrives.

Layout (what the Qwen-Omni chat templates render)::

    <|im_start|>{role}\\n{content}<|im_end|>\\n      per message
    <|im_start|>assistant\\n                         generation prompt

Audio content is the family's audio start marker + one audio placeholder per audio-encoder output token + its audio end
marker; an image in a message is the vision start marker + one image placeholder per vision-tower output token + the
vision end marker, between the message's text parts. The role header and text content are tokenized as one string, as
the templates do, so BPE merges across the newline match the reference exactly. The marker ids come from the family's
special tokens (``im_start``, ``im_end``, ``audio_start``, ``audio_token``, ``audio_end``, ``vision_start``,
``vision_end``), read from its checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.models.common.hermes_tools import HermesToolFormat


class ChatMLRenderer:
    """Qwen's ChatML layout over ``tokenizer`` with the family's ``special`` ids: a family's prompt renderer
    (:class:`pipeline.models.rendering.PromptRenderer`). Holds no per-conversation state."""

    def __init__(self, tokenizer, special: Any) -> None:
        self.tokenizer = tokenizer
        self.special = special
        self._newline = self._encode("\n")
        self._headers: dict[str, list[int]] = {}
        self.tools = HermesToolFormat.of(tokenizer)
        """Function calling in Qwen's format (None when the tokenizer lacks the call markers)."""

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def header(self, role: str) -> list[int]:
        """``<|im_start|>{role}\\n`` — also the generation prompt for ``assistant``."""
        if role not in self._headers:
            self._headers[role] = [self.special.im_start, *self._encode(f"{role}\n")]
        return self._headers[role]

    def footer(self) -> list[int]:
        return [self.special.im_end, *self._newline]

    def text_message(self, role: str, text: str) -> list[int]:
        return [self.special.im_start, *self._encode(f"{role}\n{text}"), *self.footer()]

    def open_message(self, role: str, text: str) -> list[int]:
        """``<|im_start|>{role}\n{text}`` without the footer: a turn whose next part follows (a call after an
        assistant's text, one tool response after another); ``text`` carries any separator before that part."""
        return [self.special.im_start, *self._encode(f"{role}\n{text}")]

    def text(self, text: str) -> list[int]:
        """Plain text inside a message (a later part of a turn)."""
        return self._encode(text)

    def content_message(self, role: str, parts: Sequence[str | int]) -> list[list[int] | int]:
        """A message of text parts (``str``) and images (``int``: the image's vision-tower token count), in order, as
        segments: token ids (the header, text, vision markers, footer) and, for each image, its token count (the
        caller places that many ``image_token`` positions there). Text between two images is tokenized as one string
        with the role header when it opens the message, as the chat template's string is."""
        s = self.special
        segments: list[list[int] | int] = []
        ids, text = [s.im_start], f"{role}\n"
        for part in parts:
            if isinstance(part, str):
                text += part
                continue
            segments.append([*ids, *(self._encode(text) if text else []), s.vision_start])
            segments.append(part)
            ids, text = [s.vision_end], ""
        segments.append([*ids, *(self._encode(text) if text else []), *self.footer()])
        return segments

    def audio_content(self, n_audio_tokens: int) -> list[int]:
        s = self.special
        return [s.audio_start, *([s.audio_token] * n_audio_tokens), s.audio_end]

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

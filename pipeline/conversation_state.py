"""A conversation as the engine thread holds it: items, their token rendering, and the thinker KV
cache that mirrors a prefix of that rendering.

The cache is kept consistent by one rule: before any prefill, the conversation is rendered to a
list of per-position *keys* (the token id for text, ``(item_id, i)`` for the i-th audio position of
an item), the longest common prefix with the keys already in the cache is kept, the cache is cropped
to it and only the rest is prefilled. Deleting or truncating an item, changing the instructions or
cancelling a reply therefore rolls the cache back exactly as far as needed and never further, and
history is never prefilled twice.

For the talker the state keeps, per cached position, its talker input vector (thinker last hidden +
input embedding, the embedding zeroed at audio positions as the reference does).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Hashable

import torch
from transformers import DynamicCache

from pipeline.errors import ContextLimitError, ResponseActiveError, UnknownItemError
from pipeline.models.qwen2_5_omni.prompt import PromptRenderer


class ItemKind(enum.Enum):
    TEXT = "text"
    AUDIO = "audio"
    REPLY = "reply"


@dataclass
class ConvItem:
    id: str
    role: str
    kind: ItemKind
    text: str = ""
    audio: torch.Tensor | None = None
    """AUDIO: encoder outputs (N, H) on the thinker device."""
    reply_ids: list[int] = field(default_factory=list)
    """REPLY: generated thinker tokens (the final eos excluded)."""
    open: bool = False
    """REPLY: still being generated (rendered without its closing footer)."""
    audio_ms: float = 0.0
    """REPLY: milliseconds of audio produced for it."""
    text_tokens: int = 0


@dataclass
class Rendering:
    keys: list[Hashable]
    token_ids: list[int]
    audio: dict[int, tuple[torch.Tensor, int]]
    """position -> (audio tensor, row) for audio placeholder positions."""


class ConversationState:
    def __init__(self, conv_id: str, renderer: PromptRenderer, *, instructions: str, max_context_tokens: int):
        self.id = conv_id
        self.renderer = renderer
        self.instructions = instructions
        self.max_context_tokens = max_context_tokens
        self.items: list[ConvItem] = []
        self.active_response: str | None = None
        self.cache: DynamicCache | None = None
        self.cached_keys: list[Hashable] = []
        self.talker_vectors: list[torch.Tensor] = []
        """Chunks of (T, H) talker input vectors, together aligned with ``cached_keys``."""

    # -- items --------------------------------------------------------------------------------
    def find(self, item_id: str) -> ConvItem:
        for item in self.items:
            if item.id == item_id:
                return item
        raise UnknownItemError(f"no conversation item with id {item_id!r}", param="item_id")

    def has_item(self, item_id: str) -> bool:
        return any(item.id == item_id for item in self.items)

    def add(self, item: ConvItem) -> None:
        if self.has_item(item.id):
            from pipeline.errors import InvalidInputError

            raise InvalidInputError(f"item id {item.id!r} already exists", param="item_id")
        self.items.append(item)

    def delete(self, item_id: str) -> None:
        self._require_idle("delete an item")
        self.items.remove(self.find(item_id))

    def truncate_reply(self, item_id: str, audio_end_ms: int) -> None:
        """Keep the share of the reply's text that was spoken by ``audio_end_ms``."""
        self._require_idle("truncate an item")
        item = self.find(item_id)
        if item.kind is not ItemKind.REPLY:
            from pipeline.errors import InvalidInputError

            raise InvalidInputError("only assistant replies with audio can be truncated", param="item_id")
        if item.audio_ms <= 0 or audio_end_ms >= item.audio_ms:
            return
        keep = int(len(item.reply_ids) * max(audio_end_ms, 0) / item.audio_ms)
        item.reply_ids = item.reply_ids[:keep]
        item.audio_ms = float(max(audio_end_ms, 0))

    def _require_idle(self, what: str) -> None:
        if self.active_response is not None:
            raise ResponseActiveError(f"cannot {what} while a response is in progress", param="item_id")

    # -- rendering ----------------------------------------------------------------------------
    def render(self, *, generation_prompt: bool) -> Rendering:
        r = Rendering(keys=[], token_ids=[], audio={})
        self._append_tokens(r, self.renderer.text_message("system", self.instructions))
        for item in self.items:
            self._render_item(r, item)
        if generation_prompt:
            self._append_tokens(r, self.renderer.header("assistant"))
        return r

    def _render_item(self, r: Rendering, item: ConvItem) -> None:
        if item.kind is ItemKind.TEXT:
            self._append_tokens(r, self.renderer.text_message(item.role, item.text))
        elif item.kind is ItemKind.AUDIO:
            n = item.audio.shape[0]
            content = self.renderer.audio_content(n)
            self._append_tokens(r, self.renderer.header(item.role) + content[:1])
            for i in range(n):
                r.audio[len(r.keys)] = (item.audio, i)
                r.keys.append((item.id, i))
                r.token_ids.append(content[1 + i])
            self._append_tokens(r, content[-1:] + self.renderer.footer())
        else:
            self._append_tokens(r, self.renderer.header(item.role) + item.reply_ids)
            if not item.open:
                self._append_tokens(r, self.renderer.footer())

    @staticmethod
    def _append_tokens(r: Rendering, ids: list[int]) -> None:
        r.keys.extend(ids)
        r.token_ids.extend(ids)

    # -- cache bookkeeping ----------------------------------------------------------------------
    def common_prefix(self, keys: list[Hashable]) -> int:
        n = 0
        for a, b in zip(self.cached_keys, keys):
            if a != b:
                break
            n += 1
        return n

    def crop(self, length: int) -> None:
        """Roll the KV cache and talker vectors back to the first ``length`` positions."""
        if length >= len(self.cached_keys):
            return
        if self.cache is not None:
            remove = self.cache.get_seq_length() - length
            if length == 0:
                self.cache = None
            elif remove > 0:
                # negative = "drop this many": the one form every transformers 5.x accepts
                self.cache.crop(-remove)
        self.cached_keys = self.cached_keys[:length]
        vectors = torch.cat(self.talker_vectors) if self.talker_vectors else None
        self.talker_vectors = [vectors[:length]] if vectors is not None and length else []

    def extend(self, keys: list[Hashable], vectors: torch.Tensor) -> None:
        self.cached_keys.extend(keys)
        self.talker_vectors.append(vectors)

    def talker_prompt(self) -> torch.Tensor:
        vectors = torch.cat(self.talker_vectors)
        self.talker_vectors = [vectors]
        return vectors

    def check_context(self, prompt_len: int, reply_budget: int) -> None:
        if prompt_len + reply_budget > self.max_context_tokens:
            raise ContextLimitError(
                f"conversation has {prompt_len} tokens; with up to {reply_budget} reply tokens it exceeds the "
                f"context limit of {self.max_context_tokens} tokens (delete items or start a new conversation)",
                param="max_output_tokens",
            )

    def free(self) -> None:
        self.cache = None
        self.cached_keys = []
        self.talker_vectors = []

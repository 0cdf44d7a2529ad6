"""Incremental detokenization: text deltas that never split a UTF-8 character and never show a tokenizer's markup."""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Any

REPLACEMENT_CHAR = "\ufffd"


def markup_ids(tokenizer: Any) -> frozenset[int]:
    """The ids of ``tokenizer``'s added tokens (a transformers tokenizer's ``added_tokens_decoder``): chat, media,
    tool and fill-in-the-middle markers such as ``<|im_end|>``, ``<tool_response>`` or ``<|fim_prefix|>``. Some are
    not flagged special, so ``skip_special_tokens`` keeps their text; none of them is reply text."""
    return frozenset(tokenizer.added_tokens_decoder)


class IncrementalDetokenizer:
    """Feed token ids one by one; ``push`` returns the newly completed text (possibly empty).

    A token that ends inside a multi-byte character decodes to U+FFFD; its text is held back until
    the character completes (or ``flush`` at the end). A token of ``hidden`` (markup) adds no text: it is
    not decoded at all."""

    def __init__(self, decode: Callable[[list[int]], str], hidden: Container[int] = frozenset()) -> None:
        self._decode = decode
        self._hidden = hidden
        self.token_ids: list[int] = []
        """The decoded ids: those pushed, less the hidden ones."""
        self.text = ""

    def push(self, token_id: int) -> str:
        if token_id in self._hidden:
            return ""
        self.token_ids.append(token_id)
        full = self._decode(self.token_ids)
        if full.endswith(REPLACEMENT_CHAR):
            return ""
        return self._advance(full)

    def flush(self) -> str:
        return self._advance(self._decode(self.token_ids))

    def _advance(self, full: str) -> str:
        # Byte-level BPE decoding is prefix-stable once no character is pending; if a tokenizer's
        # clean-up rules ever rewrite earlier text, send nothing rather than contradict what was sent.
        if not full.startswith(self.text):
            return ""
        delta = full[len(self.text) :]
        self.text = full
        return delta

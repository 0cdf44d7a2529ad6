"""Incremental detokenization: text deltas that never split a UTF-8 character."""

from __future__ import annotations

from collections.abc import Callable

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Feed token ids one by one; ``push`` returns the newly completed text (possibly empty).

    A token that ends inside a multi-byte character decodes to U+FFFD; its text is held back until
    the character completes (or ``flush`` at the end)."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self.token_ids: list[int] = []
        self.text = ""

    def push(self, token_id: int) -> str:
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

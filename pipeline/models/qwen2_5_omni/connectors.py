"""Qwen2.5-Omni glue between stages.

thinker -> talker: per reply token the talker's input vector is the thinker's last hidden state
(after the final norm) plus the thinker's input embedding of that token. Prompt positions that hold
audio/image/video placeholders contribute a zero embedding (their hidden state is kept).

talker -> token2wav: codec tokens pass straight through; the stop ids end the stream and never
reach the DiT.
"""

from __future__ import annotations

import torch


def thinker_to_talker(hidden: torch.Tensor, embeds: torch.Tensor, multimodal: torch.Tensor | None) -> torch.Tensor:
    """``hidden`` and ``embeds`` (the tokens' input embeddings) are (T, H_thinker), ``multimodal`` (T,) bool marks
    audio/image/video positions (None: none); returns the talker inputs (T, H_thinker)."""
    if multimodal is None:
        return hidden + embeds
    return hidden + embeds.masked_fill(multimodal.unsqueeze(1), 0)


def talker_to_token2wav(code: int, stop_ids: tuple[int, ...]) -> int | None:
    """The DiT code for a sampled codec token, or None when the token ends the utterance."""
    return None if code in stop_ids else code

"""Qwen3-Omni's talker as the engine's frame talker (:class:`pipeline.models.frame_talker.FrameTalkerParts`).

The conversation keeps, per thinker position, what the talker may read there (:func:`thinker_to_talker`): the thinker's
hidden state of layer ``accept_hidden_layer`` at audio/image/video positions, the token's input embedding elsewhere.
The talker's prompt reads the user turns only (:func:`~.talker.user_mask`); its inputs there are ``hidden_projection``
of the hidden state or ``text_projection`` of the embedding (:meth:`~.talker.TalkerInputs.user_part`). Each step's
input is the previous frame's summed codebook embeddings plus ``text_projection`` of the next text vector; the code
predictor fills codebooks 1..15 of each frame.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from pipeline.models.qwen3_omni.code_predictor import Qwen3OmniCodePredictor
from pipeline.models.qwen3_omni.talker import TalkerInputs, TalkerTokens, user_mask

__all__ = ["Qwen3OmniFrameTalker", "thinker_to_talker"]


def thinker_to_talker(hidden: torch.Tensor, embeds: torch.Tensor, multimodal: torch.Tensor | None) -> torch.Tensor:
    """What the conversation keeps per position for the talker (T, H_thinker): ``hidden`` (the thinker's hidden state of
    ``accept_hidden_layer``) at ``multimodal`` positions, the token embeddings ``embeds`` elsewhere (None: no
    multimodal position, as in decode steps)."""
    if multimodal is None:
        return embeds
    return torch.where(multimodal.unsqueeze(1), hidden.to(embeds.dtype), embeds)


class Qwen3OmniFrameTalker:
    """The frame talker parts of a loaded Qwen3-Omni talker (HF ``Qwen3OmniMoeTalkerForConditionalGeneration``) on
    its device, with the thinker's input embedding (to embed the reply opening's header) and the renderer's
    ``<|im_start|>assistant\\n`` ids."""

    def __init__(self, talker, thinker_embedding: torch.nn.Embedding, config, header_ids: Sequence[int]) -> None:
        self.tokens = TalkerTokens.of(config)
        self.inputs = TalkerInputs(talker, thinker_embedding, self.tokens)
        self.residual = Qwen3OmniCodePredictor(talker)
        self.body = talker.model
        self.head = talker.codec_head
        self.groups = self.tokens.code_groups
        self.text_width = thinker_embedding.embedding_dim
        self.thinker_hidden_layer = self.tokens.accept_hidden_layer
        self.text_end_ids = (self.tokens.tts_eos, self.tokens.tts_pad)
        self.header_ids = list(header_ids)

    def _ids(self, keys: Sequence[Hashable]) -> torch.Tensor:
        """Token ids of rendered positions: an audio/image/video position's key is a tuple; the audio placeholder id
        stands for any of them (what the talker reads there is the same)."""
        audio = self.tokens.audio
        return torch.tensor([k if isinstance(k, int) else audio for k in keys], dtype=torch.long)

    def prompt_positions(self, keys: Sequence[Hashable]) -> list[int]:
        if not keys:
            return []
        return torch.nonzero(user_mask(self._ids(keys), self.tokens)).flatten().tolist()

    def prompt_inputs(self, vectors: torch.Tensor, keys: Sequence[Hashable]) -> torch.Tensor:
        if not keys:
            return vectors.new_zeros(0, self.inputs.codec_embedding.embedding_dim).to(self.inputs.dtype)
        return self.inputs.user_part(self._ids(keys), vectors, vectors)

    def reply_start(self, first: torch.Tensor, voice: str) -> torch.Tensor:
        return self.inputs.assistant_part(self.header_ids, self.tokens.speaker(voice), first)

    def step_inputs(self, frames: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        return self.inputs.frame_embedding(frames) + self.inputs.project_text(text)

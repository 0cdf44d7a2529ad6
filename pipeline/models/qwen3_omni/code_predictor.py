"""The Qwen3-Omni code predictor (its MTP module) as the frame talker's residual predictor
(:class:`pipeline.models.frame_talker.ResidualPredictor`): the 15 residual codes of a frame from the talker's hidden
state and codebook 0, as the reference's ``code_predictor.generate`` computes them each frame.

Per frame and row the predictor runs afresh (at most ``num_code_groups`` positions): its opening is two positions,
[the talker's last hidden state (its final norm's output, the one ``codec_head`` reads), the talker's codec embedding
of code 0], whose last logits through ``lm_head[0]`` give codebook 1; then codebook k's code through
``codec_embedding[k - 1]`` gives codebook k + 1 through ``lm_head[k]``. The engine runs ``code_predictor.model`` (dense
layers with q/k norms, 1-D rope) over a KV pool of its own; everything here is device work without host
synchronisation.
"""

from __future__ import annotations

import torch

__all__ = ["Qwen3OmniCodePredictor"]


class Qwen3OmniCodePredictor:
    """The parts of a loaded talker's (HF ``Qwen3OmniMoeTalkerForConditionalGeneration``) code predictor the engine
    runs, on the talker's device."""

    opening_len = 2

    def __init__(self, talker) -> None:
        self.body = talker.code_predictor.model
        self.heads = talker.code_predictor.lm_head
        self.embeddings = talker.code_predictor.get_input_embeddings()
        self.code0_embedding = talker.model.get_input_embeddings()
        self.vocab = talker.code_predictor.config.vocab_size

    def opening(self, hidden: torch.Tensor, code0: torch.Tensor) -> torch.Tensor:
        """(B, 2, H): each row's talker hidden state, then its codebook-0 code's talker embedding."""
        weight = self.code0_embedding.weight
        return torch.stack((hidden.to(weight.dtype), self.code0_embedding(code0)), dim=1)

    def embed(self, codes: torch.Tensor, k: int) -> torch.Tensor:
        return self.embeddings[k - 1](codes)

    def logits(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        return self.heads[k - 1](hidden)

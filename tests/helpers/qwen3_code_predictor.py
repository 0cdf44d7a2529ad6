"""The reference for the engine's Qwen3-Omni code predictor: what transformers' ``code_predictor.generate`` computes
each frame, run eagerly with HF's own forward over a ``DynamicCache``. The engine runs the same model over a KV pool
of fixed shapes (``pipeline/models/qwen3_omni/code_predictor.py`` with ``pipeline/runners/residual_predictor.py``);
tests compare it with this.

For each talker row the predictor starts a fresh KV cache (at most ``code_groups`` positions): a prefill of two
positions, [the talker's last hidden state (its final norm's output, the one ``codec_head`` reads), the talker's codec
embedding of code 0], whose last logits through ``lm_head[0]`` give code 1; then step s = 1 .. groups - 2 feeds code
s through ``codec_embedding[s - 1]`` and reads code s + 1 from ``lm_head[s]``. All rows share positions 0 .. groups - 1,
so a batch of rows needs no padding.

Sampling (:data:`ResidualSampler`): greedy, or top-k 50 and top-p 0.8 at temperature 1 (the values the reference
passes), each row drawn with its own ``torch.Generator`` (:class:`TopKTopP`); or any ``(logits, step) -> codes``, such
as the engine's seeded in-graph sampler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import DynamicCache

from pipeline.errors import InvalidInputError

__all__ = ["CodePredictor", "ResidualSampler", "TopKTopP", "greedy"]

ResidualSampler = Callable[[torch.Tensor, int], torch.Tensor]
"""``(logits (B, V) float32, step) -> codes (B,) long``: draws codebook ``step + 1`` of every row."""


def greedy(logits: torch.Tensor, step: int) -> torch.Tensor:
    return logits.argmax(dim=-1)


class TopKTopP:
    """Sampling as transformers' warpers do it (temperature, then top-k, then top-p keeping at least one token), then
    one multinomial draw per row from that row's generator (``generators[b]``; the row order of every call)."""

    def __init__(
        self, generators: Sequence[torch.Generator], *, top_k: int = 50, top_p: float = 0.8, temperature: float = 1.0
    ) -> None:
        if top_k < 1 or not 0.0 < top_p <= 1.0 or temperature <= 0.0:
            raise InvalidInputError("top_k >= 1, 0 < top_p <= 1 and temperature > 0 are needed", param="sampling")
        self.generators = list(generators)
        self.top_k = top_k
        self.top_p = top_p
        self.temperature = temperature

    def warp(self, logits: torch.Tensor) -> torch.Tensor:
        """(B, V) logits with the tokens top-k and top-p remove at -inf."""
        x = logits.float()
        if self.temperature != 1.0:
            x = x / self.temperature
        k = min(self.top_k, x.shape[-1])
        x = x.masked_fill(x < torch.topk(x, k).values[..., -1:], float("-inf"))
        if self.top_p < 1.0:
            ascending, order = torch.sort(x, descending=False)
            cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
            drop = cumulative <= 1 - self.top_p
            drop[..., -1:] = False
            x = x.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        return x

    def __call__(self, logits: torch.Tensor, step: int) -> torch.Tensor:
        if logits.shape[0] != len(self.generators):
            raise InvalidInputError("one generator per row is needed", param="generators")
        probs = self.warp(logits).softmax(dim=-1)
        draws = [torch.multinomial(p, 1, generator=g) for p, g in zip(probs, self.generators)]
        return torch.cat(draws)


class CodePredictor:
    """Runs ``talker.code_predictor`` (the HF ``Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration``)
    eagerly for a batch of talker rows; holds no state between calls. The reference of the engine's pooled one."""

    def __init__(self, talker) -> None:
        self.model = talker.code_predictor.model
        self.heads = talker.code_predictor.lm_head
        self.embeddings = talker.code_predictor.get_input_embeddings()
        self.code0_embedding = talker.model.get_input_embeddings()
        self.groups = talker.config.num_code_groups

    @torch.inference_mode()
    def predict(self, hidden: torch.Tensor, code0: torch.Tensor, sample: ResidualSampler = greedy) -> torch.Tensor:
        """(B, groups - 1) codes of codebooks 1 .. groups - 1, from ``hidden`` (B, H), the talker's last hidden state
        of each row, and ``code0`` (B,), the codebook-0 code sampled from it."""
        if hidden.ndim != 2 or code0.shape != hidden.shape[:1]:
            raise InvalidInputError("code predictor: hidden (B, H) and code0 (B,) are needed", param="hidden")
        weight = self.code0_embedding.weight
        cache = DynamicCache(config=self.model.config)
        x = torch.stack((hidden.to(weight.device, weight.dtype), self.code0_embedding(code0.to(weight.device))), 1)
        codes: list[torch.Tensor] = []
        for step in range(self.groups - 1):
            if step:
                x = self.embeddings[step - 1](codes[-1])[:, None]
            h = self.model(inputs_embeds=x, cache=cache, use_cache=True).last_hidden_state[:, -1]
            codes.append(sample(self.heads[step](h).float(), step).to(weight.device, torch.long))
        return torch.stack(codes, dim=1)

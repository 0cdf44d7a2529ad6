"""Token sampling with the same logits processing order as transformers' ``generate``:
repetition penalty, suppressed tokens, then (when sampling) temperature, top-k, top-p.

Greedy decoding still applies the repetition penalty and suppression, as ``generate`` does, so greedy
outputs match the reference token for token.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from pipeline.config import SamplingConfig


class Sampler:
    """Samples one token id from a (V,) logits row. ``seen`` holds the ids the repetition penalty
    applies to (the whole input sequence in the reference, prompt included)."""

    def __init__(self, cfg: SamplingConfig, *, suppress: Iterable[int] = (), generator: torch.Generator | None = None):
        self.cfg = cfg
        self.suppress = torch.tensor(sorted(set(suppress)), dtype=torch.long)
        self.generator = generator

    def __call__(self, logits: torch.Tensor, seen: torch.Tensor | None = None) -> int:
        logits = logits.float().clone()
        penalty = self.cfg.repetition_penalty
        if penalty != 1.0 and seen is not None and seen.numel():
            idx = seen.to(logits.device)
            picked = logits[idx]
            logits[idx] = torch.where(picked < 0, picked * penalty, picked / penalty)
        if self.suppress.numel():
            logits[self.suppress.to(logits.device)] = float("-inf")
        if not self.cfg.do_sample:
            return int(torch.argmax(logits))
        return self._sample(logits)

    def _sample(self, logits: torch.Tensor) -> int:
        logits = logits / self.cfg.temperature
        if self.cfg.top_k > 0:
            k = min(self.cfg.top_k, logits.numel())
            threshold = torch.topk(logits, k).values[-1]
            logits = logits.masked_fill(logits < threshold, float("-inf"))
        if self.cfg.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=False)
            cumulative = sorted_logits.softmax(-1).cumsum(-1)
            remove = cumulative <= (1 - self.cfg.top_p)
            remove[-1] = False  # always keep the most likely token
            logits = logits.masked_fill(remove.scatter(0, order, remove), float("-inf"))
        probs = logits.softmax(-1)
        gen = self.generator if self.generator is not None and self.generator.device == probs.device else None
        return int(torch.multinomial(probs, 1, generator=gen))

"""Token sampling with the same logits processing order as transformers' ``generate``:
repetition penalty, suppressed tokens, then (when sampling) temperature, top-k, top-p.

Greedy decoding still applies the repetition penalty and suppression, as ``generate`` does, so greedy
outputs match the reference token for token.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from pipeline.config import SamplingConfig


class BatchSampler:
    """Samples one token for each row of a (B, V) logits batch with one stage's settings, in the order of
    transformers' ``generate`` (repetition penalty, suppression, temperature, top-k, top-p), on the logits' device.

    The tokens each row's repetition penalty applies to live in a (rows, V) boolean table on the device, one
    row per KV slot: :meth:`reset` fills a row at the start of a response, :meth:`sample` marks every sampled
    token. One host transfer per batch (the sampled ids). Rows with their own ``torch.Generator`` (a seeded
    engine) draw from it one by one, so a seeded response samples the same tokens whatever it is batched with.
    """

    def __init__(self, cfg: SamplingConfig, *, vocab: int, rows: int, device: torch.device,
                 suppress: Iterable[int] = (), stop: Iterable[int] = ()) -> None:  # fmt: skip
        self.cfg = cfg
        self.device = torch.device(device)
        self.seen = torch.zeros(rows, vocab, dtype=torch.bool, device=self.device)
        self.suppress = self._mask(vocab, suppress)
        self.stop = self._mask(vocab, stop)
        """Suppressed in the rows sampled with ``force_continue`` (min_tokens not reached)."""

    def _mask(self, vocab: int, ids: Iterable[int]) -> torch.Tensor:
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[sorted(set(ids))] = True
        return mask.to(self.device)

    def reset(self, row: int, seen: Iterable[int]) -> None:
        self.seen[row].zero_()
        ids = sorted(set(seen))
        if ids:
            self.seen[row, torch.tensor(ids, device=self.device)] = True

    def sample(self, logits: torch.Tensor, rows: list[int], *, force_continue: list[bool],
               generators: list[torch.Generator | None]) -> list[int]:  # fmt: skip
        """``logits`` (B, V); row b uses table row ``rows[b]``. Returns the B sampled ids."""
        row_t = torch.tensor(rows, dtype=torch.long, device=self.device)
        logits = logits.float().clone()
        penalty = self.cfg.repetition_penalty
        if penalty != 1.0:
            penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
            logits = torch.where(self.seen[row_t], penalized, logits)
        blocked = self.suppress.unsqueeze(0)
        if any(force_continue):
            forced = torch.tensor(force_continue, dtype=torch.bool, device=self.device)
            blocked = blocked | (forced[:, None] & self.stop[None, :])
        logits = logits.masked_fill(blocked, float("-inf"))
        if not self.cfg.do_sample:
            tokens = torch.argmax(logits, dim=-1)
        else:
            tokens = self._sample(logits, generators)
        self.seen[row_t, tokens] = True
        return tokens.tolist()

    def _sample(self, logits: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
        logits = logits / self.cfg.temperature
        if self.cfg.top_k > 0:
            k = min(self.cfg.top_k, logits.shape[-1])
            threshold = torch.topk(logits, k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < threshold, float("-inf"))
        if self.cfg.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=False, dim=-1)
            cumulative = sorted_logits.softmax(-1).cumsum(-1)
            remove = cumulative <= (1 - self.cfg.top_p)
            remove[:, -1] = False  # always keep the most likely token
            logits = logits.masked_fill(remove.scatter(1, order, remove), float("-inf"))
        probs = logits.softmax(-1)
        if all(g is None or g.device != probs.device for g in generators):
            return torch.multinomial(probs, 1).squeeze(1)
        return torch.cat([
            torch.multinomial(probs[b], 1, generator=g if g is not None and g.device == probs.device else None)
            for b, g in enumerate(generators)
        ])  # fmt: skip

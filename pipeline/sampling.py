"""Token sampling with the logits processing of transformers' ``generate``, as device work a CUDA graph can hold.

Order, as in ``generate``: repetition penalty, suppressed tokens, then (when sampling) temperature, top-k, top-p,
and a draw. Greedy decoding still applies the repetition penalty and suppression, as ``generate`` does, so greedy
outputs match the reference token for token.

Why a graph-safe sampler: eager sampling cost a decode step ~1.2-1.4 ms of host-bound kernels per stage plus a host
sync before it (BENCHMARKS.md §11): more than the talker's whole graph. Here :meth:`BatchSampler.sample_device` is
fixed-shape device work with no host synchronisation, so the decode graphs capture it after their layers and a step
costs one graph replay and one transfer of the sampled ids.

The draw: top-k first, then top-p and the draw over those k values only (the tokens top-k removed have probability 0,
so top-p over the k survivors removes the same tokens as over the whole vocabulary; ties at the k-th value are the
only difference: ``topk`` keeps exactly k). The draw is the Gumbel-max trick, argmax(logit + Gumbel noise), which
samples exactly from the softmax. The noise is a hash of (row seed, row counter, rank, sampler salt), not torch's RNG:
a graph replays it without generator state, and a seeded response samples the same tokens whatever it is batched
with, since its noise depends only on its own seed and how many tokens it has sampled.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from pipeline.config import SamplingConfig
from pipeline.cuda_graphs import host_to_device

__all__ = ["BatchSampler", "SampleRows", "SamplerSpec", "sample_inputs", "sample_row_fill", "sample_row_inputs",
           "uniform_noise"]

_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, m: int) -> torch.Tensor:
    """``x * m mod 2**32`` for int64 ``x`` in [0, 2**32): split in 16-bit halves so no product overflows int64."""
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * m + (((hi * m) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (the "lowbias32" mixer: xor-shift / multiply rounds) of int64 values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniform_noise(seeds: torch.Tensor, counters: torch.Tensor, width: int, salt: int = 0) -> torch.Tensor:
    """(B, width) float32 values uniform in (0, 1), a pure function of each row's (seed, counter) (int64, (B,)),
    the column and ``salt``. Seeds and counters are taken modulo 2**32."""
    row = _mix32((_mix32(seeds & _MASK32) + _mix32((counters + salt * 0x9E3779B9) & _MASK32)) & _MASK32)
    cols = torch.arange(width, device=seeds.device, dtype=torch.int64)
    bits = _mix32((row[:, None] ^ _mix32(cols + 0x632BE5AB)[None, :]) & _MASK32)
    # 24 random bits, centred in their interval: never exactly 0 or 1
    return ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


@dataclass(frozen=True)
class SampleRows:
    """Per-row sampling inputs of one batch: int64 / bool tensors of shape (B,), built on the host
    (:meth:`of`) and moved with :meth:`on` (or as row inputs of a decode graph).

    ``rows``: the sampler table row of each batch row (its KV slot); ``force_continue``: stop ids suppressed (the
    row has not reached its minimum length); ``seeds`` and ``counters``: the row's noise seed and how many tokens it
    has sampled in this stage (see :func:`uniform_noise`)."""

    rows: torch.Tensor
    force_continue: torch.Tensor
    seeds: torch.Tensor
    counters: torch.Tensor

    @classmethod
    def of(cls, rows: Sequence[int], *, force_continue: Sequence[bool], seeds: Sequence[int],
           counters: Sequence[int]) -> SampleRows:  # fmt: skip
        return cls(torch.tensor(list(rows), dtype=torch.long), torch.tensor(list(force_continue), dtype=torch.bool),
                   torch.tensor(list(seeds), dtype=torch.long), torch.tensor(list(counters), dtype=torch.long))

    @classmethod
    def neutral(cls, size: int, row: int) -> SampleRows:
        """``size`` rows of table row ``row`` (a scratch row), not forced, seed 0: for steps whose caller samples
        nothing."""
        return cls.of([row] * size, force_continue=[False] * size, seeds=[0] * size, counters=[0] * size)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.rows, self.force_continue, self.seeds, self.counters)

    def on(self, device: torch.device) -> SampleRows:
        """These rows on ``device``, queued without waiting for the device's work (:func:`host_to_device`)."""
        return SampleRows(*(host_to_device(t, t.dtype, device) for t in self.tensors()))


class BatchSampler:
    """Samples one token for each row of a (B, V) logits batch with one stage's settings, on the logits' device.

    The tokens each row's repetition penalty applies to live in a (rows, V) boolean table on the device, one row per
    KV slot: :meth:`reset` fills a row at the start of a response; sampling marks every sampled token.
    ``salt`` separates the noise of two samplers (thinker, talker) that see the same seeds and counters.
    """

    def __init__(self, cfg: SamplingConfig, *, vocab: int, rows: int, device: torch.device,
                 suppress: Iterable[int] = (), stop: Iterable[int] = (), salt: int = 0) -> None:  # fmt: skip
        self.cfg = cfg
        self.device = torch.device(device)
        self.salt = salt
        self.seen = torch.zeros(rows, vocab, dtype=torch.bool, device=self.device)
        self.suppress = self._mask(vocab, suppress)
        self.stop = self._mask(vocab, stop)
        """Suppressed in the rows sampled with ``force_continue`` (min_tokens not reached)."""
        self.k = min(cfg.top_k, vocab) if cfg.top_k > 0 else vocab
        self._true = torch.ones((), dtype=torch.bool, device=self.device)
        """The value marking a token seen, on the device: a host scalar would be copied over during a graph capture."""

    def _mask(self, vocab: int, ids: Iterable[int]) -> torch.Tensor:
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[sorted(set(ids))] = True
        return mask.to(self.device)

    def reset(self, row: int, seen: Iterable[int]) -> None:
        self.seen[row].zero_()
        ids = sorted(set(seen))
        if ids:
            self.seen[row, torch.tensor(ids, device=self.device)] = True

    def sample(self, logits: torch.Tensor, rows: list[int], *, force_continue: list[bool], seeds: list[int],
               counters: list[int]) -> list[int]:  # fmt: skip
        """Eager convenience: ``logits`` (B, V), row b with table row ``rows[b]``. Returns the B sampled ids (one
        host transfer)."""
        batch = SampleRows.of(rows, force_continue=force_continue, seeds=seeds, counters=counters)
        return self.sample_device(logits, batch.on(self.device)).tolist()

    def sample_device(self, logits: torch.Tensor, batch: SampleRows) -> torch.Tensor:
        """(B,) int64 sampled ids on the device, marked as seen in their table rows. Fixed shapes, no host
        synchronisation: safe inside a CUDA graph capture."""
        logits = logits.float()
        penalty = self.cfg.repetition_penalty
        if penalty != 1.0:
            penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
            logits = torch.where(self.seen[batch.rows], penalized, logits)
        blocked = self.suppress.unsqueeze(0) | (batch.force_continue[:, None] & self.stop[None, :])
        logits = logits.masked_fill(blocked, float("-inf"))
        if not self.cfg.do_sample:
            tokens = torch.argmax(logits, dim=-1)
        else:
            tokens = self._draw(logits, batch)
        self.seen.index_put_((batch.rows, tokens), self._true)
        return tokens

    def _draw(self, logits: torch.Tensor, batch: SampleRows) -> torch.Tensor:
        values, ids = torch.topk(logits, self.k, dim=-1)  # descending; temperature keeps the order
        values = values / self.cfg.temperature
        if self.cfg.top_p < 1.0:
            probs = values.softmax(-1)
            # transformers sorts ascending and removes while the cumulative probability stays <= 1 - top_p: in
            # descending order that is the sum of a value's probability and every smaller one's
            from_below = probs.flip(-1).cumsum(-1).flip(-1)
            remove = from_below <= 1 - self.cfg.top_p
            remove[:, 0] = False  # always keep the most likely token
            values = values.masked_fill(remove, float("-inf"))
        uniform = uniform_noise(batch.seeds, batch.counters, self.k, self.salt)
        gumbel = -torch.log(-torch.log(uniform))
        choice = torch.argmax(values + gumbel, dim=-1, keepdim=True)
        return ids.gather(1, choice).squeeze(1)


@dataclass(frozen=True)
class SamplerSpec:
    """What a decode runner needs to build its stage's sampler (the vocabulary and table rows are the runner's)."""

    cfg: SamplingConfig
    suppress: tuple[int, ...] = ()
    stop: tuple[int, ...] = ()
    salt: int = 0

    def build(self, *, vocab: int, rows: int, device: torch.device) -> BatchSampler:
        return BatchSampler(self.cfg, vocab=vocab, rows=rows, device=device, suppress=self.suppress, stop=self.stop,
                            salt=self.salt)  # fmt: skip


# A decode graph takes a sampler's four row inputs after its own (see SampleRows.tensors); padding rows sample in the
# scratch row of the sampler's table, so they never mark a real slot's tokens as seen.

def sample_row_fill(scratch_row: int) -> tuple[int, ...]:
    """Padding values of the four sampler row inputs."""
    return (scratch_row, 0, 0, 0)


def sample_row_inputs(size: int, scratch_row: int, sampler: BatchSampler | None) -> tuple[torch.Tensor, ...]:
    """Example sampler row inputs of a batch of ``size`` on the sampler's device (for a graph capture); none
    without a sampler."""
    if sampler is None:
        return ()
    return SampleRows.neutral(size, scratch_row).on(sampler.device).tensors()


def sample_inputs(size: int, scratch_row: int, sampler: BatchSampler | None,
                  sample: SampleRows | None) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """The sampler row inputs of a step of ``size`` rows: ``sample``'s, or neutral rows (scratch row) when the caller
    samples nothing; none without a sampler."""
    if sampler is None:
        return ()
    return (sample if sample is not None else SampleRows.neutral(size, scratch_row)).tensors()

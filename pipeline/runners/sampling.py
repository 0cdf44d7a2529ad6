"""Token sampling with the logits processing of transformers' ``generate``, as device work a CUDA graph can hold.

Order, as in ``generate``: repetition penalty, suppressed tokens, then (when sampling) temperature, top-k, top-p,
and a draw. Greedy decoding still applies the repetition penalty and suppression, as ``generate`` does, so greedy
outputs match the reference token for token.

Why a graph-safe sampler: eager sampling cost a decode step ~1.2-1.4 ms of host-bound kernels per stage plus a host
sync before it: more than the talker's whole graph. Here :meth:`BatchSampler.sample_device` is
fixed-shape device work with no host synchronisation, so the decode graphs capture it after their layers and a step
costs one graph replay and one transfer of the sampled ids.

The draw: top-k first, then top-p and the draw over those k values only (the tokens top-k removed have probability 0,
so top-p over the k survivors removes the same tokens as over the whole vocabulary; ties at the k-th value are the
only difference: ``topk`` keeps exactly k). The draw is the Gumbel-max trick, argmax(logit + Gumbel noise), which
samples exactly from the softmax. The noise is a hash of (row seed, row counter, rank, sampler salt)
(:mod:`pipeline.kernels.noise`), not torch's RNG: a graph replays it without generator state, and a seeded response
samples the same tokens whatever it is batched with, since its noise depends only on its own seed and how many tokens
it has sampled.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from pipeline.config import SamplingConfig
from pipeline.kernels.cuda_graphs import host_to_device
from pipeline.kernels.noise import uniform_noise
from pipeline.runners.decode_graphs import HostRow, HostValues

__all__ = ["BatchSampler", "DeviceSampleRows", "SampleRows", "SamplerSpec", "sample_host_rows", "sample_inputs"]


@dataclass(frozen=True)
class DeviceSampleRows:
    """:class:`SampleRows` as (B,) device tensors (:meth:`SampleRows.on`, or the row inputs of a decode graph:
    :func:`sample_host_rows`): int64 but ``force_continue``, bool."""

    rows: torch.Tensor
    force_continue: torch.Tensor
    seeds: torch.Tensor
    counters: torch.Tensor


@dataclass(frozen=True)
class SampleRows:
    """Per-row sampling inputs of one batch, on the host (:meth:`of`).

    ``rows``: the sampler table row of each batch row (its KV slot); ``force_continue``: stop ids suppressed (the
    row has not reached its minimum length); ``seeds`` and ``counters``: the row's noise seed and how many tokens it
    has sampled in this stage (see :func:`~pipeline.kernels.noise.uniform_noise`)."""

    rows: Sequence[int]
    force_continue: Sequence[bool]
    seeds: Sequence[int]
    counters: Sequence[int]

    @classmethod
    def of(
        cls, rows: Sequence[int], *, force_continue: Sequence[bool], seeds: Sequence[int], counters: Sequence[int]
    ) -> SampleRows:
        if not len(rows) == len(force_continue) == len(seeds) == len(counters):
            raise ValueError("sampling inputs of different lengths")
        return cls(tuple(rows), tuple(force_continue), tuple(seeds), tuple(counters))

    @classmethod
    def neutral(cls, size: int, row: int) -> SampleRows:
        """``size`` rows of table row ``row`` (a scratch row), not forced, seed 0: for steps whose caller samples
        nothing."""
        return cls.of([row] * size, force_continue=[False] * size, seeds=[0] * size, counters=[0] * size)

    def columns(self) -> tuple[Sequence[int], Sequence[bool], Sequence[int], Sequence[int]]:
        return (self.rows, self.force_continue, self.seeds, self.counters)

    def on(self, device: torch.device) -> DeviceSampleRows:
        """Host rows as device tensors, queued without waiting for the device's work (:func:`host_to_device`)."""
        dtypes = (torch.long, torch.bool, torch.long, torch.long)
        return DeviceSampleRows(*(host_to_device(c, d, device) for c, d in zip(self.columns(), dtypes)))


class BatchSampler:
    """Samples one token for each row of a (B, V) logits batch with one stage's settings, on the logits' device.

    The tokens each row's repetition penalty applies to live in a (rows, V) boolean table on the device, one row per
    KV slot: :meth:`reset` fills a row at the start of a response; sampling marks every sampled token.
    ``salt`` separates the noise of two samplers (thinker, talker) that see the same seeds and counters.
    """

    def __init__(
        self,
        cfg: SamplingConfig,
        *,
        vocab: int,
        rows: int,
        device: torch.device,
        suppress: Iterable[int] = (),
        stop: Iterable[int] = (),
        salt: int = 0,
    ) -> None:
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
            # queued without the host waiting (an index assignment would wait for the device)
            self.seen[row].index_fill_(0, host_to_device(ids, torch.long, self.device), True)

    def sample(
        self,
        logits: torch.Tensor,
        rows: list[int],
        *,
        force_continue: list[bool],
        seeds: list[int],
        counters: list[int],
    ) -> list[int]:
        """Eager convenience: ``logits`` (B, V), row b with table row ``rows[b]``. Returns the B sampled ids (one
        host transfer)."""
        batch = SampleRows.of(rows, force_continue=force_continue, seeds=seeds, counters=counters)
        return self.sample_device(logits, batch.on(self.device)).tolist()

    def sample_device(self, logits: torch.Tensor, batch: DeviceSampleRows) -> torch.Tensor:
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

    def _draw(self, logits: torch.Tensor, batch: DeviceSampleRows) -> torch.Tensor:
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
        return BatchSampler(
            self.cfg, vocab=vocab, rows=rows, device=device, suppress=self.suppress, stop=self.stop, salt=self.salt
        )


def sample_host_rows(scratch_row: int) -> tuple[HostRow, ...]:
    """The four sampler row inputs of a decode graph (after the step's own), in :meth:`SampleRows.columns` order;
    padding rows sample in the scratch row of the table, so they never mark a real slot's tokens as seen."""
    return (HostRow(torch.long, scratch_row), HostRow(torch.bool, 0), HostRow(torch.long, 0), HostRow(torch.long, 0))


def sample_inputs(
    size: int, scratch_row: int, sampler: BatchSampler | None, sample: SampleRows | None
) -> tuple[HostValues, ...]:
    """The sampler's host row inputs for a step of ``size`` rows: ``sample``'s, or neutral rows (scratch row) when
    the caller samples nothing; none without a sampler."""
    if sampler is None:
        return ()
    return (sample if sample is not None else SampleRows.neutral(size, scratch_row)).columns()

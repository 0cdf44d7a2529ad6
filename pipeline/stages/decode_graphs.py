"""Batched decode steps of a pooled decoder, replayed from CUDA graphs on a GPU.

A decode step of B rows (one token each, every row in its own KV slot at its own position) is a fixed-shape
function of three kinds of tensors: slots (B,), positions (B,) and the row inputs (token ids, talker vectors).
On CUDA with Triton available the step is captured once per batch size in ``batch_sizes`` (at engine start:
:meth:`BatchedDecode.capture`) and a step of B rows replays the smallest captured size >= B, the extra rows
writing to the pool's scratch slot at position 0. Without CUDA (or with ``cuda_graphs`` off) the same function
runs eagerly; batches larger than every captured size run eagerly with the device-side attention.

Why graphs: at batch 1 a 7B decode step is ~800 small kernels; eager launch overhead makes it ~10x slower
than reading the weights (BENCHMARKS.md §3).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from pipeline.cuda_graphs import CapturedCall, bucket_at_least
from pipeline.stages.decode_attention import triton_available
from pipeline.stages.kv_pool import KVPool

__all__ = ["BatchedDecode", "default_batch_sizes"]


def default_batch_sizes(max_rows: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then every multiple of 8 up to ``max_rows``: padding wastes at most 7 rows of a big batch."""
    sizes = [b for b in (1, 2, 4) if b < max_rows] + list(range(8, max_rows + 1, 8))
    if not sizes or sizes[-1] < max_rows:
        sizes.append(max_rows)
    return tuple(sizes)


class BatchedDecode:
    """Runs ``fn(slots, positions, *rows, graph_safe=...)`` and returns its tuple of (B, ...) outputs.

    ``row_inputs(b)`` builds example row inputs for a batch of ``b`` (used for capture and padding).
    Returned tensors of a replay are views of the graph's static outputs: valid until the next call.
    """

    def __init__(self, fn: Callable[..., tuple[torch.Tensor, ...]], *, pool: KVPool, device: torch.device,
                 cuda_graphs: bool, batch_sizes: Sequence[int], row_inputs: Callable[[int], tuple]) -> None:  # fmt: skip
        self.fn = fn
        self.pool = pool
        self.device = torch.device(device)
        self.graph_safe = triton_available(self.device)
        self.use_graphs = cuda_graphs and self.graph_safe
        self.batch_sizes = tuple(sorted(batch_sizes)) or default_batch_sizes(pool.slots.capacity)
        self.row_inputs = row_inputs
        self._graphs: dict[int, CapturedCall] = {}
        self.capture_stream: torch.cuda.Stream | None = None
        """One stream (so one cuBLAS workspace) for this step's graphs: they replay one at a time, on the engine
        thread; another stage's graphs get their own (see :class:`~pipeline.cuda_graphs.CapturedCall`)."""
        self.replays = 0
        self.eager_steps = 0

    def capture(self) -> None:
        """Record one graph per batch size (largest first). Seconds for a 7B model; call once at start."""
        if not self.use_graphs:
            return
        if self.capture_stream is None:
            self.capture_stream = torch.cuda.Stream(self.device)
        for b in sorted(self.batch_sizes, reverse=True):
            if b in self._graphs:
                continue
            slots = torch.full((b,), self.pool.scratch_slot, dtype=torch.long, device=self.device)
            positions = torch.zeros(b, dtype=torch.long, device=self.device)
            self._graphs[b] = CapturedCall(self._graph_fn, (slots, positions, *self.row_inputs(b)),
                                           capture_stream=self.capture_stream)

    @property
    def captured(self) -> tuple[int, ...]:
        return tuple(sorted(self._graphs))

    def _graph_fn(self, slots, positions, *rows):
        return self.fn(slots, positions, *rows, graph_safe=True)

    def __call__(self, slots: list[int], positions: list[int], *rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b = len(slots)
        bucket = bucket_at_least(b, self.captured) if self._graphs else None
        if bucket is None:
            self.eager_steps += 1
            slot_t = torch.tensor(slots, dtype=torch.long, device=self.device)
            pos_t = torch.tensor(positions, dtype=torch.long, device=self.device)
            return self.fn(slot_t, pos_t, *rows, graph_safe=self.graph_safe)
        pad = bucket - b
        slot_t = torch.tensor(slots + [self.pool.scratch_slot] * pad, dtype=torch.long)
        pos_t = torch.tensor(positions + [0] * pad, dtype=torch.long)
        padded = [torch.cat([x, x.new_zeros((pad, *x.shape[1:]))]) if pad else x for x in rows]
        outputs = self._graphs[bucket](slot_t, pos_t, *padded)
        self.replays += 1
        return tuple(o[:b] for o in outputs)

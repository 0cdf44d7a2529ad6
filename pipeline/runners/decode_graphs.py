"""Batched decode steps of a pooled decoder, replayed from CUDA graphs on a GPU.

A decode step of B rows (one token each, every row in its own KV slot at its own position) is a fixed-shape
function of three kinds of tensors: slots (B,), positions (B,) and the row inputs (token ids, talker vectors).
On CUDA with Triton available the step is captured once per batch size in ``batch_sizes`` (at engine start:
:meth:`BatchedDecode.capture`) and a step of B rows replays the smallest captured size >= B, the extra rows
writing to the pool's scratch slot at position 0. Without CUDA (or with ``cuda_graphs`` off) the same function
runs eagerly; batches larger than every captured size run eagerly with the device-side attention.

Why graphs: at batch 1 a 7B decode step is ~800 small kernels; eager launch overhead makes it ~10x slower
than reading the weights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import torch

from pipeline.kernels.cuda_graphs import CapturedCall, bucket_at_least, host_tensor, host_to_device
from pipeline.kernels.decode_attention import triton_available
from pipeline.runners.decoder import HostRope
from pipeline.runners.kv_pool import KVPool

__all__ = [
    "PREFILL_GRAPH_SIZES",
    "Advance",
    "BatchedDecode",
    "HostRow",
    "HostValues",
    "default_batch_sizes",
    "graphed_prefill",
    "prefill_graphs",
    "shifted_rope_rows",
]

PREFILL_GRAPH_SIZES = (8, 16, 32, 64, 128, 256, 512)
"""Prefill lengths (positions) captured as graphs; a span of T positions replays the smallest size >= T. Why: an
eager prefill launches ~1100 kernels one by one from Python, ~30 ms of host time against ~10 ms of device work for a
short span, and every response's prefill tail and talker start is on its first audio's path."""


def default_batch_sizes(max_rows: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then every multiple of 8 up to ``max_rows``: padding wastes at most 7 rows of a big batch."""
    sizes = [b for b in (1, 2, 4) if b < max_rows] + list(range(8, max_rows + 1, 8))
    if not sizes or sizes[-1] < max_rows:
        sizes.append(max_rows)
    return tuple(sizes)


@dataclass(frozen=True)
class HostRow:
    """A row input whose values the host knows (token ids, sampling settings): given as a list, ``dtype`` on the
    device, ``fill`` in padding rows (e.g. the scratch slot for an input that indexes per-slot state). With ``width``
    > 1 it is ``width`` values per row (rope positions on three axes): given as ``width`` lists, passed to the step as
    one (width, B) view."""

    dtype: torch.dtype = torch.long
    fill: int = 0
    width: int = 1


HostValues = Sequence[int | bool] | Sequence[Sequence[int]]
"""One host row input's values in a call: one per row, or ``width`` sequences of them (its :class:`HostRow` says
which)."""


def shifted_rope_rows(
    positions: Sequence[int], shifts: Sequence[int] | None, rope_len: int
) -> tuple[list[int], list[int], list[int]]:
    """The three rope-position rows (time, height, width) of decode rows at cache indices ``positions`` with rope shifts
    ``shifts`` (rope position - cache index, the same on every axis; None: 0), for a :class:`HostRow` of width 3.
    ValueError when a shifted position lies outside the cos/sin table's ``[0, rope_len)``."""
    rope = list(positions) if shifts is None else [p + d for p, d in zip(positions, shifts, strict=True)]
    if shifts is not None and any(not 0 <= p < rope_len for p in rope):
        raise ValueError(f"rope positions must lie in [0, {rope_len})")
    return rope, list(rope), list(rope)


class BatchedDecode:
    """Runs ``fn(slots, positions, *host_rows, *device_rows, graph_safe=...)`` and returns its tuple of (B, ...)
    outputs, where every argument is a (B, ...) device tensor.

    Inputs known on the host (slots, positions and the ``host_rows`` declared at construction) travel together: one
    pinned (2 + H, B) int64 tensor and one copy per step, so a step is queued without the host waiting for the
    device's earlier work and with one transfer instead of one per input. ``device_rows(b)`` builds example device
    row inputs for a batch of ``b`` (used for capture); padding rows get zeros in them. Returned tensors of a replay
    are views of the graph's static outputs: valid until the next call.
    """

    def __init__(
        self,
        fn: Callable[..., tuple[torch.Tensor, ...]],
        *,
        pool: KVPool,
        device: torch.device,
        cuda_graphs: bool,
        batch_sizes: Sequence[int],
        host_rows: Sequence[HostRow] = (),
        device_rows: Callable[[int], tuple] = lambda b: (),
    ) -> None:
        self.fn = fn
        self.host_rows = tuple(host_rows)
        self.pool = pool
        self.device = torch.device(device)
        self.graph_safe = triton_available(self.device)
        self.use_graphs = cuda_graphs and self.graph_safe
        self.batch_sizes = tuple(sorted(batch_sizes)) or default_batch_sizes(pool.slots.capacity)
        self.device_rows = device_rows
        self._graphs: dict[int, CapturedCall] = {}
        self.capture_stream: torch.cuda.Stream | None = None
        """One stream (so one cuBLAS workspace) for this step's graphs: they replay one at a time, on the engine
        thread; another stage's graphs get their own (see :class:`~pipeline.kernels.cuda_graphs.CapturedCall`)."""
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
            empty: list[HostValues] = [
                [] if row.width == 1 else [[] for _ in range(row.width)] for row in self.host_rows
            ]
            packed = self._pack([], [], empty, pad=b).to(self.device)
            self._graphs[b] = CapturedCall(
                self._graph_fn, (packed, *self.device_rows(b)), capture_stream=self.capture_stream
            )

    @property
    def captured(self) -> tuple[int, ...]:
        return tuple(sorted(self._graphs))

    def fits(self, rows: int) -> bool:
        """Whether a call of ``rows`` rows replays a captured graph."""
        return bool(self._graphs) and rows <= max(self._graphs)

    def _pack(
        self, slots: Sequence[int], positions: Sequence[int], host: Sequence[HostValues], pad: int
    ) -> torch.Tensor:
        """The host inputs as one (2 + H, B + pad) int64 host tensor, padding rows at the scratch slot, position 0."""
        if len(host) != len(self.host_rows):
            raise ValueError(f"expected {len(self.host_rows)} host row inputs, got {len(host)}")
        columns = [list(slots) + [self.pool.scratch_slot] * pad, list(positions) + [0] * pad]
        for values, row in zip(host, self.host_rows):
            # the row's width says which shape its values have
            lines = [cast(Sequence[int | bool], values)] if row.width == 1 else cast(Sequence[Sequence[int]], values)
            if len(lines) != row.width:
                raise ValueError(f"a host row input of width {row.width} got {len(lines)} lists")
            columns += [[int(v) for v in line] + [row.fill] * pad for line in lines]
        return torch.tensor(columns, dtype=torch.long)

    def _unpack(self, packed: torch.Tensor) -> tuple[torch.Tensor, ...]:
        host, at = [], 2
        for row in self.host_rows:
            value = packed[at] if row.width == 1 else packed[at : at + row.width]
            host.append(value if row.dtype == torch.long else value.to(row.dtype))
            at += row.width
        return (packed[0], packed[1], *host)

    def _graph_fn(self, packed, *device_rows):
        return self.fn(*self._unpack(packed), *device_rows, graph_safe=True)

    def __call__(
        self,
        slots: Sequence[int],
        positions: Sequence[int],
        host: Sequence[HostValues] = (),
        *device_rows: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """``host[i]``: the values of host row input ``i`` (one per row); ``device_rows``: (B, ...) device tensors."""
        b = len(slots)
        bucket = bucket_at_least(b, self.captured) if self._graphs else None
        if bucket is None:
            self.eager_steps += 1
            packed = host_to_device(self._pack(slots, positions, host, pad=0), torch.long, self.device)
            return self.fn(*self._unpack(packed), *device_rows, graph_safe=self.graph_safe)
        graph = self._graphs[bucket]
        self._load(graph, bucket - b, slots, positions, host, device_rows)
        outputs = graph.replay()
        self.replays += 1
        return tuple(o[:b] for o in outputs)

    def _load(
        self,
        graph: CapturedCall,
        pad: int,
        slots: Sequence[int],
        positions: Sequence[int],
        host: Sequence[HostValues],
        device_rows: Sequence[torch.Tensor],
    ) -> None:
        """Queue the copies of a call's inputs, padded with ``pad`` rows, into ``graph``'s static inputs."""
        # pinned: the graph's input copy is queued without the host waiting for the device
        packed = host_tensor(self._pack(slots, positions, host, pad=pad), torch.long, pinned=True)
        padded = [torch.cat([x, x.new_zeros((pad, *x.shape[1:]))]) if pad else x for x in device_rows]
        graph.load(packed, *padded)

    def chain(
        self,
        slots: Sequence[int],
        positions: Sequence[int],
        host: Sequence[HostValues],
        *device_rows: torch.Tensor,
        steps: int,
        advance: Advance,
        keep: int,
    ) -> torch.Tensor:
        """``steps`` calls in a row: the first with these inputs, each later one with the packed host inputs changed on
        the device by ``advance(packed, outputs, rows)`` from the previous call's outputs, and the same device rows.
        ``packed`` is the (2 + H, B') int64 device tensor of slots, positions and the host rows (B' >= ``rows`` with
        padding; ``advance`` changes only its first ``rows`` columns, in place), ``outputs`` the previous call's, cut to
        ``rows``. Nothing waits for the device, so the host queues the whole chain at once and reads its results once.
        Returns output ``keep`` of every call, stacked: (steps, rows, ...) (a copy)."""
        if steps < 1:
            raise ValueError(f"a chain needs at least one step, got {steps}")
        b = len(slots)
        bucket = bucket_at_least(b, self.captured) if self._graphs else None
        if bucket is None:
            packed = host_to_device(self._pack(slots, positions, host, pad=0), torch.long, self.device)

            def call() -> tuple[torch.Tensor, ...]:
                self.eager_steps += 1
                return self.fn(*self._unpack(packed), *device_rows, graph_safe=self.graph_safe)
        else:
            graph = self._graphs[bucket]
            self._load(graph, bucket - b, slots, positions, host, device_rows)
            packed = graph.inputs[0]

            def call() -> tuple[torch.Tensor, ...]:
                self.replays += 1
                return tuple(o[:b] for o in graph.replay())

        kept: list[torch.Tensor] = []
        outputs: tuple[torch.Tensor, ...] = ()
        for step in range(steps):
            if step:
                advance(packed, outputs, b)
            outputs = call()
            kept.append(outputs[keep].clone())  # the graph's buffer is overwritten by the next replay
        return torch.stack(kept)


Advance = Callable[[torch.Tensor, tuple[torch.Tensor, ...], int], None]
"""``(packed, outputs, rows)``: device work that makes the next chained call's packed host inputs from the last call's
outputs (:meth:`BatchedDecode.chain`)."""


def prefill_graphs(decoder, *, width: int, dtype: torch.dtype, cuda_graphs: bool) -> BatchedDecode:
    """Graphs of ``decoder``'s graph-safe row step over input vectors (T, ``width``), captured at
    :data:`PREFILL_GRAPH_SIZES` rows, for :func:`graphed_prefill` (``decoder``: a
    :class:`~pipeline.runners.decoder.PooledDecoder`)."""

    def step(slots, positions, rope, x, *, graph_safe: bool):
        return (decoder.decode(x, slots, positions, rope, graph_safe=graph_safe),)

    return BatchedDecode(
        step,
        pool=decoder.pool,
        device=decoder.device,
        cuda_graphs=cuda_graphs,
        batch_sizes=PREFILL_GRAPH_SIZES,
        host_rows=(HostRow(width=3),),
        device_rows=lambda b: (torch.zeros(b, width, dtype=dtype, device=decoder.device),),
    )


def graphed_prefill(
    prefill: BatchedDecode, spans: Sequence[tuple[int, torch.Tensor, int, HostRope | None]]
) -> list[torch.Tensor]:
    """Spans ``(slot, x, start, rope)``: the cache indices ``start .. start+T-1`` of ``slot`` with input vectors ``x``
    (T, H) and rope positions ``rope`` (3, T) int64 on the host (None: the cache indices), every span's positions as
    rows of one captured step (``prefill`` runs a decoder's graph-safe row step): each row writes its key/value, then
    attends over its slot up to its own position, so a span's rows see each other causally as in a prefill (spans must
    not share positions of a slot). Returns each span's (T, H), copies (the graph's buffer is reused by the next
    call). The caller checks :meth:`BatchedDecode.fits` for the total first."""
    slots: list[int] = []
    positions: list[int] = []
    rope_rows: list[list[int]] = [[], [], []]
    for slot, x, start, rope in spans:
        if start + x.shape[0] > prefill.pool.max_len:
            raise ValueError(f"positions up to {start + x.shape[0]} exceed the KV pool's {prefill.pool.max_len}")
        slots += [slot] * x.shape[0]
        indices = range(start, start + x.shape[0])
        positions += indices
        for axis, line in enumerate(rope_rows):
            line += indices if rope is None else rope[axis].tolist()
    (hidden,) = prefill(slots, positions, (rope_rows,), torch.cat([x for _, x, _, _ in spans]))
    return list(hidden.clone().split([x.shape[0] for _, x, _, _ in spans]))

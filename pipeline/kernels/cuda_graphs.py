"""One function of CUDA tensors recorded in a CUDA graph and replayed with fresh inputs, for every stage that
captures its GPU work (the thinker/talker decode steps, token2wav's ODE solve and vocoder).

A graph replays fixed shapes from fixed buffers; callers pick a few shapes worth capturing (:func:`bucket_at_least`)
and pad their inputs to them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import torch
from torch import Tensor

from pipeline.errors import PipelineError

__all__ = [
    "CapturedCall",
    "GraphCaptureError",
    "bucket_at_least",
    "bucket_holding",
    "host_tensor",
    "host_to_device",
]


class GraphCaptureError(PipelineError):
    """A CUDA graph could not be captured or was replayed with inputs of the wrong shape."""

    code = "cuda_graph_capture"


Outputs = TypeVar("Outputs", bound=Tensor | tuple[Tensor, ...])
"""What a captured function returns: a tensor or a tuple of tensors (a call returns the same type)."""


class CapturedCall(Generic[Outputs]):
    """``fn(*inputs)`` recorded in one CUDA graph over static copies of ``example`` (all CUDA tensors).

    Contract for ``fn``: device work only (no host synchronisation, no copy from pageable host memory, no
    data-dependent shapes), returning a tensor or a tuple of tensors. It runs ``warmup_runs`` times on a side
    stream (lazy library initialisation must not happen during capture), then once under capture.

    Calling copies the given tensors into the static inputs (shapes must equal the example's), replays the graph on
    the current stream and returns the static outputs. They are overwritten by the next replay of this call, so
    a caller copies what it keeps before calling again. Each call owns a private memory pool: replaying one
    never touches another's outputs. Run capture and replay under ``torch.inference_mode()`` when ``fn`` runs a
    model, so no autograd state is recorded.

    ``capture_stream``: where the warm-up runs and the capture happens (default: a new stream for this call).
    cuBLAS keeps one workspace per stream, and a captured matrix product keeps the workspace of the stream it was
    captured on, so graphs captured on one stream must never replay at the same time (torch's default capture
    stream is shared by every graph of the process: pytorch/pytorch#193402). Graphs that always replay one after
    the other (the batch sizes of one decode step, the shapes of one synthesizer) share a stream, which saves a
    workspace per graph; graphs that may replay concurrently (decode on the engine thread, token2wav on its
    worker) must not.
    """

    def __init__(
        self,
        fn: Callable[..., Outputs],
        example: Sequence[Tensor],
        *,
        warmup_runs: int = 2,
        capture_stream: torch.cuda.Stream | None = None,
    ) -> None:
        if not example or not all(t.is_cuda for t in example):
            raise GraphCaptureError("CUDA graphs need CUDA tensors as inputs")
        device = example[0].device
        # Ordinary allocations, outside the graph's pool; contiguous whatever the example's layout.
        self._inputs = tuple(t.clone(memory_format=torch.contiguous_format) for t in example)
        with torch.cuda.device(device):
            side = capture_stream if capture_stream is not None else torch.cuda.Stream(device)
            self.capture_stream = side
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup_runs):
                    fn(*self._inputs)
            torch.cuda.current_stream().wait_stream(side)
            self._graph = torch.cuda.CUDAGraph()
            # thread_local: other threads of the process (another stage) may keep using CUDA during the capture.
            with torch.cuda.graph(self._graph, stream=side, capture_error_mode="thread_local"):
                self._outputs = fn(*self._inputs)
        self.replays = 0

    @property
    def input_shapes(self) -> tuple[torch.Size, ...]:
        return tuple(t.shape for t in self._inputs)

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        """The static input buffers a call copies its tensors into. Device work that writes them in stream order,
        followed by :meth:`replay`, runs the graph on the new values without any copy from the host."""
        return self._inputs

    def __call__(self, *inputs: Tensor) -> Outputs:
        self.load(*inputs)
        return self.replay()

    def load(self, *inputs: Tensor) -> None:
        """Queue the copies of ``inputs`` into the static inputs (shapes must equal the example's)."""
        shapes = tuple(t.shape for t in inputs)
        if shapes != self.input_shapes:
            raise GraphCaptureError(f"captured for input shapes {self.input_shapes}, called with {shapes}")
        for static, value in zip(self._inputs, inputs):
            static.copy_(value, non_blocking=True)

    def replay(self) -> Outputs:
        """Replay the graph on whatever the static inputs hold; returns the static outputs."""
        self._graph.replay()
        self.replays += 1
        return self._outputs


def bucket_at_least(size: int, buckets: Sequence[int]) -> int | None:
    """The smallest of ``buckets`` that holds ``size``, or None when all are smaller."""
    fitting = [b for b in buckets if b >= size]
    return min(fitting) if fitting else None


def bucket_holding(size: int, buckets: Sequence[int]) -> int:
    """The smallest of ``buckets`` that holds ``size``, for a caller whose sizes never exceed the largest bucket;
    ValueError when one does."""
    bucket = bucket_at_least(size, buckets)
    if bucket is None:
        raise ValueError(f"no bucket of {tuple(buckets)} holds {size}")
    return bucket


def host_tensor(values: Sequence | Tensor, dtype: torch.dtype, *, pinned: bool) -> Tensor:
    """A host tensor of ``values``; ``pinned``: in page-locked memory, so that a ``non_blocking`` copy of it to a GPU
    is queued on the stream without the host waiting (from pageable memory, torch's copy waits for the stream's
    queued work to finish: in a decode step that stalled the host for the whole graph)."""
    t = values.to(dtype) if isinstance(values, Tensor) else torch.tensor(list(values), dtype=dtype)
    return t.pin_memory() if pinned and not t.is_pinned() else t


def host_to_device(values: Sequence | Tensor, dtype: torch.dtype, device: torch.device | str) -> Tensor:
    """``values`` (host values or a host tensor) as a tensor on ``device``, queued without waiting for the device
    (see :func:`host_tensor`)."""
    device = torch.device(device)
    if device.type != "cuda":
        return host_tensor(values, dtype, pinned=False).to(device)
    return host_tensor(values, dtype, pinned=True).to(device, non_blocking=True)

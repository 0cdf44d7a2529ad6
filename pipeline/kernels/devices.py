"""Where a stage's GPU work goes when the stages are on different devices of one host.

torch operators run on their tensors' device, but three things follow the calling thread's *current* device instead:
Triton kernels (launched on the current device and its current stream), ``torch.cuda.current_stream()`` without an
argument, and ``torch.device("cuda")`` without an index. Every stage therefore runs its work inside
:func:`device_scope` of its own device, and the engine names devices with an index (:func:`concrete`).

Tensors that cross from one stage's device to another's are copied with ``Tensor.to``: a device-to-device copy never
waits on the host; torch orders it after the work queued on the current streams of both devices and uses peer access
(NVLink or PCIe peer to peer) where the pair of devices has it, enabling it on first use.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable

import torch

__all__ = ["concrete", "device_scope", "free_memory", "peer_access"]


def concrete(device: torch.device | str) -> torch.device:
    """``device`` with an index: ``cuda`` is the calling thread's current CUDA device (initializes CUDA)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def device_scope(device: torch.device | str) -> contextlib.AbstractContextManager:
    """The current CUDA device set to ``device`` for the block (restored after it); nothing for a CPU device."""
    device = torch.device(device)
    if device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def peer_access(devices: Iterable[torch.device]) -> dict[tuple[int, int], bool]:
    """For each ordered pair of distinct CUDA devices in ``devices``, whether the first can read the second's memory
    directly (a copy between two devices without it is staged through host memory by the driver)."""
    indices = sorted({d.index for d in devices if d.type == "cuda" and d.index is not None})
    return {(a, b): torch.cuda.can_device_access_peer(a, b) for a, b in itertools.permutations(indices, 2)}


def free_memory(device: torch.device) -> int:
    """Bytes a new allocation on CUDA ``device`` can take now: what the driver reports free plus what torch's caching
    allocator holds unused (it hands those blocks out before asking the driver)."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)

"""Which implementation of transformers' mixture-of-experts blocks the Qwen3-Omni thinker and talker run: chosen once,
when a checkpoint is assembled (:func:`~pipeline.models.qwen3_omni.checkpoint.assemble`, after its parts are placed),
by :func:`use_capturable_experts`.

transformers (5.17 on the GPU machines, 5.25 here) dispatches each experts block (``@use_experts_implementation``) on
``config._experts_implementation``. What the engine needs on CUDA is an implementation a CUDA graph can capture (its
decode steps and the frame talker's frame are replayed from graphs): no host synchronisation, no data-dependent shapes.

- ``grouped_mm`` (transformers' default): routing pairs sorted by expert, ``histc`` counts, ``cumsum`` offsets, two
  grouped GEMMs (``torch.nn.functional.grouped_mm``). torch runs them as one CUTLASS kernel that reads the offsets on
  the device only in bfloat16 on compute capability 9.x or 10.x (Hopper: H100, H200; Blackwell): capturable, each
  touched expert read once. Anywhere else on CUDA (another dtype, an older GPU) torch falls back to a loop over
  ``offs.cpu()``, a host synchronisation a graph cannot capture.
- ``batched_mm``: every routing pair gathers its expert's matrices and one batched GEMM runs them: capturable in every
  dtype and on every GPU, but it copies an expert's weights per routing pair (rows x top-k of them): far more memory
  and traffic, most of all in a prefill chunk's hundreds of rows.
- ``eager``: a Python loop over the experts hit, found with ``nonzero`` (a host synchronisation): never used here.

The choice: ``grouped_mm`` where torch's fast kernel runs (bfloat16 on Hopper or Blackwell: the packaged configs on
the H100/H200) and on the CPU (nothing is captured there); ``batched_mm`` elsewhere on CUDA (float32 runs of small
models, e.g. tests, or an older GPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["GROUPED_MM_ARCHITECTURES", "experts_implementation", "use_capturable_experts"]

GROUPED_MM_ARCHITECTURES = (9, 10)
"""Major compute capabilities whose bfloat16 grouped GEMM torch runs without reading the offsets on the host."""


def experts_implementation(device: torch.device | str, dtype: torch.dtype, capability: tuple[int, int] | None) -> str:
    """The experts implementation for a part whose weights are on ``device`` in ``dtype``; ``capability``: the CUDA
    device's compute capability (None off CUDA). See the module docstring."""
    if torch.device(device).type != "cuda":
        return "grouped_mm"
    fast = dtype == torch.bfloat16 and capability is not None and capability[0] in GROUPED_MM_ARCHITECTURES
    return "grouped_mm" if fast else "batched_mm"


def use_capturable_experts(part: PreTrainedModel | None) -> str | None:
    """Set a placed part's (an HF ``PreTrainedModel``: the thinker or the talker) experts implementation, its
    submodels' included, from the device and dtype of its weights; returns it (None: no part)."""
    if part is None:
        return None
    weight = next(part.parameters())
    capability = torch.cuda.get_device_capability(weight.device) if weight.device.type == "cuda" else None
    chosen = experts_implementation(weight.device, weight.dtype, capability)
    part.set_experts_implementation(chosen)
    return chosen

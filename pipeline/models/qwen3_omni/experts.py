"""Which implementation of transformers' mixture-of-experts blocks the Qwen3-Omni thinker and talker run: chosen once,
when a checkpoint is assembled (:func:`~pipeline.models.qwen3_omni.checkpoint.assemble`, after its parts are placed),
by :func:`use_capturable_experts`.

transformers (5.17 on the GPU machines, 5.25 here) dispatches each experts block (``@use_experts_implementation``) on
``config._experts_implementation``. What the engine needs on CUDA is an implementation a CUDA graph can capture (its
decode steps and the frame talker's frame are replayed from graphs): no host synchronisation, no data-dependent shapes.

- ``grouped_mm`` (transformers' default): routing pairs sorted by expert, ``histc`` counts, ``cumsum`` offsets, two
  grouped GEMMs (``torch.nn.functional.grouped_mm``). In bfloat16 on CUDA (SM80+) torch runs them as one CUTLASS
  kernel reading the offsets on the device: capturable, and each touched expert is read once. In any other dtype
  torch's CUDA kernel falls back to a loop over ``offs.cpu()`` (a host synchronisation: not capturable).
- ``batched_mm``: every routing pair gathers its expert's matrices and one batched GEMM runs them: capturable in every
  dtype, but it copies an expert's weights per routing pair (rows x top-k of them), far more memory and traffic.
- ``eager``: a Python loop over the experts hit, found with ``nonzero`` (a host synchronisation): never used here.

The choice: ``grouped_mm`` on CUDA in bfloat16 (the packaged configs' dtype there) and on the CPU (nothing is captured
there); ``batched_mm`` on CUDA in another dtype (float32 runs of small models, e.g. tests).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["experts_implementation", "use_capturable_experts"]


def experts_implementation(device: torch.device | str, dtype: torch.dtype) -> str:
    """The experts implementation for a part whose weights are on ``device`` in ``dtype`` (module docstring)."""
    if torch.device(device).type == "cuda" and dtype != torch.bfloat16:
        return "batched_mm"
    return "grouped_mm"


def use_capturable_experts(part: PreTrainedModel | None) -> str | None:
    """Set a placed part's (an HF ``PreTrainedModel``: the thinker or the talker) experts implementation, its
    submodels' included, from the device and dtype of its weights; returns it (None: no part)."""
    if part is None:
        return None
    weight = next(part.parameters())
    chosen = experts_implementation(weight.device, weight.dtype)
    part.set_experts_implementation(chosen)
    return chosen

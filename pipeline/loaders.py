"""Picklable recipes for a loaded checkpoint.

An engine whose core runs in a child process (``engine.process`` in the stage config) never loads the
weights in the caller's process: it hands the child one of these small frozen dataclasses, and the child
calls :meth:`load` itself, placing every stage as the stage config says. An engine on a thread calls the
same :meth:`load` in the caller's process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from pipeline.config import StageGraphConfig
    from pipeline.models.qwen2_5_omni.checkpoint import LoadedCheckpoint
    from pipeline.models.qwen2_5_omni.tiny import RandomModelSpec

STAGES = ("thinker", "talker", "token2wav")


class CheckpointLoader(Protocol):
    """Loads a checkpoint placed as ``cfg`` says. Implementations must pickle (they cross to the child)."""

    def load(self, cfg: StageGraphConfig) -> LoadedCheckpoint: ...


@dataclass(frozen=True)
class PretrainedCheckpoint:
    """A checkpoint folder, or a hub id already in the local Hugging Face cache (never downloads)."""

    model: str

    def load(self, cfg: StageGraphConfig) -> LoadedCheckpoint:
        from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

        return load_checkpoint(
            self.model,
            devices={name: cfg.stage(name).device for name in STAGES},
            dtypes={name: cfg.stage(name).torch_dtype for name in STAGES},
        )


@dataclass(frozen=True)
class RandomCheckpoint:
    """The random-weight architecture of ``spec`` built in memory (nothing downloaded or written but its
    tokenizer files), e.g. ``RandomModelSpec.qwen2_5_omni_7b()`` for GPU benchmarks. Built on the thinker's
    device, thinker and talker in ``dtype`` (default: the thinker's dtype), token2wav in float32."""

    spec: RandomModelSpec
    dtype: torch.dtype | None = None

    def load(self, cfg: StageGraphConfig) -> LoadedCheckpoint:
        from pipeline.models.qwen2_5_omni.tiny import build_random_model

        dtype = self.dtype if self.dtype is not None else cfg.thinker.torch_dtype
        return build_random_model(self.spec, device=cfg.thinker.device, dtype=dtype)

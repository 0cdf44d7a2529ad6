"""Picklable recipes for a loaded checkpoint.

An engine whose core runs in a child process (``engine.process`` in the stage config) never loads the
weights in the caller's process: it hands the child one of these small frozen dataclasses, and the child
calls :meth:`load` itself, placing every stage as the stage config says. An engine on a thread calls the
same :meth:`load` in the caller's process. Either way the stage config's ``model_family`` loads it
(:mod:`pipeline.models`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pipeline.config import check_devices
from pipeline.models import family_of

if TYPE_CHECKING:
    import torch

    from pipeline.config import StageGraphConfig
    from pipeline.models.family import Checkpoint

STAGES = ("thinker", "talker", "token2wav")


class CheckpointLoader(Protocol):
    """Loads a checkpoint placed as ``cfg`` says. Implementations must pickle (they cross to the child)."""

    def load(self, cfg: StageGraphConfig) -> Checkpoint: ...


@dataclass(frozen=True)
class PretrainedCheckpoint:
    """A checkpoint folder, or a hub id already in the local Hugging Face cache (never downloads)."""

    model: str

    def load(self, cfg: StageGraphConfig) -> Checkpoint:
        check_devices(cfg)
        return family_of(cfg.model_family).load_pretrained(
            self.model,
            devices={name: cfg.stage(name).device for name in STAGES},
            dtypes={name: cfg.stage(name).torch_dtype for name in STAGES},
        )


@dataclass(frozen=True)
class RandomCheckpoint:
    """The random-weight architecture of ``spec`` (the family's own description,
    :meth:`~pipeline.models.family.ModelFamily.random_spec`, e.g. its ``7b`` preset for GPU benchmarks) built in
    memory (nothing downloaded or written but its tokenizer files). Built on the thinker's device, thinker and talker
    in ``dtype`` (default: the thinker's dtype); then the talker and token2wav are moved to their own stages'
    devices."""

    spec: Any
    dtype: torch.dtype | None = None

    def load(self, cfg: StageGraphConfig) -> Checkpoint:
        check_devices(cfg)
        dtype = self.dtype if self.dtype is not None else cfg.thinker.torch_dtype
        return family_of(cfg.model_family).build_random(
            self.spec,
            device=cfg.thinker.device,
            dtype=dtype,
            devices={name: cfg.stage(name).device for name in STAGES},
        )

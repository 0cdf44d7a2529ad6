"""What every family's random checkpoint shares: its spec's presets, the marker file that says its weights are random,
building modules straight on a device in a dtype, the spec rules every family's sizes keep, the files besides the
weights that follow the released layout (``preprocessor_config.json``, ``generation_config.json``), and the scratch
folder of a model built in memory."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Self

import torch

from pipeline.errors import CheckpointError
from pipeline.models.common.hf_checkpoint import PREPROCESSOR_FILE, RANDOM_MARKER_FILE

ENDOFTEXT = "<|endoftext|>"
IM_END = "<|im_end|>"
"""The Qwen tokenizers' text end and turn end: what a thinker's generation config stops on (and pads with)."""


class RandomSpecPresets:
    """The presets every family's random model spec (``Qwen25OmniRandomModelSpec``, ``Qwen3OmniRandomModelSpec``: a
    frozen dataclass of sizes, all with defaults, among them ``seed`` and ``attention_sharpness``) has beside its
    released shape."""

    SHARPENED_ATTENTION: ClassVar[float]
    """The ``attention_sharpness`` of :meth:`sharpened`."""
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]
    """Set by the subclass's ``@dataclass`` (declared here so that the presets may ``replace`` and ``asdict`` it)."""
    seed: int
    attention_sharpness: float

    @classmethod
    def tiny(cls, seed: int = 0) -> Self:
        """The default sizes: a few MB; a short turn runs well under a second on one CPU core."""
        return dataclasses.replace(cls(), seed=seed)

    @classmethod
    def sharpened(cls, seed: int = 0) -> Self:
        """The tiny model with :attr:`SHARPENED_ATTENTION`: a wrong position changes its greedy tokens."""
        return dataclasses.replace(cls(), seed=seed, attention_sharpness=cls.SHARPENED_ATTENTION)

    def to_dict(self) -> dict[str, Any]:
        """Every size by name (JSON-serialisable: what the random-weights marker records)."""
        return dataclasses.asdict(self)


def write_random_marker(out_dir: Path, spec: Mapping[str, Any]) -> Path:
    """Write :data:`RANDOM_MARKER_FILE` into ``out_dir`` with ``spec`` (JSON-serialisable) and return its path."""
    marker = out_dir / RANDOM_MARKER_FILE
    marker.write_text(json.dumps({"random_weights": True, "spec": dict(spec)}, indent=2) + "\n")
    return marker


@contextlib.contextmanager
def default_device_and_dtype(device: str | torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Build modules directly on ``device`` in ``dtype`` (a large model built in float32 then cast would need twice
    the memory). Restores torch's default dtype on exit."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def check_common_spec(spec: Any, added_tokens: int) -> None:
    """The rules every family's random spec keeps: ``attention_sharpness`` positive, and the tokenizer
    (``tokenizer_bpe_vocab`` entries plus ``added_tokens``) within ``thinker_vocab``. CheckpointError naming the field
    otherwise."""
    if not spec.attention_sharpness > 0:
        raise CheckpointError("spec: attention_sharpness must be positive", param="attention_sharpness")
    tokenizer_size = spec.tokenizer_bpe_vocab + added_tokens
    if tokenizer_size > spec.thinker_vocab:
        raise CheckpointError(
            f"spec: the tokenizer has {tokenizer_size} tokens, more than thinker_vocab={spec.thinker_vocab}",
            param="thinker_vocab",
        )


def write_preprocessor_config(out_dir: Path, whisper: Mapping[str, Any], image: Mapping[str, Any]) -> None:
    """``preprocessor_config.json`` as released: the settings of a ``WhisperFeatureExtractor`` made with ``whisper``
    and the image processor's ``image`` in one object (each reference processor reads its own fields), keys sorted."""
    from transformers import WhisperFeatureExtractor

    WhisperFeatureExtractor(**whisper).save_pretrained(out_dir)
    file = out_dir / PREPROCESSOR_FILE
    settings = json.loads(file.read_text())
    settings.update(image)
    file.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")


def generation_config(ids: Mapping[str, int]) -> Any:
    """The thinker's ``GenerationConfig``: it stops on ``<|im_end|>`` or ``<|endoftext|>`` and pads with the latter
    (``ids``: the tokenizer's ids of its added tokens)."""
    from transformers import GenerationConfig

    return GenerationConfig(eos_token_id=[ids[IM_END], ids[ENDOFTEXT]], pad_token_id=ids[ENDOFTEXT])


@contextlib.contextmanager
def scratch_folder(prefix: str) -> Iterator[Path]:
    """A fresh temp folder for the files of a model built in memory: removed if the block raises, kept (the caller's
    to delete) otherwise."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise

"""Random-weight Qwen3-Omni checkpoints: a tiny one for CPU tests, the released 30B-A3B shape for GPU benchmarks.

:func:`make_random_checkpoint` writes the Hugging Face layout of the released checkpoints (config.json with
``model_type`` ``qwen3_omni_moe``, model.safetensors or shards + index, tokenizer files and chat template,
preprocessor_config.json, generation_config.json) plus the random-weights marker
(:data:`~pipeline.models.common.random_checkpoint.RANDOM_MARKER_FILE`), so the same loader serves test and real
models; ``enable_audio_output=False`` writes a text-only one without talker and code2wav weights, like the -Thinking
checkpoints. Everything is built offline and deterministically from ``spec.seed``.

The sizes live in :class:`~.tiny_spec.Qwen3OmniRandomModelSpec`, the config in :mod:`.tiny_config`, the other files in
:mod:`.tiny_files`, the weights and their tuning for end-to-end tests in :mod:`.tiny_weights`.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.models.common.random_checkpoint import generation_config, scratch_folder, write_random_marker
from pipeline.models.qwen3_omni.tiny_config import build_config, check_spec, token_ids
from pipeline.models.qwen3_omni.tiny_files import write_preprocessor_config, write_tokenizer
from pipeline.models.qwen3_omni.tiny_spec import TEST_ATTENTION_SHARPNESS, Qwen3OmniRandomModelSpec
from pipeline.models.qwen3_omni.tiny_weights import build_model

MAX_SHARD_SIZE = "5GB"
"""Shard size of written weights (larger weights are split into ``model-0000X-of-0000N.safetensors`` + index)."""


@dataclass
class RandomModel:
    """A random Qwen3-Omni built in memory (:func:`build_random_model`).

    ``path`` is a temp folder holding the tokenizer and preprocessor files (the caller may delete it once loaded);
    ``talker`` / ``code2wav`` are None for a text-only spec. ``source`` and ``random_weights`` are what the engine
    reads of any checkpoint."""

    source: str
    path: Path
    spec: Qwen3OmniRandomModelSpec
    config: Any
    model: Any
    tokenizer: Any
    feature_extractor: Any
    random_weights: bool = True

    @property
    def thinker(self) -> Any:
        return self.model.thinker

    @property
    def talker(self) -> Any:
        return getattr(self.model, "talker", None)

    @property
    def code2wav(self) -> Any:
        return getattr(self.model, "code2wav", None)


def make_random_checkpoint(
    out_dir: str | Path, spec: Qwen3OmniRandomModelSpec | None = None, *, dtype: torch.dtype = torch.float32
) -> Path:
    """Write a random checkpoint of ``spec`` (default: :meth:`Qwen3OmniRandomModelSpec.tiny`) to ``out_dir`` and
    return it.

    Offline, deterministic from ``spec.seed`` (the same seed and software versions give byte-identical weights),
    about a second for the tiny preset. Thinker and talker weights are stored in ``dtype``, code2wav in float32.
    ``out_dir`` may exist; files of the same names are replaced. :class:`~pipeline.errors.CheckpointError` for an
    inconsistent spec."""
    spec = spec if spec is not None else Qwen3OmniRandomModelSpec.tiny()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = build_config(spec)
    ids = write_tokenizer(out, spec)
    model = build_model(spec, config, ids, dtype=dtype)
    model.generation_config = generation_config(ids)
    model.save_pretrained(out, max_shard_size=MAX_SHARD_SIZE)
    write_preprocessor_config(out, spec)
    write_random_marker(out, spec.to_dict())
    return out


def build_random_model(
    spec: Qwen3OmniRandomModelSpec, *, device: str = "cpu", dtype: torch.dtype = torch.bfloat16
) -> RandomModel:
    """The model of ``spec`` built in memory on ``device`` (no weights on disk), e.g. the 30B-A3B shape on a GPU for
    benchmarks. Thinker and talker use ``dtype``, code2wav float32. The tokenizer and feature extractor are written to
    a fresh temp folder (:attr:`RandomModel.path`) and loaded from it."""
    from transformers import AutoTokenizer, WhisperFeatureExtractor

    config = build_config(spec)
    with scratch_folder("omni-random-qwen3-") as folder:
        ids = write_tokenizer(folder, spec)
        write_preprocessor_config(folder, spec)
        model = build_model(spec, config, ids, device=device, dtype=dtype)
        model.generation_config = generation_config(ids)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        feature_extractor = WhisperFeatureExtractor.from_pretrained(folder)
    return RandomModel(
        source=f"random:qwen3-omni:seed{spec.seed}",
        path=folder,
        spec=spec,
        config=config,
        model=model,
        tokenizer=tokenizer,
        feature_extractor=feature_extractor,
    )


def parameter_count(spec: Qwen3OmniRandomModelSpec) -> dict[str, int]:
    """Parameters of the model ``spec`` describes, per part (``thinker``, ``talker``, ``code2wav``) and ``total``,
    counted on the meta device (nothing allocated)."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    with torch.device("meta"):
        model = Qwen3OmniMoeForConditionalGeneration(build_config(spec))
    parts = {name: getattr(model, name, None) for name in ("thinker", "talker", "code2wav")}
    counts = {
        name: sum(p.numel() for p in part.parameters()) if part is not None else 0 for name, part in parts.items()
    }
    counts["total"] = sum(p.numel() for p in model.parameters())
    return counts


# --- Command line -----------------------------------------------------------------------------
PRESETS = {
    "tiny": Qwen3OmniRandomModelSpec.tiny,
    "sharpened": Qwen3OmniRandomModelSpec.sharpened,
    "30b-a3b": Qwen3OmniRandomModelSpec.qwen3_omni_30b_a3b,
}
PRESET_DTYPES = {"tiny": torch.float32, "sharpened": torch.float32, "30b-a3b": torch.bfloat16}
"""The 30B-A3B preset is stored in bfloat16 like the released checkpoint (about 70 GB)."""


def build_arg_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Write a random-weight Qwen3-Omni checkpoint.")
    parser.add_argument("--out", required=True, type=Path, help="output folder (created if missing)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="model size (default: tiny)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default: 0)")
    parser.add_argument(
        "--text-only",
        action="store_true",
        help="no talker or code2wav (enable_audio_output false), like the -Thinking checkpoints",
    )
    return parser


def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """``make-tiny-model --family qwen3-omni`` entry point: parse ``argv`` (default ``sys.argv[1:]``; ``prog``: the
    command's name in its help), write, report."""
    args = build_arg_parser(prog).parse_args(argv)
    spec = PRESETS[args.preset](seed=args.seed)
    if args.text_only:
        spec = dataclasses.replace(spec, enable_audio_output=False)
    start = time.perf_counter()
    out = make_random_checkpoint(args.out, spec, dtype=PRESET_DTYPES[args.preset])
    size_mb = sum(f.stat().st_size for f in out.iterdir() if f.is_file()) / 1e6
    kind = "text-only " if args.text_only else ""
    print(
        f"wrote {args.preset} {kind}random Qwen3-Omni checkpoint (seed {args.seed}) to {out}: {size_mb:.1f} MB "
        f"in {time.perf_counter() - start:.1f} s"
    )
    return 0


__all__ = [
    "PRESETS",
    "TEST_ATTENTION_SHARPNESS",
    "RandomModel",
    "Qwen3OmniRandomModelSpec",
    "build_config",
    "build_random_model",
    "check_spec",
    "main",
    "make_random_checkpoint",
    "parameter_count",
    "token_ids",
]

"""The Hugging Face checkpoint layout the Qwen-Omni families share: where a checkpoint folder is (a local folder, or a
hub id already in the local cache; nothing is downloaded), its weight files, tokenizer, the random-weights marker our
test checkpoints carry, and the checks every loader runs on what transformers loaded. Each check raises
:class:`~pipeline.errors.CheckpointError` naming the file or field."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.errors import CheckpointError

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
SINGLE_WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
PREPROCESSOR_FILE = "preprocessor_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
RANDOM_MARKER_FILE = "omni_realtime_random.json"
"""Written next to random weights by the families' makers: ``{"random_weights": true, "spec": {...}}``."""


def read_model_type(path: Path) -> str | None:
    """``model_type`` of ``path``'s config.json (None when the file has none); CheckpointError when it is missing or
    not JSON. Cheap: how a family is chosen for a folder before anything is loaded."""
    file = required_file(path, CONFIG_FILE)
    try:
        raw = json.loads(file.read_text())
    except ValueError as exc:
        raise CheckpointError(f"{CONFIG_FILE}: not valid JSON ({exc})") from exc
    value = raw.get("model_type") if isinstance(raw, dict) else None
    return value if isinstance(value, str) else None


def tokenizer_ids(tokenizer: Any, tokens: Any) -> dict[str, int]:
    """The id of each token string in ``tokens``; CheckpointError naming the first that the tokenizer lacks."""
    ids: dict[str, int] = {}
    for token in tokens:
        token_id = tokenizer.convert_tokens_to_ids(token)
        unknown = tokenizer.unk_token_id is not None and token_id == tokenizer.unk_token_id
        if token_id is None or (unknown and token != tokenizer.unk_token):
            raise CheckpointError(f"tokenizer: special token {token} is missing", param=token)
        ids[token] = int(token_id)
    return ids


def resolve_checkpoint_path(name_or_path: str | os.PathLike[str]) -> Path:
    """A local folder as is; otherwise a hub id (``Org/Name``) looked up in the local HF cache only. Cheap (no
    weights read): callers check a model this way before loading it. :class:`CheckpointError` says which of
    "no such folder", "a file, not a folder" or "not in the local cache" (with the download command) it is."""
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        return local.resolve()
    name = str(name_or_path)
    if local.exists():
        raise CheckpointError(f"{name}: a file, not a checkpoint folder", param="model")
    if name.count("/") != 1 or name.startswith((".", "/", "~")):
        raise CheckpointError(f"{name}: no such folder (nor a hub id of the form Org/Name)", param="model")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, local_files_only=True))
    except Exception as exc:  # huggingface_hub raises LocalEntryNotFoundError and friends
        raise CheckpointError(
            f"{name}: no such folder, and not in the local Hugging Face cache as a hub id (nothing is "
            f"downloaded here). Fetch it first with `hf download {name}` (huggingface_hub's command), or pass "
            f"a checkpoint folder. ({type(exc).__name__})",
            param="model",
        ) from exc


def is_random_checkpoint(path: Path) -> bool:
    marker = path / RANDOM_MARKER_FILE
    if not marker.is_file():
        return False
    try:
        return bool(json.loads(marker.read_text())["random_weights"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{RANDOM_MARKER_FILE}: malformed ({exc})") from exc


def required_file(path: Path, name: str) -> Path:
    file = path / name
    if not file.is_file():
        raise CheckpointError(f"{name}: missing from checkpoint folder {path}", param=name)
    return file


def check_weights_present(path: Path) -> None:
    if (path / SINGLE_WEIGHTS_FILE).is_file():
        return
    index = path / WEIGHTS_INDEX_FILE
    if not index.is_file():
        raise CheckpointError(f"{SINGLE_WEIGHTS_FILE} / {WEIGHTS_INDEX_FILE}: no weights in {path}", param="weights")
    try:
        shards = set(json.loads(index.read_text())["weight_map"].values())
    except (ValueError, KeyError, AttributeError) as exc:
        raise CheckpointError(f"{WEIGHTS_INDEX_FILE}: malformed ({exc})") from exc
    missing = sorted(s for s in shards if not (path / s).is_file())
    if missing:
        raise CheckpointError(f"{WEIGHTS_INDEX_FILE}: shard(s) missing: {', '.join(missing)}", param="weights")


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    if not any((path / name).is_file() for name in (*TOKENIZER_FILES, "vocab.json")):
        raise CheckpointError(f"tokenizer: no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {path}")
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # tokenizers / transformers raise assorted types on bad files
        raise CheckpointError(f"tokenizer: cannot be loaded from {path}: {exc}") from exc


def check_loading_info(info: Mapping[str, Any]) -> None:
    """transformers fills missing tensors with random values and only warns: refuse that here."""
    missing = sorted(info.get("missing_keys") or [])
    mismatched = list(info.get("mismatched_keys") or [])
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise CheckpointError(f"weights: {len(missing)} tensor(s) missing: {shown}", param="weights")
    if mismatched:
        raise CheckpointError(f"weights: tensor shapes disagree with {CONFIG_FILE}: {mismatched[:3]}", param="weights")
    unexpected = sorted(info.get("unexpected_keys") or [])
    if unexpected:
        logger.warning("weights: %d unexpected tensor(s) ignored, e.g. %s", len(unexpected), unexpected[:3])


def config_id(sub_config: Any, where: str, attr: str) -> int:
    value = getattr(sub_config, attr, None)
    if not isinstance(value, int) or isinstance(value, bool):
        raise CheckpointError(f"{CONFIG_FILE}: {where}.{attr} is missing or not an integer", param=f"{where}.{attr}")
    return value


def check_in_vocab(value: int, vocab_size: int, what: str) -> None:
    if not 0 <= value < vocab_size:
        raise CheckpointError(f"{CONFIG_FILE}: {what} = {value} is outside the vocabulary [0, {vocab_size})")


def check_distinct(ids: Mapping[str, int], what: str) -> None:
    seen: dict[int, str] = {}
    for name, value in ids.items():
        if value in seen:
            raise CheckpointError(f"{CONFIG_FILE}: {what} {seen[value]} and {name} share the id {value}")
        seen[value] = name

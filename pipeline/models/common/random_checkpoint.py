"""What every family's random checkpoint shares: the marker file that says its weights are random, and building
modules straight on a device in a dtype."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from pipeline.models.common.hf_checkpoint import RANDOM_MARKER_FILE


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

"""The embedded tiny model: a random-weight model of the packaged family (the ``tiny`` random preset of
:data:`pipeline.models.DEFAULT_FAMILY`) built offline on first use into a cache folder, so the server and demos run
on a fresh machine with nothing downloaded.

It is a test model, never an assistant: its checkpoint carries the ``omni_realtime_random.json``
marker, and the engine logs that loudly.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

from pipeline.models import DEFAULT_FAMILY, family_of

log = logging.getLogger(__name__)

EMBEDDED_MODEL = "embedded:tiny"
"""The ``--model`` value that selects the embedded tiny model (also the default)."""


def default_cache_dir() -> Path:
    """``~/.cache/omni-realtime`` (the CLI's ``--cache-dir`` overrides it)."""
    return Path.home() / ".cache" / "omni-realtime"


def ensure_tiny_checkpoint(cache_dir: Path | None = None, *, seed: int = 0) -> Path:
    """Return the tiny checkpoint folder, building it (seconds) if it is not cached yet.

    Built into a temporary sibling and renamed into place, so concurrent first runs never see a
    half-written checkpoint."""
    models = family_of(DEFAULT_FAMILY)
    spec = models.random_spec("tiny", seed=seed)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache_dir / f"tiny-{models.name}-seed{seed}-{_spec_digest(spec)}"
    if (target / "config.json").exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=cache_dir))
    log.info("building the embedded tiny model (random weights) into %s", target)
    models.write_random(tmp, spec)
    try:
        tmp.rename(target)
    except OSError:
        if not (target / "config.json").exists():
            raise
        log.info("another process built %s first", target)
    return target


def _spec_digest(spec) -> str:
    import hashlib
    from dataclasses import asdict

    return hashlib.sha256(json.dumps(asdict(spec), sort_keys=True, default=str).encode()).hexdigest()[:10]


def resolve_model(model: str | None, cache_dir: Path | None = None) -> str:
    """Map the CLI's ``--model`` (None or ``embedded:tiny`` for the embedded model) to a loadable
    folder or hub id."""
    if model in (None, EMBEDDED_MODEL):
        return str(ensure_tiny_checkpoint(cache_dir))
    return model

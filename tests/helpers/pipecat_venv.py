"""A virtual environment with pipecat installed, for the framework tests that run a pipecat agent in a subprocess
(pipecat is never installed into the project's own environment: its pins are not ours)."""

from __future__ import annotations

import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

PIPECAT = "pipecat-ai[openai]==1.14.0"
INSTALL_TIMEOUT_S = 600


def pipecat_python(request, tmp_path_factory) -> Path:
    """The interpreter of a venv holding :data:`PIPECAT`, built once and kept in pytest's cache folder when the cache
    is on (else in a temporary folder); skips the calling test, saying why, when pip cannot install it (offline)."""
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("venv-pipecat-1.14.0") if cache is not None else tmp_path_factory.mktemp("venv-pipecat")
    python = folder / "bin" / "python"
    marker = folder / "installed.txt"
    if marker.is_file() and marker.read_text() == PIPECAT and python.is_file():
        return python
    start = time.monotonic()
    venv.EnvBuilder(with_pip=True, clear=True).create(folder)
    try:
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", PIPECAT],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip did not install {PIPECAT} within {INSTALL_TIMEOUT_S} s (offline?)")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"pip could not install {PIPECAT} (offline?): {last}")
    marker.write_text(PIPECAT)
    print(f"pip installed {PIPECAT} in {time.monotonic() - start:.1f} s", file=sys.stderr)
    return python

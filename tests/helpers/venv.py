"""A Python virtual environment for a framework the tests drive in a subprocess (LiveKit Agents, pipecat): built with
``python -m venv`` and ``pip install`` of pinned requirements, never in the test interpreter's own environment (the
framework's dependencies are not ours to pin). The folder is reused while its stamp names the same requirements:
kept in pytest's cache folder when the cache is on, it is built once and not again on later runs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

STAMP = "requirements.json"
"""Written into the folder once the install succeeded: the requirements and the install's duration in seconds."""


def venv_python(folder: Path) -> Path:
    return folder / "bin" / "python"


def cached_venv(request, tmp_path_factory, name: str, requirements: tuple[str, ...], *, timeout_s: float) -> Path:
    """:func:`built_venv` in pytest's cache folder ``name`` when the cache is on (built once across runs), else in a
    temporary folder (built for this session)."""
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir(name) if cache is not None else tmp_path_factory.mktemp(name)
    return built_venv(folder, requirements, timeout_s=timeout_s)


def built_venv(folder: Path, requirements: tuple[str, ...], *, timeout_s: float) -> Path:
    """The interpreter of a venv in ``folder`` holding ``requirements`` (a reused one when its stamp matches).
    Skips the calling test, naming the reason (pip's last line), when the venv cannot be made or pip cannot
    install (no network, no matching wheel); ``timeout_s`` bounds the install."""
    python, stamp = venv_python(folder), folder / STAMP
    if stamp.is_file() and json.loads(stamp.read_text())["requirements"] == list(requirements) and python.is_file():
        return python
    stamp.unlink(missing_ok=True)
    start = time.monotonic()
    steps = (
        [sys.executable, "-m", "venv", "--clear", str(folder)],
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements],
    )
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.skip(f"installing {' '.join(requirements)} took more than {timeout_s:g} s")
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.strip()] or ["no output"]
            pytest.skip(f"cannot install {' '.join(requirements)}: {lines[-1]}")
    seconds = round(time.monotonic() - start, 1)
    stamp.write_text(json.dumps({"requirements": list(requirements), "install_s": seconds}))
    return python

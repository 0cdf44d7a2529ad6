"""A Python virtual environment for a framework the tests drive in a subprocess (LiveKit Agents, pipecat): built with
``uv venv`` and ``uv pip install`` of pinned requirements (uv, from the dev extra, resolves and installs in seconds
where ``python -m venv`` and pip take most of a minute), never in the test interpreter's own environment (the
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


def uv_binary() -> str:
    """The ``uv`` executable of the ``uv`` package (the dev extra); skips the calling test, naming the reason, when
    that package is not installed."""
    uv = pytest.importorskip("uv", reason="the framework tests build their venv with uv: pip install -e '.[dev]'")
    return uv.find_uv_bin()


def built_venv(folder: Path, requirements: tuple[str, ...], *, timeout_s: float) -> Path:
    """The interpreter of a venv in ``folder`` (on this interpreter's Python) holding ``requirements`` (a reused one
    when its stamp matches). Skips the calling test, naming the reason (:func:`failure`), when the venv cannot be made
    or uv cannot install (no network, no matching wheel); ``timeout_s`` bounds each of the two steps."""
    python, stamp = venv_python(folder), folder / STAMP
    if stamp.is_file() and json.loads(stamp.read_text())["requirements"] == list(requirements) and python.is_file():
        return python
    stamp.unlink(missing_ok=True)
    uv = uv_binary()
    start = time.monotonic()
    steps = (
        [uv, "venv", "--quiet", "--clear", "--python", sys.executable, str(folder)],
        [uv, "pip", "install", "--quiet", "--python", str(python), *requirements],
    )
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.skip(f"installing {' '.join(requirements)} took more than {timeout_s:g} s")
        if done.returncode != 0:
            pytest.skip(f"cannot install {' '.join(requirements)}: {failure(done.stderr)}")
    seconds = round(time.monotonic() - start, 1)
    stamp.write_text(json.dumps({"requirements": list(requirements), "install_s": seconds}))
    return python


def failure(stderr: str) -> str:
    """uv's error in one line: its first line (what failed) and, when there is more, its last (the root cause, such as
    ``Connection refused`` or the unsatisfiable requirement)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()] or ["no output"]
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"

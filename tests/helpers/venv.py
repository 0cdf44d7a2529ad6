"""A Python virtual environment for a framework the tests drive in a subprocess (LiveKit Agents, pipecat): built with
``uv venv`` and ``uv pip install`` of pinned requirements (uv, from the dev extra, resolves and installs in seconds
where ``python -m venv`` and pip take most of a minute), never in the test interpreter's own environment (the
framework's dependencies are not ours to pin). The folder is reused while its stamp names the same requirements:
kept in pytest's cache folder when the cache is on, it is built once and not again on later runs.

A test marked ``@pytest.mark.background(VENV)`` has the install started in the background when collection finishes
(tests/helpers/background.py); :meth:`FrameworkVenv.python` waits for it (or installs now)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from tests.helpers.background import BackgroundProcess

STAMP = "requirements.json"
"""Written into the folder once the install succeeded: the requirements."""


def venv_python(folder: Path) -> Path:
    return folder / "bin" / "python"


def uv_binary() -> str | None:
    """The ``uv`` executable of the ``uv`` package (the dev extra); None when that package is not installed."""
    try:
        import uv
    except ImportError:
        return None
    return uv.find_uv_bin()


def failure(stderr: str) -> str:
    """uv's error in one line: its first line (what failed) and, when there is more, its last (the root cause, such as
    ``Connection refused`` or the unsatisfiable requirement)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()] or ["no output"]
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"


class FrameworkVenv:
    """A venv named ``name`` (its folder in pytest's cache when the cache is on, else a temporary one removed when the
    session ends) on this interpreter's Python, holding ``requirements``; ``timeout_s`` bounds each step, counted
    for the install from when its test begins waiting."""

    def __init__(self, name: str, requirements: tuple[str, ...], *, timeout_s: float) -> None:
        self.name, self.requirements, self.timeout_s = name, requirements, timeout_s
        self._lock = threading.Lock()
        self._prepared = False
        self._folder: Path | None = None
        self._install: BackgroundProcess | None = None
        self._skip: str | None = None

    def start_in_background(self, config) -> BackgroundProcess | None:
        """The install to run (None when the venv is already there or cannot be made)."""
        return self._prepare(config)

    def python(self, config) -> Path:
        """The venv's interpreter once the requirements are installed. Skips the calling test, naming the reason
        (:func:`failure`), when uv is missing, the venv cannot be made or uv cannot install (no network, no matching
        wheel) or the install takes longer than ``timeout_s``."""
        install = self._prepare(config)
        if self._skip is not None:
            pytest.skip(self._skip)
        if install is not None:
            try:
                done = install.wait(self.timeout_s)
            except subprocess.TimeoutExpired:
                pytest.skip(f"installing {' '.join(self.requirements)} took more than {self.timeout_s:g} s")
            if done.returncode != 0:
                pytest.skip(f"cannot install {' '.join(self.requirements)}: {failure(done.stderr)}")
            (self._folder / STAMP).write_text(json.dumps({"requirements": list(self.requirements)}))
        return venv_python(self._folder)

    def _prepare(self, config) -> BackgroundProcess | None:
        """Once: the folder; unless its stamp matches, a fresh venv there (``uv venv``, quick) and the install to run
        in it, not started yet."""
        with self._lock:
            if not self._prepared:
                self._prepared = True
                self._folder = self._folder_of(config)
                self._install = self._venv_and_install()
            return self._install

    def _folder_of(self, config) -> Path:
        cache = getattr(config, "cache", None)
        if cache is not None:
            return cache.mkdir(self.name)
        folder = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
        return folder

    def _venv_and_install(self) -> BackgroundProcess | None:
        python, stamp = venv_python(self._folder), self._folder / STAMP
        if stamp.is_file() and json.loads(stamp.read_text())["requirements"] == list(self.requirements):
            if python.is_file():
                return None
        stamp.unlink(missing_ok=True)
        uv = uv_binary()
        if uv is None:
            self._skip = "the framework tests build their venv with uv: pip install -e '.[dev]'"
            return None
        venv = [uv, "venv", "--quiet", "--clear", "--python", sys.executable, str(self._folder)]
        try:
            done = subprocess.run(venv, capture_output=True, text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self._skip = f"making the venv for {' '.join(self.requirements)} took more than {self.timeout_s:g} s"
            return None
        if done.returncode != 0:
            self._skip = f"cannot make a venv for {' '.join(self.requirements)}: {failure(done.stderr)}"
            return None
        return BackgroundProcess([uv, "pip", "install", "--quiet", "--python", str(python), *self.requirements])

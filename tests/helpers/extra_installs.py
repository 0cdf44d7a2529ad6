"""Each extra of pyproject.toml installed alone, as a new user installs it: a fresh venv without system site-packages
per extra, holding torch (the version this interpreter runs, from the sources pip is configured with) and
``-e REPO[extra]`` and nothing else, in which every module the extra serves is imported and its commands run.

Built with ``uv`` (the dev extra): ``uv venv`` and ``uv pip install`` hardlink packages from uv's cache, so a venv
with torch takes seconds once the cache holds them (the first run downloads what the cache lacks). uv does not read
pip's configuration, so :func:`pip_sources` passes pip's package sources (``pip config list``: index, extra indexes,
find-links, constraints) to it, with pip's choice among them (the best match over all sources, not the first index
that has a package): torch comes from where ``pip install torch==X`` takes it.

The venvs are built and checked by one process (``python -m tests.helpers.extra_installs SPEC``), one after another
at one path, each removed before the next is made: what they share, sources at the same paths and hardlinked from
one cache (same file times), lets them share one bytecode cache (``pycache_prefix``), so torch and transformers are
compiled once, not once per venv; a module missing from a venv is still missing (a cached ``.pyc`` is only used
beside its source). A test marked ``@pytest.mark.background(task)`` has the process started when collection
finishes (tests/helpers/background.py); :meth:`ExtraInstalls.result` waits for it and returns one extra's outcome,
which the test checks. The process prints one JSON object: extra -> ``{"install": ..., "imports": ..., "commands":
..., "seconds": ...}``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.background import BackgroundProcess
from tests.helpers.paths import REPO
from tests.helpers.venv import failure, uv_binary, venv_python

IMPORT_ALL = """\
import importlib, json, sys, traceback
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:  # reported to the test, which fails on it
        failed[name] = "".join(traceback.format_exception_only(exc)).strip()
print(json.dumps(failed))
"""
"""Run with ``python -I -c`` in a venv: imports each module named on the command line and prints the failures
(module -> exception) as JSON; ``-I`` keeps the current folder and ``PYTHONPATH`` off ``sys.path``."""

STEP_TIMEOUT_S = 600.0
"""The longest one step (a venv, an install, the imports, a command) may take."""


@dataclass(frozen=True)
class ExtraCheck:
    """What installing ``extra`` (``""``: the plain install) must make work: importing ``modules``, and each of
    ``commands`` (argv run from the repository, its first element a program of the venv's ``bin/``) exiting 0."""

    extra: str
    modules: tuple[str, ...]
    commands: tuple[tuple[str, ...], ...] = ()

    @property
    def requirement(self) -> str:
        return f"{REPO}[{self.extra}]" if self.extra else str(REPO)


@dataclass(frozen=True)
class ExtraResult:
    installed: bool
    install_error: str
    failed_imports: dict[str, str]
    """Module -> the exception importing it raised."""
    failed_commands: dict[str, str]
    """Command line -> its exit status and the end of its output."""


def pip_sources() -> list[str]:
    """uv's options for the package sources pip is configured with (``pip config list``: files and ``PIP_*``
    variables, a variable overriding a file's value), and pip's way of choosing among them."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True, timeout=60
    )
    values: dict[str, str] = {}
    for line in sorted(done.stdout.splitlines(), key=lambda line: line.startswith(":env:")):  # variables last
        key, _, value = line.partition("=")
        values[key.rpartition(".")[2]] = value.strip().strip("'\"")
    options = ["--index-strategy", "unsafe-best-match"]
    for key, option in (
        ("index-url", "--index-url"),
        ("extra-index-url", "--extra-index-url"),
        ("find-links", "--find-links"),
        ("constraint", "--constraint"),
    ):
        for value in values.get(key, "").split():
            options += [option, value]
    return options


def torch_requirement() -> str:
    """``torch==`` this interpreter's torch release (its local build tag left to the sources, as pip does)."""
    import torch

    return f"torch=={torch.__version__.split('+')[0]}"


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, **kwargs)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(argv, -1, "", f"timed out after {exc.timeout:g} s")


def check_extra(check: ExtraCheck, folder: Path, pycache: Path, uv: str, sources: list[str], torch: str) -> dict:
    """Make the venv of ``check.extra`` in ``folder``, install torch and the extra, import and run what it serves
    (bytecode cached under ``pycache``); ``seconds``: each stage's wall time."""
    python, seconds = venv_python(folder), {}
    # the venv's programs see neither this session's PYTHONPATH nor its packages
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPYCACHEPREFIX": str(pycache)}
    for stage, argv in (
        ("venv", [uv, "venv", "--quiet", "--python", sys.executable, str(folder)]),
        (
            "install",
            [uv, "pip", "install", "--quiet", "--python", str(python), *sources, torch, "-e", check.requirement],
        ),
    ):
        done = _timed(seconds, stage, argv)
        if done.returncode != 0:
            return {"install": failure(done.stderr or done.stdout), "seconds": seconds}
    import_all = [str(python), "-I", "-X", f"pycache_prefix={pycache}", "-c", IMPORT_ALL, *check.modules]
    done = _timed(seconds, "imports", import_all, cwd=folder)
    if done.returncode != 0:
        imports = {"(the import check itself)": failure(done.stderr or done.stdout)}
    else:
        imports = json.loads(done.stdout.splitlines()[-1])
    commands = {}
    for command in check.commands:
        done = _timed(seconds, " ".join(command), [str(folder / "bin" / command[0]), *command[1:]], cwd=REPO, env=env)
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
            commands[" ".join(command)] = f"exit status {done.returncode}:\n" + "\n".join(tail)
    return {"install": None, "imports": imports, "commands": commands, "seconds": seconds}


def _timed(seconds: dict[str, float], stage: str, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    start = time.monotonic()
    done = _run(argv, **kwargs)
    seconds[stage] = round(time.monotonic() - start, 1)
    return done


def main(spec_path: str) -> None:
    """Check each extra of the spec (``{"folder": ..., "checks": [ExtraCheck fields, ...]}``), one after another in
    ``folder/venv``; print the results as JSON."""
    spec = json.loads(Path(spec_path).read_text())
    checks = [ExtraCheck(c["extra"], tuple(c["modules"]), tuple(map(tuple, c["commands"]))) for c in spec["checks"]]
    uv, sources, torch = uv_binary(), pip_sources(), torch_requirement()
    root = Path(spec["folder"])
    results = {}
    for check in checks:
        shutil.rmtree(root / "venv", ignore_errors=True)
        results[check.extra] = check_extra(check, root / "venv", root / "pycache", uv, sources, torch)
    print(json.dumps(results))


class ExtraInstalls:
    """The task that checks every extra of ``checks``, once per session (``@pytest.mark.background(task)``); its
    venvs live in a temporary folder removed when the session ends."""

    def __init__(self, checks: list[ExtraCheck], *, timeout_s: float) -> None:
        self.checks, self.timeout_s = checks, timeout_s
        self._lock = threading.Lock()
        self._process: BackgroundProcess | None = None
        self._results: dict | None = None
        self._skip: str | None = None

    def start_in_background(self, config) -> BackgroundProcess | None:
        return self._prepare(config)

    def _prepare(self, config) -> BackgroundProcess | None:
        with self._lock:
            if self._process is None and self._skip is None:
                if uv_binary() is None:
                    self._skip = "the extras are installed with uv: pip install -e '.[dev]'"
                    return None
                folder = Path(tempfile.mkdtemp(prefix="extra-installs-"))
                config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
                spec = {"folder": str(folder), "checks": [c.__dict__ for c in self.checks]}
                (folder / "spec.json").write_text(json.dumps(spec))
                argv = [sys.executable, "-m", "tests.helpers.extra_installs", str(folder / "spec.json")]
                self._process = BackgroundProcess(argv, cwd=REPO)
            return self._process

    def result(self, config, extra: str) -> ExtraResult:
        """``extra``'s outcome, waiting for the task (at most ``timeout_s`` from now). Skips the calling test when
        uv is missing."""
        import pytest

        process = self._prepare(config)
        if self._skip is not None:
            pytest.skip(self._skip)
        with self._lock:
            if self._results is None:
                done = process.wait(self.timeout_s)
                assert done.returncode == 0, f"the install check failed: {failure(done.stderr)}"
                self._results = json.loads(done.stdout.splitlines()[-1])
        found = self._results[extra]
        if found["install"] is not None:
            return ExtraResult(False, found["install"], {}, {})
        return ExtraResult(True, "", found["imports"], found["commands"])


if __name__ == "__main__":
    main(sys.argv[1])

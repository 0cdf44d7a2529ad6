"""Triton kernel checks run in a fresh interpreter: a script that prints "ok" when its checks pass. On the GPU its
kernels compile; without one they run in Triton's interpreter (``TRITON_INTERPRET=1``, read when Triton is imported,
hence the subprocess), which takes seconds to tens of seconds of one core per check.

A test marked ``@pytest.mark.triton_check(CHECK)`` has ``CHECK`` started when the session's collection finishes
(:func:`start_in_background`, from tests/conftest.py): one check after another, in a background thread, each process
at the lowest CPU priority, so that it runs on a core the tests leave idle and yields the CPU to them otherwise. The
test itself (:meth:`TritonCheck.assert_ok`) starts the check if it has not started yet, waits for it and asserts
its exit status and "ok"; its timeout counts from when the test begins waiting."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import threading

import pytest
import torch

from tests.helpers.paths import REPO

LOWEST_PRIORITY = 19
"""The niceness of a check started in the background (the highest value, the smallest share of a busy CPU)."""


def _runnable(interpreter_only: bool) -> bool:
    return importlib.util.find_spec("triton") is not None and not (interpreter_only and torch.cuda.is_available())


class TritonCheck:
    """``code`` run by ``python -c code *args`` with the repository and its tests folder on the path and torch on one
    thread; ``interpreter_only``: the test skips with CUDA (where another test runs the compiled kernel), so the check
    is not started in the background there."""

    def __init__(self, code: str, *args: str, timeout_s: float = 600, interpreter_only: bool = False) -> None:
        self.code, self.args, self.timeout_s, self.interpreter_only = code, args, timeout_s, interpreter_only
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._out = self._err = None

    def start(self, *, background: bool) -> subprocess.Popen:
        """The check's process, started now unless it already was (at the lowest priority when ``background``)."""
        with self._lock:
            if self._process is None:
                # the tests folder too, as pytest puts it on the path: a check may import a test module
                paths = (str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", ""))
                path = os.pathsep.join(p for p in paths if p)
                env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
                if not torch.cuda.is_available():
                    env["TRITON_INTERPRET"] = "1"
                self._out, self._err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
                self._process = subprocess.Popen(
                    [sys.executable, "-c", self.code, *self.args],
                    cwd=REPO,
                    env=env,
                    stdout=self._out,
                    stderr=self._err,
                    text=True,
                )
                if background:
                    os.setpriority(os.PRIO_PROCESS, self._process.pid, LOWEST_PRIORITY)
            return self._process

    def assert_ok(self) -> None:
        """Skips without Triton (or, for an ``interpreter_only`` check, with CUDA); else waits at most ``timeout_s``
        for the check (started now if it has not been) and asserts that it exited 0 and printed "ok"."""
        pytest.importorskip("triton", reason="Triton is not installed (CUDA builds of torch include it)")
        if self.interpreter_only and torch.cuda.is_available():
            pytest.skip("with CUDA the compiled kernels are tested instead")
        process = self.start(background=False)
        try:
            process.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"the Triton check took more than {self.timeout_s:g} s")
        self._out.seek(0)
        self._err.seek(0)
        stdout, stderr = self._out.read(), self._err.read()
        assert process.returncode == 0 and "ok" in stdout, stderr[-3000:]

    def stop(self) -> None:
        """Kill the check's process if it still runs (the session ends early, or the check timed out)."""
        with self._lock:
            if self._process is not None and self._process.poll() is None:
                self._process.kill()
                self._process.wait()


def marked_checks(items) -> list[TritonCheck]:
    """The checks of the ``triton_check`` markers of ``items`` that can run here, each once, in the items' order."""
    checks: list[TritonCheck] = []
    for item in items:
        for marker in item.iter_markers("triton_check"):
            check = marker.args[0]
            if check not in checks and _runnable(check.interpreter_only):
                checks.append(check)
    return checks


def start_in_background(checks: list[TritonCheck]) -> threading.Thread:
    """Run ``checks`` one after another at the lowest priority, in a daemon thread (a check its test has already
    started is waited for, not run twice)."""

    def run() -> None:
        for check in checks:
            check.start(background=True).wait()

    thread = threading.Thread(target=run, name="triton-checks", daemon=True)
    thread.start()
    return thread

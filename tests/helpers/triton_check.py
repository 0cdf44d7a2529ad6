"""Triton kernel checks run in a fresh interpreter: a script that prints "ok" when its checks pass. On the GPU its
kernels compile; without one they run in Triton's interpreter (``TRITON_INTERPRET=1``, read when Triton is imported,
hence the subprocess), which takes seconds to tens of seconds of one core per check.

A test marked ``@pytest.mark.background(CHECK)`` has the check started in the background when the session's
collection finishes (tests/helpers/background.py); :meth:`TritonCheck.assert_ok` waits for it (or starts it now) and
asserts its exit status and "ok"."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from tests.helpers.background import BackgroundProcess
from tests.helpers.paths import REPO


class TritonCheck:
    """``code`` run by ``python -c code`` with the repository and its tests folder on the path and torch on one
    thread; ``timeout_s`` counts from when its test begins waiting. ``interpreter_only``: the test skips with CUDA
    (where another test runs the compiled kernel), so the check is not started in the background there."""

    def __init__(self, code: str, *, timeout_s: float = 600, interpreter_only: bool = False) -> None:
        self.code, self.timeout_s, self.interpreter_only = code, timeout_s, interpreter_only
        # the tests folder too, as pytest puts it on the path: a check may import a test module
        paths = (str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", ""))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "OMP_NUM_THREADS": "1"}
        if not torch.cuda.is_available():
            env["TRITON_INTERPRET"] = "1"
        self.process = BackgroundProcess([sys.executable, "-c", code], env=env, cwd=REPO)

    def start_in_background(self, config) -> BackgroundProcess | None:
        """The check's process, unless it cannot run here (no Triton, or CUDA for an ``interpreter_only`` check)."""
        if importlib.util.find_spec("triton") is None or (self.interpreter_only and torch.cuda.is_available()):
            return None
        return self.process

    def assert_ok(self) -> None:
        """Skips without Triton (or, for an ``interpreter_only`` check, with CUDA); else asserts that the check
        exited 0 and printed "ok" (its stderr's end as the message)."""
        pytest.importorskip("triton", reason="Triton is not installed (CUDA builds of torch include it)")
        if self.interpreter_only and torch.cuda.is_available():
            pytest.skip("with CUDA the compiled kernels are tested instead")
        try:
            done = self.process.wait(self.timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the Triton check took more than {self.timeout_s:g} s")
        assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]

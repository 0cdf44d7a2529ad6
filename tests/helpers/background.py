"""Slow, self-contained preparations that tests wait for, started in the background when the session's collection
finishes: a framework's venv or npm install, a Triton check in the interpreter, a command's help.

A test marked ``@pytest.mark.background(TASK)`` (``TASK`` has ``start_in_background(config)``, which returns the
:class:`BackgroundProcess` to run or None, as a :class:`BackgroundProcess` itself does) has ``TASK`` started by
:func:`start_marked` (from tests/conftest.py) before any test runs: one task's process after another, in a daemon
thread, each (with its children) at the lowest CPU priority, so that it runs on a core the tests leave idle and
yields the CPU to them otherwise. The test then waits for its task's process (:meth:`BackgroundProcess.wait`, which
starts it if it has not started yet, or gives it normal priority back) and checks its result itself. Processes
still running when the session ends are killed (:func:`stop_all`)."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

LOWEST_PRIORITY = 19
"""The niceness of a process started in the background (the highest value, the smallest share of a busy CPU)."""


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str


class BackgroundProcess:
    """``argv`` run once (in ``cwd`` with ``env``), its output kept in temporary files."""

    def __init__(self, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.argv, self.env, self.cwd = argv, env, cwd
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._lowered = False
        self._out = self._err = None

    def start_in_background(self, config) -> BackgroundProcess:
        """Itself: a process is a task of its own."""
        return self

    def start(self, *, background: bool) -> subprocess.Popen:
        """The process, started now unless it already was (at the lowest priority when ``background``)."""
        with self._lock:
            if self._process is None:
                self._out, self._err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
                self._process = subprocess.Popen(
                    self.argv,
                    cwd=self.cwd,
                    env=self.env,
                    stdout=self._out,
                    stderr=self._err,
                    text=True,
                    start_new_session=True,  # a process group of its own: its children share its priority and end
                )
                if background:
                    os.setpriority(os.PRIO_PGRP, self._process.pid, LOWEST_PRIORITY)
                    self._lowered = True
            return self._process

    def wait(self, timeout_s: float) -> Finished:
        """Its result, waiting at most ``timeout_s`` from now (started now if it has not been); on timeout the
        process is killed and ``subprocess.TimeoutExpired`` raised."""
        process = self.start(background=False)
        self._restore_priority()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        self._out.seek(0)
        self._err.seek(0)
        return Finished(process.returncode, self._out.read(), self._err.read())

    def _restore_priority(self) -> None:
        """A test waits for it now: back to normal priority, where allowed (raising a priority needs privileges;
        without them it keeps the lowest, and still gets whatever CPU the waiting test leaves)."""
        with self._lock:
            if self._lowered and self._process.poll() is None:
                self._lowered = False
                try:
                    os.setpriority(os.PRIO_PGRP, self._process.pid, 0)
                except PermissionError:
                    pass  # documented above: an unprivileged user cannot raise a priority again

    def stop(self) -> None:
        """Kill the process and its children if it still runs."""
        with self._lock:
            if self._process is not None and self._process.poll() is None:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()


_started: list[BackgroundProcess] = []


def start_marked(config, items) -> None:
    """Start the tasks of the ``background`` markers of ``items`` (each once, in the items' order) in a daemon
    thread, one process after another."""
    tasks: list = []
    for item in items:
        for marker in item.iter_markers("background"):
            if marker.args[0] not in tasks:
                tasks.append(marker.args[0])

    def run() -> None:
        for task in tasks:
            process = task.start_in_background(config)
            if process is not None:
                _started.append(process)
                process.start(background=True).wait()

    threading.Thread(target=run, name="background-tasks", daemon=True).start()


def stop_all() -> None:
    for process in _started:
        process.stop()

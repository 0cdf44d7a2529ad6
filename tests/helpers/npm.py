"""npm packages for the tests that drive a JavaScript client in Node: installed once into a folder of pytest's cache
(kept between runs when the cache is on), never into the repository or a global location.

A test marked ``@pytest.mark.background(PACKAGES)`` has the install started in the background when collection
finishes (tests/helpers/background.py); :meth:`NpmPackages.folder` waits for it (or installs now)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from tests.helpers.background import BackgroundProcess

INSTALL_TIMEOUT_S = 240
"""How long one ``npm install`` may take (counted from when its test begins waiting) before the test skips."""


class NpmPackages:
    """A folder named ``name`` in pytest's cache (a temporary one, removed when the session ends, when the cache is
    off) with ``packages`` (npm specs) installed by ``npm install``, unless ``node_modules/<marker>/package.json`` is
    already there."""

    def __init__(self, name: str, packages: tuple[str, ...], marker: str) -> None:
        self.name, self.packages, self.marker = name, packages, marker
        self._lock = threading.Lock()
        self._prepared = False
        self._folder: Path | None = None
        self._install: BackgroundProcess | None = None

    def start_in_background(self, config) -> BackgroundProcess | None:
        """The install to run (None when the packages are there already, or node or npm is missing)."""
        return self._prepare(config)

    def folder(self, config) -> Path:
        """The folder, once the packages are installed. Skips the test, saying why, when node or npm is missing or
        npm cannot install (offline) or takes longer than :data:`INSTALL_TIMEOUT_S`."""
        if shutil.which("node") is None or shutil.which("npm") is None:
            pytest.skip(f"node and npm are needed to run {' '.join(self.packages)}")
        install = self._prepare(config)
        if install is not None:
            try:
                done = install.wait(INSTALL_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pytest.skip(f"npm took more than {INSTALL_TIMEOUT_S} s to install {' '.join(self.packages)}")
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                pytest.skip(f"npm could not install {' '.join(self.packages)} (offline?): {last}")
        return self._folder

    def _prepare(self, config) -> BackgroundProcess | None:
        with self._lock:
            if not self._prepared:
                self._prepared = True
                cache = getattr(config, "cache", None)
                if cache is not None:
                    self._folder = cache.mkdir(self.name)
                else:
                    self._folder = folder = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
                    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
                installed = (self._folder / "node_modules" / self.marker / "package.json").is_file()
                if not installed and shutil.which("node") is not None and shutil.which("npm") is not None:
                    argv = ["npm", "install", "--no-audit", "--no-fund", "--no-save", "--prefix", str(self._folder)]
                    self._install = BackgroundProcess([*argv, *self.packages])
            return self._install


def installed_version(folder: Path, package: str) -> str:
    """The version of ``package`` installed in ``folder``."""
    return json.loads((folder / "node_modules" / package / "package.json").read_text())["version"]

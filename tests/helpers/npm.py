"""npm packages for the tests that drive a JavaScript client in Node: installed once into a folder of pytest's cache
(kept between runs when the cache is on), never into the repository or a global location."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

INSTALL_TIMEOUT_S = 240
"""How long one ``npm install`` may take before the test skips."""


def npm_folder(request, tmp_path_factory, name: str, packages: tuple[str, ...], marker: str) -> Path:
    """A folder named ``name`` in pytest's cache (a temporary one when the cache is off) with ``packages`` (npm
    specs) installed by ``npm install``, unless ``node_modules/<marker>/package.json`` is already there. Skips the
    test, saying why, when node or npm is missing or npm cannot install (offline); prints the install's time."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip(f"node and npm are needed to run {' '.join(packages)}")
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir(name) if cache is not None else tmp_path_factory.mktemp(name)
    if not (folder / "node_modules" / marker / "package.json").is_file():
        start = time.monotonic()
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--no-save", "--prefix", str(folder), *packages],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            pytest.skip(f"npm could not install {' '.join(packages)} (offline?): {last}")
        print(f"npm installed {' '.join(packages)} in {time.monotonic() - start:.1f} s")
    return folder


def installed_version(folder: Path, package: str) -> str:
    """The version of ``package`` installed in ``folder``."""
    return json.loads((folder / "node_modules" / package / "package.json").read_text())["version"]

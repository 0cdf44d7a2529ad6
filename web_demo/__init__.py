"""The browser voice chat page (static files, no build step), served by the server at ``/``.

A package only so that installs ship the assets (``pyproject.toml`` package data); nothing to import
but :data:`WEB_DEMO_DIR`.
"""

from pathlib import Path

WEB_DEMO_DIR = Path(__file__).resolve().parent
"""The folder holding ``index.html`` and its scripts."""

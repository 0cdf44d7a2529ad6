"""Where the tests find the repository and their fixtures, wherever a test file sits under ``tests/``."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository root."""
TESTS = REPO / "tests"
"""The tests folder: ``fixtures/`` (speech, ...) and ``artifacts/`` (what browser tests leave for a person to see)."""

"""Value types of command-line flags that more than one command shares (``serve`` and ``bench``)."""

from __future__ import annotations

import argparse


def ms_or_off(text: str) -> int | None:
    """An ``MS|off`` flag's value: milliseconds, or None for ``off``."""
    if text.strip().lower() == "off":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected milliseconds or 'off', got {text!r}") from None

"""What the commands' parsers share (``serve``, ``demo`` and ``bench``): flag value types and the help layout."""

from __future__ import annotations

import argparse

from realtime.voices import parse_voice_alias


def ms_or_off(text: str) -> int | None:
    """An ``MS|off`` flag's value: milliseconds, or None for ``off``."""
    if text.strip().lower() == "off":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected milliseconds or 'off', got {text!r}") from None


def positive_int(text: str) -> int:
    """A flag's whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def count(text: str) -> int:
    """A whole number >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    """A flag's number above 0 (finite)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {text}")
    return value


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help layout with ``(default: X)`` after the help of every option whose default is a value and
    whose help does not state its default itself. Options without a value default (None, a flag's False, an
    empty list) say in their help what happens without them, in the same ``(default: ...)`` form."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        no_value = default is None or default is False or default is argparse.SUPPRESS or default == []
        if not action.option_strings or no_value or "(default" in text:
            return text
        return f"{text} (default: %(default)s)"


def voice_alias(text: str) -> tuple[str, str]:
    """A ``--voice-alias NAME=SPEAKER`` flag's value."""
    try:
        return parse_voice_alias(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None

"""Silence one transformers warning that every Qwen3-Omni config triggers by design.

The released config's talker (and our random ones, which copy its layout) describe their rotary embedding with
``mrope_section`` and ``interleaved`` beside ``rope_type: default``; transformers' rope validation does not list those
two keys for the default type and logs "Unrecognized keys in `rope_parameters`" once per sub-config load, although
the modeling code reads both. Those lines are noise to an operator; the decoder reads the layout from the rotary module
itself (:func:`pipeline.runners.decoder.rope_axes`).

:func:`quiet_rope_key_warnings` installs a filter that drops exactly those lines — unrecognized keys that are only
``mrope_section`` and ``interleaved`` — on transformers' rope logger. It is idempotent.
"""

from __future__ import annotations

import logging
import re

_ROPE_LOGGER = "transformers.modeling_rope_utils"
_MESSAGE = re.compile(r"^Unrecognized keys in `rope_parameters` for 'rope_type'='default': \{(?P<keys>[^}]*)\}$")
EXPECTED_KEYS = frozenset({"mrope_section", "interleaved"})


class _RopeKeyFilter(logging.Filter):
    """Drops the warning when every key it names is one of :data:`EXPECTED_KEYS`."""

    def filter(self, record: logging.LogRecord) -> bool:
        match = _MESSAGE.match(record.getMessage())
        if match is None:
            return True
        keys = {key.strip().strip("'\"") for key in match["keys"].split(",")}
        return not keys <= EXPECTED_KEYS


def quiet_rope_key_warnings() -> None:
    """Install the filter on transformers' rope logger (once per process)."""
    logger = logging.getLogger(_ROPE_LOGGER)
    if not any(isinstance(f, _RopeKeyFilter) for f in logger.filters):
        logger.addFilter(_RopeKeyFilter())

"""Silence one transformers config warning that every Qwen2.5-Omni checkpoint triggers by design.

transformers checks each ``*_token_id`` of a config against that config's own vocabulary. The
talker's config carries ids of the *thinker's* vocabulary (the ``tts_text_*`` embeddings it is fed,
the audio and vision markers of the prompt it mirrors), while its own vocabulary is the codec's, so
every load of a released or made checkpoint logs one "must be `None` or an integer within the
vocabulary" line per such id. Those lines are noise to an operator; the ids are checked where they
matter (:func:`~.checkpoint.validate_config` checks them against the thinker's vocabulary).

:func:`quiet_talker_token_id_warnings` installs a filter that drops exactly those lines — the named
talker ids, nothing else — on transformers' config logger. It is idempotent.
"""

from __future__ import annotations

import logging
import re

#: The talker config's fields that hold thinker-vocabulary ids.
THINKER_IDS_IN_TALKER_CONFIG = (
    "tts_text_start_token_id",
    "tts_text_end_token_id",
    "tts_text_pad_token_id",
    "audio_start_token_id",
    "audio_end_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
)

_CONFIG_LOGGER = "transformers.configuration_utils"
_MESSAGE = re.compile(
    r"^Model config: (?P<name>\w+) must be `None` or an integer within the vocabulary \(between 0 and \d+\)"
)


class _TalkerIdFilter(logging.Filter):
    """Drops the vocabulary warning for the fields of :data:`THINKER_IDS_IN_TALKER_CONFIG`."""

    def filter(self, record: logging.LogRecord) -> bool:
        match = _MESSAGE.match(record.getMessage())
        return match is None or match["name"] not in THINKER_IDS_IN_TALKER_CONFIG


def quiet_talker_token_id_warnings() -> None:
    """Install the filter on transformers' config logger (once per process)."""
    logger = logging.getLogger(_CONFIG_LOGGER)
    if not any(isinstance(f, _TalkerIdFilter) for f in logger.filters):
        logger.addFilter(_TalkerIdFilter())

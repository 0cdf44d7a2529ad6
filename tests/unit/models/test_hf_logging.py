"""The one transformers config warning we silence, and only that one."""

from __future__ import annotations

import logging

import pytest

from pipeline.models.qwen2_5_omni.hf_logging import THINKER_IDS_IN_TALKER_CONFIG, quiet_talker_token_id_warnings


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def config_log():
    logger = logging.getLogger("transformers.configuration_utils")
    handler = _Collect()
    logger.addHandler(handler)
    yield logger, handler.messages
    logger.removeHandler(handler)


def _vocab_warning(name: str, value: int) -> str:
    return (
        f"Model config: {name} must be `None` or an integer within the vocabulary (between 0 and 127), got {value}. "
        "This may result in unexpected behavior."
    )


def test_only_the_talkers_thinker_ids_are_silenced(config_log) -> None:
    logger, messages = config_log
    quiet_talker_token_id_warnings()
    quiet_talker_token_id_warnings()  # idempotent
    assert sum(type(f).__name__ == "_TalkerIdFilter" for f in logger.filters) == 1
    for name in THINKER_IDS_IN_TALKER_CONFIG:
        logger.warning(_vocab_warning(name, 1001))
    assert messages == []
    logger.warning(_vocab_warning("pad_token_id", -1))  # a real problem of a config still shows
    logger.warning("something else")
    assert messages == [_vocab_warning("pad_token_id", -1), "something else"]


def test_loading_the_tiny_config_logs_no_vocabulary_warning(tiny_model_dir, config_log) -> None:
    from transformers import Qwen2_5OmniConfig
    from transformers.utils import logging as hf_logging

    from pipeline.models.qwen2_5_omni import checkpoint as ckpt

    _, messages = config_log
    hf_logging.warning_once.cache_clear()  # transformers logs each message once per process
    ckpt.load_checkpoint(tiny_model_dir)
    assert not [m for m in messages if "within the vocabulary" in m]
    # Without the filter the same load does warn (so the check above can fail).
    logger = logging.getLogger("transformers.configuration_utils")
    filters = list(logger.filters)
    for f in filters:
        logger.removeFilter(f)
    try:
        hf_logging.warning_once.cache_clear()
        Qwen2_5OmniConfig.from_pretrained(tiny_model_dir)
    finally:
        for f in filters:
            logger.addFilter(f)
    assert [m for m in messages if "within the vocabulary" in m]

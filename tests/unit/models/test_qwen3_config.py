"""Qwen3-Omni's stage config and load-time logging: its token2wav keys parsed by the family, reading it imports no
model code, and the one transformers warning every Qwen3-Omni config triggers is silenced (and nothing else)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from pipeline.config import PACKAGED_STAGE_CONFIGS, load_stage_config
from pipeline.errors import ConfigError
from pipeline.models.qwen3_omni.code2wav_chunking import Code2WavChunking
from pipeline.models.qwen3_omni.hf_logging import quiet_rope_key_warnings
from tests.helpers.paths import REPO

QWEN3 = PACKAGED_STAGE_CONFIGS["qwen3_omni"]


def test_the_packaged_config_holds_the_code2wav_chunking():
    cfg = load_stage_config(QWEN3)
    assert cfg.model_family == "qwen3_omni"
    assert cfg.token2wav.settings == Code2WavChunking(first_chunk_frames=2, chunk_frames=4)


@pytest.mark.parametrize(
    ("chunking", "param"),
    [
        ({"first_chunk_frames": 0}, "stages.token2wav.chunking.first_chunk_frames"),
        ({"chunk_frames": "four"}, "stages.token2wav.chunking.chunk_frames"),
        ({"look_ahead": 1}, "stages.token2wav.chunking.look_ahead"),
    ],
)
def test_a_bad_chunking_value_is_refused_naming_it(chunking, param):
    with pytest.raises(ConfigError) as caught:
        load_stage_config(QWEN3, overrides={"stages": {"token2wav": {"chunking": chunking}}})
    assert caught.value.param == param


@pytest.mark.slow
def test_reading_the_config_imports_no_model_code():
    code = (
        "import sys; from pipeline.config import load_stage_config; "
        f"load_stage_config({str(QWEN3)!r}); "
        "print(sorted(m for m in sys.modules if 'modeling_qwen3_omni' in m or m.endswith('code2wav_stream')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_only_the_expected_rope_key_warning_is_silenced():
    quiet_rope_key_warnings()
    quiet_rope_key_warnings()  # idempotent: one filter
    logger = logging.getLogger("transformers.modeling_rope_utils")
    assert sum(type(f).__name__ == "_RopeKeyFilter" for f in logger.filters) == 1
    prefix = "Unrecognized keys in `rope_parameters` for 'rope_type'="
    kept = [prefix + "'default': {'mrope_section', 'factor'}", prefix + "'yarn': {'interleaved'}"]
    records = _Records()
    logger.addHandler(records)  # transformers' loggers do not propagate to the root logger that caplog reads
    try:
        for message in (
            prefix + "'default': {'interleaved', 'mrope_section'}",
            prefix + "'default': {'mrope_section'}",
        ):
            logger.warning(message)
        for message in kept:
            logger.warning(message)
    finally:
        logger.removeHandler(records)
    assert records.messages == kept

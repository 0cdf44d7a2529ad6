"""The bench's reference on Qwen3-Omni: transformers' ``Qwen3OmniMoeForConditionalGeneration.generate`` answers a spoken
turn on the tiny checkpoint with the forced text and frame counts, timed from request to its only audio; served
through the one-worker queue at one user it becomes the report's "transformers reference" row; a checkpoint without
a talker, or a family without a reference, is refused."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.hosting.loaders import PretrainedCheckpoint
from pipeline.models import family_of
from realtime.bench.client import UserPlan
from realtime.bench.models import BenchConfigError, ReplyLength, ReplyRequest, bench_stage_config, reply_length
from realtime.bench.reference import serve_one_worker
from realtime.bench.reference_generate import Qwen3OmniReference, reference_generator
from realtime.bench.report import REFERENCE_ROW, RunInfo, markdown
from realtime.bench.speech import load_speech_folder
from realtime.bench.sweep import LevelResult
from tests.helpers.paths import TESTS

SAMPLES_PER_FRAME = 1920
"""code2wav's 24 kHz samples per frame (12.5 frames a second)."""


def load(model_dir, length: ReplyLength):
    cfg = bench_stage_config(None, device="cpu", length=length, family="qwen3_omni")
    return PretrainedCheckpoint(str(model_dir)).load(cfg), reply_length(cfg)


@pytest.fixture(scope="module")
def speech():
    return load_speech_folder(TESTS / "fixtures" / "speech", max_seconds=3.0)[0]


def test_the_qwen3_reference_makes_the_forced_text_and_frames_and_its_audio(qwen3_model_dir, speech):
    # one second of audio at Qwen3-Omni's 12.5 frames a second: 12 frames, with 4 text tokens
    ckpt, length = load(qwen3_model_dir, ReplyRequest(1.0, text_tokens=4).resolve(12.5))
    assert length == ReplyLength(4, 12, 12.5)
    reference = reference_generator(ckpt, length, family_of("qwen3_omni"))
    assert isinstance(reference, Qwen3OmniReference)
    served = reference(speech)
    assert (served.thinker_tokens, served.talker_tokens) == (4, 12)
    # code2wav's causal convolutions drop a few trailing samples of the one-shot decode
    assert 11 * SAMPLES_PER_FRAME / 24_000 < served.audio_s <= 12 * SAMPLES_PER_FRAME / 24_000
    assert served.seconds > 0
    again = reference(speech)  # the counting wrapper counts per call
    assert (again.thinker_tokens, again.talker_tokens) == (4, 12)

    # at one user the queue never waits: its time to first audio is the run, request -> its only audio
    (turn,) = serve_one_worker([UserPlan(0, (speech,))], reference, silence_window_s=0.5)
    metrics = turn.metrics()
    assert turn.start_s == turn.arrival_s and metrics.ttfa_ms == pytest.approx(1000.0 * turn.service_s)
    assert metrics.audio_ms == pytest.approx(1000.0 * served.audio_s)

    level = LevelResult(1, 1, 1.0, [], reference=[turn])
    info = RunInfo("bench", "today", "tiny", "CPU", "ws", "in process", 4, 12, "fixtures", 1, 1, "w", None)
    row = next(line for line in markdown(info, [level]).splitlines() if line.startswith(f"| {REFERENCE_ROW} |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == "1" and cells[2].split(" / ")[0] == f"{metrics.ttfa_ms:.0f}"
    assert cells[5] == f"{served.audio_s:.1f}"


def test_a_reference_needs_a_talker_and_a_family_it_knows(qwen3_text_model_dir):
    ckpt, length = load(qwen3_text_model_dir, ReplyLength(4, 12, 12.5))
    with pytest.raises(BenchConfigError, match="no talker"):
        reference_generator(ckpt, length, family_of("qwen3_omni"))
    with pytest.raises(BenchConfigError, match="no transformers reference for the Toy family"):
        reference_generator(ckpt, length, _Named("toy", "Toy"))


@dataclasses.dataclass(frozen=True)
class _Named:
    """A family as far as the factory reads one: its name and display name."""

    name: str
    display_name: str

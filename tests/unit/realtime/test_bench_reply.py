"""The bench's forced reply length in seconds of audio (``--reply-s``), whatever the family's codec rate: the codes and
text tokens it becomes per family, the explicit overrides and their conflicts, the stage configs that force the same
for a ``--url`` server, and the report's header stating the length in seconds and codes (or as asked, for a server of
unknown family); ``--preemptive-response-ms off`` accepted and stated; ``--reference LEVELS``."""

from __future__ import annotations

import pytest

from pipeline.config import load_stage_config
from realtime.bench.cli import _run_info, _served_by, _stage_config, build_parser, resolve_options
from realtime.bench.models import (
    FORCED_STAGE_CONFIGS,
    ReplyLength,
    ReplyRequest,
    Workload,
    default_reply_length,
    reply_length,
    served_family,
)


def options(*argv: str):
    return resolve_options(build_parser().parse_args(list(argv)))


QWEN3 = ("--model", "random:qwen3-omni-30b-a3b")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ((), ReplyLength(30, 400, 50.0)),  # the default: 8 s of Qwen2.5-Omni codes, 30 text tokens
        (QWEN3, ReplyLength(30, 100, 12.5)),  # 8 s of Qwen3-Omni frames, the same 30 text tokens
        (("--reply-s", "4"), ReplyLength(15, 200, 50.0)),  # text in proportion: 30 per 8 s
        ((*QWEN3, "--reply-s", "4"), ReplyLength(15, 50, 12.5)),
        ((*QWEN3, "--reply-s", "0.1"), ReplyLength(1, 1, 12.5)),  # at least one of each
        (("--reply-s", "2", "--text-tokens", "9"), ReplyLength(9, 100, 50.0)),  # --text-tokens wins over proportion
        (("--codec-tokens", "250"), ReplyLength(19, 250, 50.0)),  # codes given: text for their 5 s
        (("--codec-tokens", "250", "--text-tokens", "30"), ReplyLength(30, 250, 50.0)),
        ((*QWEN3, "--codec-tokens", "50"), ReplyLength(15, 50, 12.5)),  # frames are Qwen3-Omni's codes
        (("--quick",), ReplyLength(4, 40, 50.0)),  # --quick: 0.8 s, 4 text tokens
        ((*QWEN3, "--quick"), ReplyLength(4, 10, 12.5)),
        (("--quick", "--reply-s", "2"), ReplyLength(4, 100, 50.0)),
    ],
)
def test_reply_seconds_become_the_familys_codes(argv, expected):
    resolved = options(*argv)
    assert reply_length(_stage_config(resolved)) == expected


def test_the_bench_stage_configs_force_the_default_seconds_in_each_familys_codes():
    """A ``--url`` server started with a bench stage config makes the replies the default ``--reply-s`` asks for."""
    for family, path in FORCED_STAGE_CONFIGS.items():
        forced = reply_length(load_stage_config(path))
        assert forced == default_reply_length(family) and forced.audio_s == 8.0, family
    assert default_reply_length("qwen2_5_omni") == ReplyLength(30, 400, 50.0)
    assert default_reply_length("qwen3_omni") == ReplyLength(30, 100, 12.5)


def test_reply_length_conflicts_and_bad_values_are_refused():
    with pytest.raises(ValueError, match="--reply-s and --codec-tokens both"):
        options("--reply-s", "8", "--codec-tokens", "400")
    for bad, message in (
        (("--reply-s", "0"), "--reply-s must be > 0"),
        (("--reply-s", "-1"), "--reply-s must be > 0"),
        (("--codec-tokens", "0"), "--codec-tokens must be >= 1"),
        (("--text-tokens", "0"), "--text-tokens must be >= 1"),
    ):
        with pytest.raises(ValueError, match=message):
            options(*bad)
    with pytest.raises(ValueError, match="either seconds"):
        ReplyRequest(None)
    # the command line refuses them with exit status 2, before loading anything
    from realtime.cli.main import main

    assert main(["bench", "--reply-s", "8", "--codec-tokens", "400"]) == 2


def test_the_header_states_the_length_in_seconds_and_in_the_familys_codes():
    qwen3 = options(*QWEN3)
    length = reply_length(_stage_config(qwen3))
    info = _run_info(qwen3, "bench", length, None, "qwen3_omni")
    assert info.workload == (
        "3 turns per user, replies forced to 8.0 s of audio (100 codec tokens at 12.5 a second) and 30 text tokens"
    )
    assert (info.reply_s, info.codec_tokens, info.codes_per_second, info.text_tokens) == (8.0, 100, 12.5, 30)
    assert info.lighter_workload is None  # the default workload of its family
    short = options(*QWEN3, "--reply-s", "4")
    info = _run_info(short, "bench", reply_length(_stage_config(short)), None, "qwen3_omni")
    assert info.lighter_workload == "replies of 15 text + 50 codec tokens (4.0 s) instead of 30 + 100 (8.0 s)"


def test_a_url_server_of_unknown_family_gets_the_length_as_asked():
    url = options("--url", "ws://127.0.0.1:1")
    info = _run_info(url, "bench", None, None, None, "random:qwen3-omni:seed0")
    assert info.workload == (
        "3 turns per user, replies forced to 8.0 s of audio and text in proportion, as asked (the server's model "
        "family, so its codec rate, is unknown to the bench)"
    )
    assert (info.reply_s, info.codec_tokens, info.codes_per_second) == (8.0, None, None)
    assert info.model == "the server at ws://127.0.0.1:1, serving random:qwen3-omni:seed0"
    assert info.lighter_workload is None
    codes = options("--url", "ws://127.0.0.1:1", "--codec-tokens", "100", "--text-tokens", "30")
    info = _run_info(codes, "bench", None, None, None)
    assert "replies forced to 100 codec tokens and 30 text tokens, as asked" in info.workload
    assert (info.reply_s, info.codec_tokens) == (None, 100)
    shorter = Workload(ReplyRequest(2.0), 3).lighter_than(Workload(default_reply_length(), 3))
    assert shorter == "replies of 2.0 s of audio and text in proportion instead of 8.0 s and 30 text tokens"


def test_a_served_model_names_its_family_when_this_machine_can_read_it(qwen3_model_dir):
    assert served_family(str(qwen3_model_dir)) == "qwen3_omni"
    for unreadable in ("random:qwen3-omni:seed0", "fake-omni", "/nowhere/model"):
        assert served_family(unreadable) is None


def test_preemptive_replies_off_are_accepted_and_stated():
    off = options("--preemptive-response-ms", "off")
    assert off.preemptive_response_ms is None
    assert "replies start at speech_stopped" in _served_by(off, "users")
    on = options()
    assert "replies start on a 200 ms pause, shown at speech_stopped" in _served_by(on, "users")
    # a --url server keeps its own setting: asking for another is refused, and the report says whose it is
    with pytest.raises(ValueError, match="start the --url server with serve --preemptive-response-ms"):
        options("--url", "ws://127.0.0.1:1", "--preemptive-response-ms", "off")
    assert (
        _served_by(options("--url", "ws://h:1"), "users") == "ws://h:1 (preemptive replies as that server was started)"
    )


def test_reference_levels():
    assert (options().reference, options().reference_levels) == (False, None)
    every = options("--reference", "--concurrency", "1,4")
    assert (every.reference, every.reference_levels) == (True, None)
    alone = options("--reference", "1", "--concurrency", "1,4")
    assert (alone.reference, alone.reference_levels) == (True, frozenset({1}))
    with pytest.raises(ValueError, match="levels 2 are not among the measured levels"):
        options("--reference", "1,2", "--concurrency", "1,4")
    with pytest.raises(ValueError, match="--reference must be comma-separated integers"):
        options("--reference", "one")

"""scripts/first_chunk_wait.py: a bench log's first-chunk milestones split into codes, worker wait and job, per
level."""

from __future__ import annotations

import pytest

from conftest import load_script

LOG = """\
2026-11-22 21:16:18,768 INFO pipeline.core.engine_core: response resp_1 incomplete after 594 ms: 10 text + 50 codec \
tokens, \
24000 samples; milestones (ms) {'prefill_done_ms': 3.3, 'talker_first_code_ms': 900.0, 'talker_first_chunk_ms': \
950.0, 'token2wav_first_job_ms': 960.0, 'token2wav_first_chunk_ms': 1000.0}
2026-11-22 21:16:19,508 INFO realtime.bench.sweep: bench level 2: 2 users start
x INFO pipeline.core.engine_core: response resp_2 completed after 300 ms: milestones (ms) {'prefill_done_ms': 3.0, \
'talker_first_code_ms': 20.0, 'talker_first_chunk_ms': 110.0, 'token2wav_first_job_ms': 110.0, \
'token2wav_first_chunk_ms': 150.0}
x INFO pipeline.core.engine_core: response resp_3 completed after 400 ms: milestones (ms) {'prefill_done_ms': 3.0, \
'talker_first_code_ms': 30.0, 'talker_first_chunk_ms': 130.0, 'token2wav_first_job_ms': 190.0, \
'token2wav_first_made_ms': 230.0, 'token2wav_first_chunk_ms': 250.0}
x INFO pipeline.core.engine_core: response resp_4 completed after 50 ms: 9 text + 0 codec tokens, 0 samples; \
milestones (ms) \
{'prefill_done_ms': 3.0}
"""


@pytest.fixture(scope="module")
def first_chunk_wait():
    return load_script("first_chunk_wait")


def test_levels_split_each_spoken_reply_and_leave_out_the_warm_up_and_text_replies(first_chunk_wait, tmp_path):
    levels = first_chunk_wait.parse(LOG.splitlines())
    assert list(levels) == ["2 users"] and len(levels["2 users"]) == 2
    assert first_chunk_wait.split(levels["2 users"][1]) == {
        "first code": 30.0,
        "codes": 100.0,
        "wait": 60.0,
        "job": 40.0,
        "held": 20.0,
        "out": 250.0,
    }
    assert first_chunk_wait.split(levels["2 users"][0])["held"] == 0.0, "a log line without the made milestone"
    table = first_chunk_wait.table(levels)
    assert "| 2 users | 2 | 25 / 30 | 95 / 100 | 30 / 57 | 40 / 40 | 10 / 19 | 200 / 245 |" in table
    log = tmp_path / "bench.log"
    log.write_text(LOG)
    assert first_chunk_wait.main([str(log)]) == 0
    log.write_text("nothing here\n")
    assert first_chunk_wait.main([str(log)]) == 1

"""StallWatch (pure logic) and the engine's stall report."""

import asyncio
import logging

from pipeline.core.commands import (
    AddTextCommand,
    CloseConversationCommand,
    OpenConversationCommand,
    StartResponseCommand,
)
from pipeline.core.response_state import ResponseSpec
from pipeline.observe.stall_watch import StallWatch


def test_reports_only_after_marks_stay_unchanged_while_live():
    watch = StallWatch(after_s=10)
    assert watch.check((0, 0), live=True, now=0.0) is None
    assert watch.check((0, 0), live=True, now=9.9) is None
    assert watch.check((0, 0), live=True, now=10.5) == 10.5
    # then again only every after_s
    assert watch.check((0, 0), live=True, now=15.0) is None
    assert watch.check((0, 0), live=True, now=20.6) == 20.6


def test_progress_or_no_responses_resets_the_clock():
    watch = StallWatch(after_s=10)
    watch.check((0,), live=True, now=0.0)
    assert watch.check((1,), live=True, now=9.0) is None  # progress at 9 s
    assert watch.check((1,), live=True, now=18.0) is None
    assert watch.check((1,), live=True, now=19.5) == 10.5
    assert watch.check((1,), live=False, now=40.0) is None  # idle engine: nothing to report
    assert watch.check((1,), live=True, now=41.0) is None
    assert watch.check((1,), live=True, now=51.5) == 10.5


async def test_the_engine_logs_where_a_stalled_response_waits(tiny_engine, caplog):
    """A response whose consumer accepts no events makes no progress: after the watch's delay the engine
    logs a report naming the response, its stage positions and the KV pools."""

    def stall_one_response(core):
        saved = core.observer.stall_watch
        core.observer.stall_watch = StallWatch(after_s=0.0)
        try:
            core.handle(OpenConversationCommand("stall_conv", ""))
            core.handle(AddTextCommand("stall_conv", "u1", "user", "Hello?"))
            spec = ResponseSpec(
                id="stall_resp",
                conv_id="stall_conv",
                item_id="a1",
                audio=True,
                voice="Chelsie",
                max_text_tokens=4,
                sink=lambda event: None,
                can_accept=lambda: False,
            )
            core.handle(StartResponseCommand(spec))
            core.step()
            core.step()
            assert core.response("stall_resp") is not None  # paused, never advanced
            return core.describe()
        finally:
            core.handle(CloseConversationCommand("stall_conv"))
            core.observer.stall_watch = saved

    with caplog.at_level(logging.WARNING, logger="pipeline.core.engine_core"):
        lines = await asyncio.wrap_future(tiny_engine._thread.submit(stall_one_response))
    reports = [r.getMessage() for r in caplog.records if "engine stalled" in r.getMessage()]
    assert reports, caplog.text
    assert "stall_resp" in reports[-1]
    (line,) = [line for line in lines if "stall_resp" in line]
    assert "accepts=False" in line and "status=PREFILLING" in line and "talker=WAITING" in line
    assert any(line.strip().startswith("talker KV slots:") for line in lines)


def test_a_step_over_the_configured_threshold_is_logged(caplog):
    import logging
    import time

    from pipeline.observe.observer import EngineObserver

    def step(observer, ms):
        observer.step_done(
            time.perf_counter() - ms / 1000,
            progressed=True,
            live=1,
            describe=list,
            decoding=1,
            prefills=0,
            thinker_rows=1,
            talker_rows=0,
            codes_before=0,
            chains_before=0,
            ready=0,
            background=0,
        )

    with caplog.at_level(logging.WARNING, logger="pipeline.core.engine_core"):
        step(EngineObserver(None, slow_step_ms=1000), 300)
        assert not [r for r in caplog.records if "slow engine step" in r.getMessage()]
        step(EngineObserver(None, slow_step_ms=250), 300)
        assert [r for r in caplog.records if "slow engine step" in r.getMessage()]

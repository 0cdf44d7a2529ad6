"""scripts/stall_check.py: overlapping replies through the engine, and its watchdog."""

from __future__ import annotations

import asyncio

import pytest

from conftest import load_script

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
async def test_overlapping_replies_on_the_tiny_engine_all_complete(tiny_engine):
    result = await load_script("stall_check").run_load(tiny_engine, users=2, replies=2, stall_s=120)
    assert (result.completed, result.failed, result.stalled_after_s) == (4, [], None)
    assert len(result.first_audio_ms) == 4 and all(ms > 0 for ms in result.first_audio_ms)


class NeverAnswers:
    """An engine whose replies never end (one stuck inside a step)."""

    class Conversation:
        async def add_text(self, item_id, text):
            return None

        def respond(self, **kwargs):
            return NeverAnswers.Response()

        async def close(self):
            raise AssertionError("a stalled run must not wait on the engine to close conversations")

    class Response:
        done = None

        def __aiter__(self):
            return self

        async def __anext__(self):
            await asyncio.Event().wait()

    def conversation(self):
        return NeverAnswers.Conversation()


async def test_the_watchdog_ends_a_stalled_run():
    result = await asyncio.wait_for(
        load_script("stall_check").run_load(NeverAnswers(), users=3, replies=2, stall_s=0.3), 10
    )
    assert result.stalled_after_s is not None and result.completed == 0 and result.failed == []

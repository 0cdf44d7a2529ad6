"""scripts/stall_check.py: overlapping replies through the engine, and its watchdog."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import pytest


def stall_check():
    """scripts/stall_check.py (the scripts folder is not a package)."""
    path = Path(__file__).resolve().parent.parent / "scripts" / "stall_check.py"
    spec = importlib.util.spec_from_file_location("stall_check", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["stall_check"] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(300)
async def test_overlapping_replies_on_the_tiny_engine_all_complete(tiny_engine):
    result = await stall_check().run_load(tiny_engine, users=2, replies=2, stall_s=120)
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
    result = await asyncio.wait_for(stall_check().run_load(NeverAnswers(), users=3, replies=2, stall_s=0.3), 10)
    assert result.stalled_after_s is not None and result.completed == 0 and result.failed == []

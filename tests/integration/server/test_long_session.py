"""A realtime session longer than the model's context (a tiny engine of each model family, with a small context): every
turn is answered, and the items the engine dropped stay in the client's view: retrieving, truncating and deleting them
works, no error."""

from __future__ import annotations

import pytest

from conftest import greedy_stage_config
from pipeline.engine import OmniEngine
from tests.helpers.server import assert_clean, connect, served, user_text

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def small_context_engine(family, family_model_dir):
    talker = {"max_tokens": family.talker_tokens(0.6)}  # short spoken replies
    cfg = greedy_stage_config(family=family.family, thinker={"max_context_tokens": 400}, talker=talker)
    engine = OmniEngine.from_pretrained(family_model_dir, cfg, seed=3)
    yield engine
    engine.close()


async def dropped_ids(engine: OmniEngine) -> set[str]:
    return await engine._call(lambda core: {i for c in core.scheduler.conversations.values() for i in c.dropped})


@pytest.mark.timeout(180)
async def test_dropped_items_stay_in_the_clients_view_and_every_turn_is_answered(small_context_engine):
    engine = small_context_engine
    async with served(engine) as (url, app), connect(url) as client:
        await client.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}})
        await client.until("session.updated")
        turns = []
        for i in range(40):
            await client.send(user_text(f"Turn {i}: tell me something about the mountains and the sea, please."))
            user = (await client.until("conversation.item.added"))["item"]["id"]
            await client.send({"type": "response.create", "response": {"max_output_tokens": 4}})
            done = (await client.until("response.done", timeout=60))["response"]
            assert done["status"] in ("completed", "incomplete"), done
            turns.append((user, done["output"][0]["id"]))
            if await dropped_ids(engine):
                break
        dropped = await dropped_ids(engine)
        first_user, first_reply = turns[0]
        assert {first_user, first_reply} <= dropped and len(turns) < 40
        # the client still sees the dropped turn
        await client.send({"type": "conversation.item.retrieve", "item_id": first_user})
        assert (await client.until("conversation.item.retrieved"))["item"]["id"] == first_user
        await client.send(
            {"type": "conversation.item.truncate", "item_id": first_reply, "content_index": 0, "audio_end_ms": 0}
        )
        assert (await client.until("conversation.item.truncated"))["item_id"] == first_reply
        await client.send({"type": "conversation.item.delete", "item_id": first_user})
        assert (await client.until("conversation.item.deleted"))["item_id"] == first_user
        # and the conversation goes on
        await client.send(user_text("One more thing."))
        await client.send({"type": "response.create", "response": {"max_output_tokens": 4}})
        done = (await client.until("response.done", timeout=60))["response"]
        assert done["status"] in ("completed", "incomplete")
        assert "error" not in client.types(), [e for e in client.events if e["type"] == "error"]
    await assert_clean(app, timeout=20)

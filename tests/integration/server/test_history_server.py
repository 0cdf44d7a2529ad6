"""The conversation's history over a real server on loopback (tiny engine), driven by the official ``openai`` SDK's GA
realtime client, whose models parse every event: a greeting (``response.create`` with nothing in the conversation,
with the session's or the response's own instructions), LiveKit's history edit (delete an item, create its
replacement at the old place, and one at ``root``) answered without an error, and the session's ``truncation``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from openai import AsyncOpenAI

from realtime.config import ServerConfig
from realtime.server.app import create_app, serve_in_background

pytestmark = pytest.mark.slow

API_KEY = "history-test-key"
MANUAL = {
    "type": "realtime",
    "output_modalities": ["audio"],
    "max_output_tokens": 8,
    "audio": {"input": {"turn_detection": None}},
}


async def engine_conversation(engine, item_id: str):
    """The engine's state of the one conversation holding ``item_id`` (the engine is shared with other tests)."""

    def find(core):
        (state,) = [c for c in core.scheduler.conversations.values() if c.has_item(item_id)]
        return state

    return await engine._call(find)


@pytest.fixture
async def connection(tiny_engine) -> AsyncIterator[object]:
    config = ServerConfig(port=0, api_key=API_KEY, webrtc=False)
    async with serve_in_background(create_app(config, engine=tiny_engine), config) as url:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY)
        async with client.realtime.connect(model="gpt-realtime") as conn:
            assert (await conn.recv()).type == "session.created"
            yield conn


async def until(connection, event_type: str, seen: list | None = None) -> object:
    """Read events up to the first of ``event_type``; an error event fails."""
    async for event in connection:
        if seen is not None:
            seen.append(event)
        assert event.type != "error", event
        if event.type == event_type:
            return event
    raise AssertionError(f"the connection closed before {event_type}")


async def setup(connection, **session) -> object:
    await connection.session.update(session={**MANUAL, **session})
    return (await until(connection, "session.updated")).session


async def answered(connection, **response) -> object:
    """``response.create`` (with ``response`` if given); the ``response.done`` response, which must not fail."""
    await connection.response.create(**({"response": response} if response else {}))
    done = (await until(connection, "response.done")).response
    assert done.status in ("completed", "incomplete"), done.status_details
    return done


async def create(connection, item_id: str, text: str, previous: str | None = None) -> object:
    """``conversation.item.create`` of a user text message; its ``conversation.item.added`` event."""
    item = {"id": item_id, "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await connection.conversation.item.create(item=item, **({"previous_item_id": previous} if previous else {}))
    return await until(connection, "conversation.item.added")


@pytest.mark.timeout(120)
async def test_a_greeting_answers_the_instructions(connection):
    await setup(connection, instructions="Greet the caller warmly.")
    done = await answered(connection)
    assert done.output[0].content[0].transcript, "the greeting says something"
    assert done.usage.input_tokens > 0 and done.usage.output_token_details.text_tokens > 0


@pytest.mark.timeout(120)
async def test_a_greeting_with_the_response_own_instructions(connection):
    await setup(connection)
    done = await answered(connection, instructions="Say hello to Ada.")
    assert done.usage.input_tokens > 0
    # the session's instructions are back for the next response: a second greeting builds on the first
    again = await answered(connection)
    assert again.usage.input_token_details.cached_tokens > 0


@pytest.mark.timeout(120)
async def test_delete_then_create_at_the_old_place_and_at_root(connection, tiny_engine):
    await setup(connection)
    await create(connection, "u1", "What is the capital of France?")
    await create(connection, "u2", "And of Spain?")
    reply = (await answered(connection)).output[0].id
    await connection.conversation.item.delete(item_id="u2")
    await until(connection, "conversation.item.deleted")
    added = await create(connection, "u2-edited", "And of Italy?", previous="u1")
    assert (added.item.id, added.previous_item_id) == ("u2-edited", "u1")
    added = await create(connection, "context", "We are planning a trip.", previous="root")
    assert added.previous_item_id is None
    done = await answered(connection)
    state = await engine_conversation(tiny_engine, "u2-edited")
    assert [item.id for item in state.items] == ["context", "u1", "u2-edited", reply, done.output[0].id]


@pytest.mark.timeout(120)
async def test_truncation_is_echoed_and_sets_the_conversation_policy(connection, tiny_engine):
    session = await setup(connection, truncation="disabled")
    assert session.truncation == "disabled"
    await create(connection, "t1", "Hello")
    await answered(connection)  # what fits is answered as ever
    state = await engine_conversation(tiny_engine, "t1")
    assert (state.policy.drop_oldest, state.policy.max_history_tokens) == (False, None)
    truncation = {"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {"post_instructions": 2000}}
    session = await setup(connection, truncation=truncation)
    assert (session.truncation.type, session.truncation.retention_ratio) == ("retention_ratio", 0.5)
    assert session.truncation.token_limits.post_instructions == 2000
    await answered(connection)  # the update reached the engine before this response
    assert (state.policy.drop_oldest, state.policy.retention_ratio, state.policy.max_history_tokens) == (
        True,
        0.5,
        2000,
    )
    await setup(connection, truncation="auto")
    await answered(connection)
    assert state.policy is None

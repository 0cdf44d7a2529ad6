"""Function calling end to end: a real server and the real engine, whose thinker replays scripts (the scripted test
families, tests/toy_family/scripted.py), so that the model calls exactly what a test needs; on a tiny checkpoint of
each model family. Every event the client gets is validated against the openai SDK's models."""

from __future__ import annotations

import pydantic
import pytest
from toy_family.scripted import ScriptedThinker

from tests.helpers.scripted import call, scripted_family, text
from tests.helpers.scripted import scripted_engine as make_scripted_engine
from tests.helpers.server import connect, served, user_text

openai = pytest.importorskip("openai")
from openai.types.realtime import RealtimeServerEvent  # noqa: E402

pytestmark = pytest.mark.slow

SERVER_EVENT = pydantic.TypeAdapter(RealtimeServerEvent)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city, now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def scripted_engine(family_model_dir):
    with make_scripted_engine(family_model_dir) as engine:
        yield engine


@pytest.fixture(scope="module")
def scripted(scripted_engine) -> ScriptedThinker:
    return scripted_family(scripted_engine)


@pytest.fixture
async def client(scripted_engine, scripted):
    scripted.reset()
    async with served(scripted_engine) as (url, _app), connect(url) as c:
        await c.send(
            {"type": "session.update", "session": {"tools": [WEATHER], "audio": {"input": {"turn_detection": None}}}}
        )
        updated = await c.until("session.updated")
        assert updated["session"]["tools"][0]["name"] == "get_weather"
        yield c
    scripted.reset()


async def respond(c, response: dict | None = None) -> list[dict]:
    """``response.create``; every event up to its ``response.done``, each validated by the SDK."""
    start = len(c.events)
    await c.send({"type": "response.create", **({"response": response} if response else {})})
    await c.until("response.done", timeout=120)
    events = c.events[start:]
    for event in events:
        SERVER_EVENT.validate_python(event)
    return events


def of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


async def test_a_reply_speaks_then_calls_and_the_tool_output_gets_a_spoken_answer(client, scripted_engine, scripted):
    await client.send(user_text("What is the weather in Paris?"))
    scripted.play(
        text(scripted_engine, "Let me check.\n") + call(scripted_engine, "get_weather", {"city": "Paris"}),
        text(scripted_engine, "It is sunny in Paris."),
    )
    events = await respond(client)
    assert not of(events, "error")
    transcript = "".join(e["delta"] for e in of(events, "response.output_audio_transcript.delta"))
    assert transcript == "Let me check.\n"  # the call is neither in the transcript nor spoken
    assert of(events, "response.output_audio.delta")
    added = [e["item"]["type"] for e in of(events, "response.output_item.added")]
    assert added == ["message", "function_call"]
    arguments = "".join(e["delta"] for e in of(events, "response.function_call_arguments.delta"))
    (args_done,) = of(events, "response.function_call_arguments.done")
    assert arguments == args_done["arguments"] == '{"city": "Paris"}' and args_done["name"] == "get_weather"
    (done,) = of(events, "response.done")
    assert done["response"]["status"] == "completed"
    first_usage = done["response"]["usage"]
    message, function_call = done["response"]["output"]
    assert message["type"] == "message" and function_call["type"] == "function_call"
    assert function_call["status"] == "completed" and function_call["call_id"] == args_done["call_id"]

    await client.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": function_call["call_id"], "output": '{"sky": "clear"}'},
        }
    )
    created = await client.until("conversation.item.done")
    assert created["item"]["type"] == "function_call_output" and created["previous_item_id"] == function_call["id"]
    events = await respond(client)
    transcript = "".join(e["delta"] for e in of(events, "response.output_audio_transcript.delta"))
    assert transcript == "It is sunny in Paris." and of(events, "response.output_audio.delta")
    (done,) = of(events, "response.done")
    assert done["response"]["status"] == "completed"
    assert [item["type"] for item in done["response"]["output"]] == ["message"]
    # the reply with its call was kept as generated: the next prompt reuses all of it from the cache
    cached = done["response"]["usage"]["input_token_details"]["cached_tokens"]
    assert cached >= first_usage["input_tokens"] + first_usage["output_token_details"]["text_tokens"]


async def test_tool_choice_required_forces_a_call_and_nothing_is_spoken(client, scripted_engine, scripted):
    await client.send(user_text("Oslo?"))
    # the engine wrote '<tool_call>\n{"name": "'; the model completes the call
    scripted.play(
        text(scripted_engine, 'get_weather", "arguments": {"city": "Oslo"}}\n')
        + [scripted_engine.core.renderer.tools.call_close]
    )
    events = await respond(client, {"tool_choice": "required"})
    assert not of(events, "response.output_audio.delta") and not of(events, "response.output_audio_transcript.delta")
    (done,) = of(events, "response.done")
    assert done["response"]["status"] == "completed"
    (item,) = done["response"]["output"]
    assert (item["type"], item["name"], item["arguments"]) == ("function_call", "get_weather", '{"city": "Oslo"}')


async def test_a_named_tool_choice_calls_that_function(client, scripted_engine, scripted):
    await client.send(user_text("Rome?"))
    scripted.play(text(scripted_engine, '{"city": "Rome"}}\n') + [scripted_engine.core.renderer.tools.call_close])
    events = await respond(client, {"tool_choice": {"type": "function", "name": "get_weather"}})
    (added,) = of(events, "response.output_item.added")
    assert added["item"]["name"] == "get_weather"
    (done,) = of(events, "response.done")
    assert [i["arguments"] for i in done["response"]["output"]] == ['{"city": "Rome"}']


async def test_tool_choice_none_ends_the_reply_where_the_model_would_call(client, scripted_engine, scripted):
    await client.send(user_text("Paris?"))
    scripted.play(text(scripted_engine, "Sure.") + call(scripted_engine, "get_weather", {"city": "Paris"}))
    events = await respond(client, {"tool_choice": "none"})
    (done,) = of(events, "response.done")
    assert done["response"]["status"] == "completed"
    (message,) = done["response"]["output"]
    assert message["type"] == "message" and message["content"][0]["transcript"] == "Sure."


async def test_a_named_choice_of_an_unknown_function_is_an_error(client):
    await client.send(user_text("Hi"))
    await client.send({"type": "response.create", "response": {"tool_choice": {"type": "function", "name": "nope"}}})
    error = await client.until("error")
    assert (error["error"]["code"], error["error"]["param"]) == ("invalid_value", "response.tool_choice")


async def test_a_malformed_call_fails_the_response_and_the_conversation_goes_on(client, scripted_engine, scripted):
    tools = scripted_engine.core.renderer.tools
    await client.send(user_text("Launch it."))
    scripted.play(
        text(scripted_engine, "Hmm.\n")
        + [tools.call_open]
        + text(scripted_engine, '\n{"name": "launch", "arguments": {}}')
    )
    events = await respond(client)
    (error,) = of(events, "error")
    assert error["error"]["code"] == "invalid_function_call" and "'launch'" in error["error"]["message"]
    (done,) = of(events, "response.done")
    assert done["response"]["status"] == "failed"
    assert not of(events, "response.output_item.added")[1:]  # the unknown function was never announced

    scripted.reset()  # the failed reply stopped its script midway
    scripted.play(
        text(scripted_engine, "Sorry.\n")
        + [tools.call_open]
        + text(scripted_engine, '\n{"name": "get_weather", "arguments": {"city":'),
        text(scripted_engine, "Fine."),
    )
    events = await respond(client)  # unterminated: announced, then incomplete and deleted
    (done,) = of(events, "response.done")
    assert done["response"]["status"] == "failed" and "ended before" in of(events, "error")[0]["error"]["message"]
    call_item = done["response"]["output"][-1]
    assert (call_item["type"], call_item["status"]) == ("function_call", "incomplete")
    assert [e["item_id"] for e in of(events, "conversation.item.deleted")] == [call_item["id"]]

    events = await respond(client)
    (done,) = of(events, "response.done")
    assert done["response"]["status"] == "completed" and not of(events, "error")


async def test_client_items_replay_a_call_and_an_unknown_call_id_is_refused(client, scripted_engine, scripted):
    await client.send(user_text("Weather in Lima?"))
    await client.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Lima"}'},
        }
    )
    await client.send(
        {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "c2", "output": "x"}}
    )
    error = await client.until("error")
    assert (error["error"]["code"], error["error"]["param"]) == ("unknown_call_id", "item.call_id")
    await client.send(
        {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "c1", "output": "fog"}}
    )
    scripted.play(text(scripted_engine, "Foggy."))
    events = await respond(client)
    (done,) = of(events, "response.done")
    assert done["response"]["status"] == "completed"
    assert done["response"]["output"][0]["content"][0]["transcript"] == "Foggy."


@pytest.mark.timeout(120)
async def test_the_openai_sdk_holds_a_tool_round_trip(scripted_engine, scripted):
    """The official SDK's GA realtime client, unmodified: a forced call of a tool, its output, a spoken answer."""
    scripted.reset()
    async with served(scripted_engine) as (_url, app):
        client = openai.AsyncOpenAI(base_url=f"{app.state.base_url}/v1", api_key="sdk-test-key")
        async with client.realtime.connect(model="gpt-realtime") as connection:
            seen: list = []

            async def until(kind: str):
                async for event in connection:
                    seen.append(event)
                    assert event.type != "error", event
                    if event.type == kind:
                        return event
                raise AssertionError(f"closed before {kind}")

            await until("session.created")
            await connection.session.update(
                session={"type": "realtime", "tools": [WEATHER], "audio": {"input": {"turn_detection": None}}}
            )
            updated = await until("session.updated")
            assert updated.session.tools[0].name == "get_weather"
            await connection.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris?"}]}
            )
            tools = scripted_engine.core.renderer.tools
            scripted.play(
                text(scripted_engine, '{"city": "Paris"}}\n') + [tools.call_close],
                text(scripted_engine, "Sunny."),
            )
            await connection.response.create(response={"tool_choice": {"type": "function", "name": "get_weather"}})
            done = await until("response.done")
            (call_item,) = done.response.output
            assert (call_item.type, call_item.name, call_item.arguments) == (
                "function_call",
                "get_weather",
                '{"city": "Paris"}',
            )
            deltas = "".join(e.delta for e in seen if e.type == "response.function_call_arguments.delta")
            assert deltas == call_item.arguments

            await connection.conversation.item.create(
                item={"type": "function_call_output", "call_id": call_item.call_id, "output": '{"sky": "clear"}'}
            )
            await connection.response.create()
            done = await until("response.done")
            assert done.response.status == "completed"
            assert done.response.output[0].content[0].transcript == "Sunny."
            assert any(e.type == "response.output_audio.delta" for e in seen[-20:])

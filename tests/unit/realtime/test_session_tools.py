"""realtime.session's function calling: tools in session.update / response.create, calls streamed as function_call
output items, client call items. Event sequences are validated against the openai SDK's models by the Driver."""

from __future__ import annotations

from pipeline.outputs import FunctionCallDelta, FunctionCallDone, FunctionCallStarted, ResponseStatus, TextDelta
from pipeline.tools import MAX_CALLS_PER_RESPONSE, ToolChoice, ToolMode
from realtime.protocol.codes import ErrorCode
from realtime.session import StartResponse
from realtime.tool_calls import AddFunctionCall, AddFunctionOutput, SetTools
from tests.unit.realtime.test_session import Driver, error_of, events, of, types

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def _with_tools(**session) -> Driver:
    d = Driver(manual=True)
    actions = d.send({"type": "session.update", "session": {"tools": [WEATHER], **session}})
    (set_tools,) = of(actions, SetTools)
    assert [t.name for t in set_tools.tools] == ["get_weather"]
    (updated,) = events(actions)
    assert updated["session"]["tools"][0]["parameters"]["properties"] == {"city": {"type": "string"}}
    d.send({"type": "conversation.item.create", "item": _user("Weather?")})
    return d


def _user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _call(d: Driver, start: StartResponse, index: int = 0, arguments: str = '{"city": "Paris"}') -> list:
    item_id = start.call_item_ids[index]
    actions = d.engine(FunctionCallStarted(index, item_id, "get_weather"))
    actions += d.engine(FunctionCallDelta(index, arguments[:5]))
    actions += d.engine(FunctionCallDelta(index, arguments[5:]))
    actions += d.engine(FunctionCallDone(index, item_id, "get_weather", arguments))
    return actions


def test_a_call_only_reply_is_one_function_call_output_item():
    d = _with_tools()
    actions = d.respond()
    (start,) = of(actions, StartResponse)
    assert start.tool_choice == ToolChoice() and len(start.call_item_ids) == MAX_CALLS_PER_RESPONSE
    assert types(actions) == ["response.created"]  # the message waits for text or audio
    actions = _call(d, start)
    assert types(actions) == [
        "response.output_item.added",
        "conversation.item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
    ]
    added = events(actions)[0]
    assert (added["output_index"], added["item"]["status"], added["item"]["arguments"]) == (0, "in_progress", "")
    done = events(actions)[4]
    assert done["arguments"] == '{"city": "Paris"}' and done["call_id"] == added["item"]["call_id"]
    (response_done,) = events(d.done())
    assert response_done["response"]["status"] == "completed"
    (item,) = response_done["response"]["output"]
    assert (item["type"], item["id"], item["status"]) == ("function_call", start.call_item_ids[0], "completed")
    assert item["id"] in {i.id for i in d.session.items}


def test_text_then_a_call_lists_the_message_first():
    d = _with_tools()
    (start,) = of(d.respond(), StartResponse)
    actions = d.engine(TextDelta("Let me check.", ()))
    assert types(actions)[:3] == [
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    actions = _call(d, start)
    assert events(actions)[0]["output_index"] == 1
    (done,) = [e for e in events(d.done()) if e["type"] == "response.done"]
    assert [i["type"] for i in done["response"]["output"]] == ["message", "function_call"]


def test_a_call_cut_off_ends_incomplete_and_leaves_the_conversation():
    d = _with_tools()
    (start,) = of(d.respond(), StartResponse)
    d.engine(FunctionCallStarted(0, start.call_item_ids[0], "get_weather"))
    actions = d.done(ResponseStatus.CANCELLED, reason="client_cancelled")
    assert types(actions) == ["response.output_item.done", "conversation.item.deleted", "response.done"]
    assert events(actions)[0]["item"]["status"] == "incomplete"
    assert start.call_item_ids[0] not in {i.id for i in d.session.items}


def test_a_response_with_its_own_tools_sets_them_and_restores_the_sessions():
    d = _with_tools()
    other = {"type": "function", "name": "noop"}
    actions = d.send({"type": "response.create", "response": {"tools": [other], "tool_choice": "required"}})
    (set_tools,) = of(actions, SetTools)
    (start,) = of(actions, StartResponse)
    assert [t.name for t in set_tools.tools] == ["noop"] and start.tool_choice == ToolChoice(ToolMode.REQUIRED)
    assert actions.index(set_tools) < actions.index(start)
    (restore,) = of(d.done(), SetTools)
    assert [t.name for t in restore.tools] == ["get_weather"]


def test_tool_choice_none_or_no_tools_make_no_call_ids_and_announce_the_message_at_once():
    d = _with_tools(tool_choice="none")
    actions = d.respond()
    assert of(actions, StartResponse)[0].call_item_ids == ()
    assert "response.output_item.added" in types(actions)
    d.done()
    plain = Driver(manual=True)
    plain.send({"type": "conversation.item.create", "item": _user("Hi")})
    assert of(plain.respond(), StartResponse)[0].call_item_ids == ()


def test_a_required_choice_without_tools_and_an_unknown_named_function_are_refused():
    d = Driver(manual=True)
    d.send({"type": "conversation.item.create", "item": _user("Hi")})
    error = error_of(d.send({"type": "response.create", "response": {"tool_choice": "required"}}))
    assert (error["code"], error["param"]) == (ErrorCode.INVALID_VALUE, "response.tool_choice")
    d.send(
        {"type": "session.update", "session": {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "x"}}}
    )
    error = error_of(d.respond())
    assert (error["code"], error["param"]) == (ErrorCode.INVALID_VALUE, "session.tool_choice")
    assert "'x'" in error["message"] and d.session.active_response_id is None


def test_bad_tools_are_refused_with_the_field_at_fault():
    d = Driver()
    cases = [
        ({"tools": [{"type": "function", "name": "bad name"}]}, "session.tools.0.name"),
        ({"tools": [WEATHER, WEATHER]}, "session.tools"),
        (
            {"tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}]},
            "session.tools.0.parameters",
        ),
        (
            {"tools": [{"type": "function", "name": "f", "parameters": {"properties": {}, "required": ["a"]}}]},
            "session.tools.0.parameters",
        ),
        ({"tool_choice": "sometimes"}, "session.tool_choice"),
    ]
    for session, param in cases:
        error = error_of(d.send({"type": "session.update", "session": session}))
        assert (error["code"], error["param"]) == (ErrorCode.INVALID_VALUE, param), (session, error)


def test_client_function_call_and_output_items():
    d = Driver(manual=True)
    item = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Lima"}'}
    actions = d.send({"type": "conversation.item.create", "item": item})
    (add,) = of(actions, AddFunctionCall)
    assert (add.name, add.arguments) == ("get_weather", '{"city": "Lima"}')
    assert [e["item"]["type"] for e in events(actions)] == ["function_call", "function_call"]
    error = error_of(
        d.send(
            {
                "type": "conversation.item.create",
                "item": {"type": "function_call_output", "call_id": "c9", "output": "x"},
            }
        )
    )
    assert (error["code"], error["param"]) == (ErrorCode.UNKNOWN_CALL_ID, "item.call_id")
    actions = d.send(
        {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "c1", "output": "fog"}}
    )
    (out,) = of(actions, AddFunctionOutput)
    assert out.output == "fog"
    assert events(actions)[0]["item"] | {"id": None} == {
        "id": None,
        "object": "realtime.item",
        "type": "function_call_output",
        "status": "completed",
        "call_id": "c1",
        "output": "fog",
    }

"""Function calling in Qwen2.5's format: the conversation's rendering equals the checkpoint's chat template with
``tools=`` token for token; the call parser; a reply's calls split off as items without moving a cached position."""

from __future__ import annotations

import json

import pytest

from pipeline.core.conversation_state import ConversationState, ConvItem, ItemKind
from pipeline.errors import FunctionCallError
from pipeline.models.common.hermes_tools import HermesCallParser
from pipeline.models.qwen2_5_omni import checkpoint as ckpt
from pipeline.models.qwen2_5_omni.prompt import ChatMLRenderer
from pipeline.output.function_calls import CallTracker, Verdict
from pipeline.response_events import FunctionCallDelta, FunctionCallDone, FunctionCallStarted
from pipeline.tools import AUTO, Tool, ToolChoice, ToolMode

WEATHER = Tool(
    "get_weather",
    "The weather in a city, now.",
    json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
)
NOOP = Tool("noop")


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return ckpt.load_checkpoint(tiny_model_dir)


@pytest.fixture(scope="module")
def renderer(loaded) -> ChatMLRenderer:
    return ChatMLRenderer(loaded.tokenizer, loaded.special)


def _hf_tools(tools):
    return [{"type": "function", "function": tool.as_dict()} for tool in tools]


def _state(renderer, items, tools=(WEATHER, NOOP)) -> ConversationState:
    conv = ConversationState("c", renderer, instructions="Be brief.", max_context_tokens=4096)
    conv.tools = tools
    conv.items = items
    return conv


def _call(renderer, item_id, name, arguments: dict) -> ConvItem:
    ids = renderer.tools.call(name, json.dumps(arguments))
    return ConvItem(item_id, "assistant", ItemKind.FUNCTION_CALL, reply_ids=ids)


def _template(loaded, messages, tools) -> list[int]:
    ids = loaded.tokenizer.apply_chat_template(messages, tools=_hf_tools(tools), add_generation_prompt=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def test_a_tool_round_trip_renders_as_the_chat_template_with_tools(loaded, renderer):
    """Text then two calls in one assistant turn, two tool responses sharing one user turn, then a user message."""
    items = [
        ConvItem("u1", "user", ItemKind.TEXT, text="What is the weather in Paris? Also do nothing."),
        ConvItem("a1", "assistant", ItemKind.TEXT, text="Let me check."),
        _call(renderer, "f1", "get_weather", {"city": "Paris", "note": "été"}),
        _call(renderer, "f2", "noop", {}),
        ConvItem("o1", "user", ItemKind.FUNCTION_OUTPUT, text='{"sky": "sunny", "c": 21}'),
        ConvItem("o2", "user", ItemKind.FUNCTION_OUTPUT, text="done."),
        ConvItem("u2", "user", ItemKind.TEXT, text="Thanks!"),
    ]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather in Paris? Also do nothing."},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris", "note": "été"}},
                },
                {"type": "function", "function": {"name": "noop", "arguments": {}}},
            ],
        },
        {"role": "tool", "content": '{"sky": "sunny", "c": 21}'},
        {"role": "tool", "content": "done."},
        {"role": "user", "content": "Thanks!"},
    ]
    ours = _state(renderer, items).render().token_ids + renderer.header("assistant")
    assert ours == _template(loaded, messages, (WEATHER, NOOP))
    text = loaded.tokenizer.decode(ours)
    assert "# Tools" in text and '"name": "get_weather"' in text and "<tools>\n{" in text


def test_a_call_alone_and_a_single_tool_response_render_as_the_template(loaded, renderer):
    items = [
        ConvItem("u1", "user", ItemKind.TEXT, text="Weather?"),
        _call(renderer, "f1", "get_weather", {"city": "Oslo"}),
        ConvItem("o1", "user", ItemKind.FUNCTION_OUTPUT, text="snow"),
    ]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]},
        {"role": "tool", "content": "snow"},
    ]
    ours = _state(renderer, items, (WEATHER,)).render().token_ids + renderer.header("assistant")
    assert ours == _template(loaded, messages, (WEATHER,))


def test_without_tools_the_system_message_is_the_instructions_alone(loaded, renderer):
    conv = _state(renderer, [ConvItem("u1", "user", ItemKind.TEXT, text="Hi")], tools=())
    assert conv.render().token_ids == renderer.text_message("system", "Be brief.") + renderer.text_message("user", "Hi")


def test_changing_the_tools_keeps_only_the_cache_before_the_system_message_changes(renderer):
    """The tools are part of the system message: the common-prefix rule keeps the cache up to where it changes, and
    everything after (the whole history) is prefilled again."""
    conv = _state(renderer, [ConvItem("u1", "user", ItemKind.TEXT, text="Hi")], tools=())
    plain = conv.system_message()
    conv.cached_keys = conv.render().keys
    conv.tools = (WEATHER,)
    with_tools = conv.system_message()
    shared = ConversationState.common_prefix_of(plain, with_tools)
    assert 0 < shared <= len(plain) - 2  # at most the instructions (the footer moves after the tools)
    assert conv.common_prefix(conv.render().keys) == shared
    conv.cached_keys = conv.render().keys
    conv.tools = ()
    assert conv.common_prefix(conv.render().keys) == shared


# --- the call parser ---------------------------------------------------------------------------------------------


def _feed(parser: HermesCallParser, text: str, step: int = 3) -> tuple[list[str], str]:
    names, deltas = [], ""
    for i in range(0, len(text), step):
        name, delta = parser.feed(text[i : i + step])
        names += [name] if name else []
        deltas += delta
    return names, deltas


def test_the_parser_names_the_function_early_and_streams_the_arguments_exactly():
    parser = HermesCallParser(frozenset({"get_weather"}))
    names, deltas = _feed(parser, '\n{"name": "get_weather", "arguments": {"city": "Paris", "n": {"a": 1}}}\n')
    assert names == ["get_weather"]
    call, name, last = parser.close()
    assert name is None and (call.name, call.arguments) == ("get_weather", '{"city": "Paris", "n": {"a": 1}}')
    assert deltas + last == call.arguments


def test_the_parser_takes_a_call_written_in_another_key_order_whole():
    parser = HermesCallParser(frozenset({"noop"}))
    assert _feed(parser, '{"arguments": {}, "name": "noop"}') == ([], "")
    call, name, last = parser.close()
    assert (name, call.arguments, last) == ("noop", "{}", "{}")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"name": "rm_rf", "arguments": {}}', "'rm_rf', which is not a tool"),
        ('{"name": "noop", "arguments": {', "not valid JSON"),
        ('{"name": "noop", "arguments": "{}"}', 'no "arguments" object'),
        ('["noop"]', 'has no "name"'),
        ('{"name": "noop", "arguments": {}, "x": 1}', "extra fields"),
    ],
)
def test_a_malformed_call_is_refused_with_what_is_wrong(text, words):
    parser = HermesCallParser(frozenset({"noop"}))
    with pytest.raises(FunctionCallError, match=words):
        _feed(parser, text, step=len(text))
        parser.close()


# --- a reply's calls -------------------------------------------------------------------------------------------


def _tracker(renderer, events, choice=AUTO, ids=("call_a", "call_b")) -> CallTracker:
    return CallTracker(
        renderer.tools,
        tools=frozenset({"get_weather", "noop"}),
        choice=choice,
        item_ids=ids,
        decode=renderer.decode,
        sink=events.append,
    )


def _generate(tracker: CallTracker, reply: ConvItem, ids: list[int]) -> list[Verdict]:
    verdicts = []
    for token in ids:
        verdict = tracker.accept(token, len(reply.reply_ids))
        verdicts.append(verdict)
        if verdict is Verdict.STOP:
            break
        reply.reply_ids.append(token)
    return verdicts


def test_a_reply_that_speaks_then_calls_twice_splits_into_items_with_the_same_positions(renderer):
    tools = renderer.tools
    text = renderer.text("Let me check.\n")
    first = tools.call("get_weather", '{"city": "Paris"}')
    second = tools.call_separator() + tools.call("noop", "{}")
    after = renderer.text(" Done")
    events: list = []
    tracker = _tracker(renderer, events)
    reply = ConvItem("r1", "assistant", ItemKind.REPLY, open=True)
    conv = _state(renderer, [ConvItem("u1", "user", ItemKind.TEXT, text="Hi"), reply])
    verdicts = _generate(tracker, reply, text + first + second + after)
    assert verdicts[: len(text)] == [Verdict.TEXT] * len(text)
    assert set(verdicts[len(text) : len(text) + len(first) + len(second)]) == {Verdict.HIDDEN}
    assert verdicts[-1] is Verdict.STOP  # text after the calls ends the reply
    reply.open = False
    as_generated = conv.render().keys
    tracker.settle(conv, reply)
    assert conv.render().keys == as_generated  # nothing to prefill again
    assert [(i.id, i.kind) for i in conv.items[1:]] == [
        ("r1", ItemKind.REPLY),
        ("call_a", ItemKind.FUNCTION_CALL),
        ("call_b", ItemKind.FUNCTION_CALL),
    ]
    assert reply.reply_ids == text
    started = [e for e in events if isinstance(e, FunctionCallStarted)]
    done = [e for e in events if isinstance(e, FunctionCallDone)]
    assert [(e.index, e.item_id, e.name) for e in started] == [(0, "call_a", "get_weather"), (1, "call_b", "noop")]
    assert [(e.index, e.arguments) for e in done] == [(0, '{"city": "Paris"}'), (1, "{}")]
    streamed = "".join(e.delta for e in events if isinstance(e, FunctionCallDelta) and e.index == 0)
    assert streamed == '{"city": "Paris"}'


def test_a_call_only_reply_leaves_no_empty_message_and_an_unfinished_call_is_dropped(renderer):
    events: list = []
    tracker = _tracker(renderer, events)
    reply = ConvItem("r1", "assistant", ItemKind.REPLY, open=True)
    conv = _state(renderer, [ConvItem("u1", "user", ItemKind.TEXT, text="Hi"), reply])
    call = renderer.tools.call("noop", "{}")
    unfinished = renderer.tools.call_separator() + renderer.tools.call("get_weather", '{"city": "X"}')[:-3]
    _generate(tracker, reply, call + unfinished)
    with pytest.raises(FunctionCallError, match="ended before its call of 'get_weather'"):
        tracker.end_of_text()
    reply.open = False
    tracker.settle(conv, reply)
    assert [(i.id, i.kind, i.reply_ids) for i in conv.items[1:]] == [("call_a", ItemKind.FUNCTION_CALL, call)]


def test_with_tool_choice_none_a_call_ends_the_reply(renderer):
    tracker = _tracker(renderer, [], choice=ToolChoice(ToolMode.NONE))
    reply = ConvItem("r1", "assistant", ItemKind.REPLY, open=True)
    text = renderer.text("Sure.")
    verdicts = _generate(tracker, reply, text + renderer.tools.call("noop", "{}"))
    assert verdicts == [Verdict.TEXT] * len(text) + [Verdict.STOP]


def test_a_named_tool_choice_opens_the_call_and_names_the_function(renderer):
    events: list = []
    tracker = _tracker(renderer, events, choice=ToolChoice(ToolMode.REQUIRED, "get_weather"))
    tracker.prime(renderer.tools.forced("get_weather"))
    assert events == [FunctionCallStarted(0, "call_a", "get_weather")]
    assert tracker.in_call

"""realtime.session and the conversation's history: a response with nothing in the conversation (a greeting, with the
session's or the response's own instructions), items created anywhere with ``previous_item_id`` (including ``root``,
and LiveKit's edit: delete an item, create its replacement at the old place), and the session's ``truncation``.
Every event is validated with the openai SDK's models (:class:`test_session.Driver`)."""

from __future__ import annotations

import pytest
from test_session import Driver, error_of, events, of, types

from pipeline.api import ContextPolicy
from pipeline.response_events import TextDelta
from realtime.protocol.codes import ErrorCode
from realtime.protocol.model import Role
from realtime.protocol.names import Dialect
from realtime.session import AddText, CancelResponse, SetContextPolicy, SetInstructions, StartResponse


def text_item(item_id: str, text: str = "x", role: str = "user") -> dict:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"id": item_id, "type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def create(d: Driver, item_id: str, previous: str | None = None, **kwargs) -> list:
    event = {"type": "conversation.item.create", "item": text_item(item_id, **kwargs)}
    if previous is not None:
        event["previous_item_id"] = previous
    return d.send(event)


def ids(d: Driver) -> list[str]:
    return [item.id for item in d.session.items]


# --- a response with no user input ---------------------------------------------------------------


def test_a_response_in_an_empty_conversation_is_started_like_any_other():
    d = Driver(manual=True)
    acts = d.respond()
    assert "error" not in types(acts)
    (start,) = of(acts, StartResponse)
    assert types(acts)[0] == "response.created" and ids(d) == [start.item_id]
    d.engine(TextDelta("Hello! How can I help?", [1, 2, 3]))
    done = events(d.done())[-1]
    assert done["type"] == "response.done" and done["response"]["status"] == "completed"


def test_a_greeting_with_the_response_own_instructions_restores_the_session_ones():
    d = Driver(manual=True)
    acts = d.send({"type": "response.create", "response": {"instructions": "Greet the caller by name: Ada."}})
    assert [type(a) for a in acts if isinstance(a, (SetInstructions, StartResponse))] == [
        SetInstructions,
        StartResponse,
    ]
    assert of(acts, SetInstructions) == [SetInstructions("Greet the caller by name: Ada.")]
    assert of(d.done(), SetInstructions) == [SetInstructions("You are helpful.")]


# --- previous_item_id ---------------------------------------------------------------------------------


def test_an_item_created_in_the_middle_goes_there_and_says_so():
    d = Driver(manual=True)
    create(d, "u1")
    create(d, "u2")
    acts = create(d, "mid", "u1", text="Context.", role="system")
    assert of(acts, AddText) == [AddText("mid", "Context.", Role.SYSTEM, "u1")]
    assert [(e["type"], e["previous_item_id"]) for e in events(acts)] == [
        ("conversation.item.added", "u1"),
        ("conversation.item.done", "u1"),
    ]
    assert ids(d) == ["u1", "mid", "u2"]
    acts = create(d, "first", "root")
    assert of(acts, AddText)[0].previous_item_id == "root" and events(acts)[0]["previous_item_id"] is None
    acts = create(d, "last", "u2")  # after the last item: an append, as with no previous_item_id
    assert of(acts, AddText)[0].previous_item_id is None and events(acts)[0]["previous_item_id"] == "u2"
    assert ids(d) == ["first", "u1", "mid", "u2", "last"]


def test_beta_clients_get_the_insertion_as_conversation_item_created():
    d = Driver(Dialect.BETA, manual=True)
    create(d, "u1")
    create(d, "u2")
    (created,) = events(create(d, "mid", "u1"))
    assert (created["type"], created["previous_item_id"]) == ("conversation.item.created", "u1")


def test_delete_then_create_at_the_old_place():
    """LiveKit's history edit: the replacement goes after the item that preceded the deleted one."""
    d = Driver(manual=True)
    for item_id in ("u1", "u2", "u3"):
        create(d, item_id)
    d.send({"type": "conversation.item.delete", "item_id": "u2"})
    acts = create(d, "u2-edited", "u1", text="Edited.")
    assert of(acts, AddText) == [AddText("u2-edited", "Edited.", Role.USER, "u1")]
    assert events(acts)[0]["previous_item_id"] == "u1"
    assert ids(d) == ["u1", "u2-edited", "u3"]


def test_while_a_response_runs_an_item_can_only_be_appended():
    d = Driver(manual=True)
    create(d, "u1")
    d.respond()
    reply = ids(d)[-1]
    err = error_of(
        d.send(
            {
                "type": "conversation.item.create",
                "event_id": "ev7",
                "previous_item_id": "u1",
                "item": text_item("early"),
            }
        )
    )
    assert (err["code"], err["param"], err["event_id"]) == (ErrorCode.CONVERSATION_BUSY, "previous_item_id", "ev7")
    assert "cancel it or wait for response.done" in err["message"]
    acts = create(d, "next", reply)  # after the reply being written: appended, it joins the next response
    assert of(acts, AddText)[0].previous_item_id is None
    # once the response is being cancelled the insertion is accepted (the executor waits for the response's end)
    assert of(d.send({"type": "response.cancel"}), CancelResponse)
    assert of(create(d, "early", "u1"), AddText)[0].previous_item_id == "u1"
    assert ids(d) == ["u1", "early", reply, "next"]


def test_an_unknown_previous_item_is_refused():
    d = Driver(manual=True)
    create(d, "u1")
    err = error_of(create(d, "u2", "ghost"))
    assert (err["code"], err["param"]) == (ErrorCode.ITEM_NOT_FOUND, "previous_item_id")
    assert ids(d) == ["u1"]


# --- truncation --------------------------------------------------------------------------------------


def test_truncation_is_auto_at_start():
    assert events(Driver().start_actions)[0]["session"]["truncation"] == "auto"


@pytest.mark.parametrize(
    ("truncation", "policy"),
    [
        ("disabled", ContextPolicy(drop_oldest=False)),
        ({"type": "retention_ratio", "retention_ratio": 0.5}, ContextPolicy(drop_oldest=True, retention_ratio=0.5)),
        (
            {"type": "retention_ratio", "retention_ratio": 1, "token_limits": {"post_instructions": 3000}},
            ContextPolicy(drop_oldest=True, retention_ratio=1.0, max_history_tokens=3000),
        ),
    ],
)
def test_truncation_sets_the_conversation_context_policy_and_is_echoed(truncation, policy):
    d = Driver()
    acts = d.send({"type": "session.update", "session": {"type": "realtime", "truncation": truncation}})
    assert of(acts, SetContextPolicy) == [SetContextPolicy(policy)]
    expected = (
        dict(truncation, retention_ratio=float(truncation["retention_ratio"]))
        if truncation != "disabled"
        else truncation
    )
    assert events(acts)[0]["session"]["truncation"] == expected
    # the same setting again changes nothing; auto hands the choice back to the engine
    assert of(d.send({"type": "session.update", "session": {"truncation": truncation}}), SetContextPolicy) == []
    acts = d.send({"type": "session.update", "session": {"truncation": "auto"}})
    assert of(acts, SetContextPolicy) == [SetContextPolicy(None)]
    assert events(acts)[0]["session"]["truncation"] == "auto"


@pytest.mark.parametrize(
    "truncation",
    [
        "sometimes",
        {"type": "retention_ratio"},
        {"type": "retention_ratio", "retention_ratio": 1.5},
        {"type": "retention_ratio", "retention_ratio": "0.5"},
        {"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {"post_instructions": 0}},
        {"type": "retention_ratio", "retention_ratio": 0.5, "extra": 1},
        {"type": "disabled"},
    ],
)
def test_a_bad_truncation_is_refused_with_its_field_and_changes_nothing(truncation):
    d = Driver()
    err = error_of(d.send({"type": "session.update", "event_id": "e1", "session": {"truncation": truncation}}))
    assert (err["code"], err["param"], err["event_id"]) == (ErrorCode.INVALID_VALUE, "session.truncation", "e1")
    assert d.session.config.truncation.type.value == "auto"

"""Inserting an item before the end of a conversation (``ConversationState.add`` with ``previous_item_id``), over a
fake renderer: where the item goes, what is refused, and that the cache keeps exactly the positions before it."""

from __future__ import annotations

import pytest

from pipeline.api import ROOT_ITEM_ID
from pipeline.core.conversation_state import ConversationState, ConvItem, ItemKind
from pipeline.errors import InvalidInputError, ResponseActiveError, UnknownItemError


class Renderer:
    """A message is its header (2 ids), one id per character of its text, its footer (1 id)."""

    def header(self, role: str) -> list[int]:
        return [1, {"system": 10, "user": 11, "assistant": 12}[role]]

    def footer(self) -> list[int]:
        return [2]

    def text_message(self, role: str, text: str) -> list[int]:
        return self.header(role) + [ord(c) for c in text] + self.footer()


def text(item_id: str, role: str = "user") -> ConvItem:
    return ConvItem(id=item_id, role=role, kind=ItemKind.TEXT, text=item_id)


def conversation(*item_ids: str) -> ConversationState:
    conv = ConversationState("c", Renderer(), instructions="sys", max_context_tokens=1000)
    for item_id in item_ids:
        conv.add(text(item_id))
    return conv


def ids(conv: ConversationState) -> list[str]:
    return [item.id for item in conv.items]


def cache_everything(conv: ConversationState) -> list:
    """Pretend the whole rendering is prefilled; returns its keys."""
    keys = conv.render().keys
    conv.cached_keys = list(keys)
    return keys


@pytest.mark.parametrize(
    ("previous", "expected"),
    [(None, ["a", "b", "c", "new"]), (ROOT_ITEM_ID, ["new", "a", "b", "c"]), ("a", ["a", "new", "b", "c"])],
)
def test_an_item_goes_after_its_previous_item(previous, expected):
    conv = conversation("a", "b", "c")
    conv.add(text("new"), previous)
    assert ids(conv) == expected


@pytest.mark.parametrize("previous", [ROOT_ITEM_ID, "a", "b"])
def test_the_cache_keeps_exactly_the_positions_before_the_inserted_item(previous):
    conv = conversation("a", "b", "c")
    before = cache_everything(conv)
    conv.add(text("new"), previous)
    after = conv.render().keys
    inserted_at = len(Renderer().text_message("system", "sys")) + {ROOT_ITEM_ID: 0, "a": 4, "b": 8}[previous]
    # the prefill keeps what precedes the new item, and the header tokens it shares with the message it displaced
    assert conv.common_prefix(after) == inserted_at + 2
    assert after[:inserted_at] == before[:inserted_at]
    assert after[inserted_at : inserted_at + 6] == Renderer().text_message("user", "new")


def test_an_item_after_a_dropped_one_goes_first():
    conv = conversation("a", "b", "c")
    conv.dropped.add("old")  # what make_room leaves behind: every dropped item was before every kept one
    conv.add(text("new"), "old")
    assert ids(conv) == ["new", "a", "b", "c"]


def test_bad_positions_and_ids_are_refused_and_change_nothing():
    conv = conversation("a", "b")
    with pytest.raises(UnknownItemError) as err:
        conv.add(text("new"), "ghost")
    assert err.value.param == "previous_item_id"
    with pytest.raises(InvalidInputError, match="reserved") as err:
        conv.add(text(ROOT_ITEM_ID))
    assert err.value.param == "item_id"
    with pytest.raises(InvalidInputError, match="already exists"):
        conv.add(text("a"), ROOT_ITEM_ID)
    assert ids(conv) == ["a", "b"]


def test_while_a_response_runs_only_an_append_is_allowed():
    conv = conversation("a")
    conv.add(ConvItem(id="reply", role="assistant", kind=ItemKind.REPLY, open=True))
    conv.active_response = "resp"
    with pytest.raises(ResponseActiveError) as err:
        conv.add(text("early"), "a")
    assert err.value.param == "previous_item_id"
    with pytest.raises(ResponseActiveError):
        conv.add(text("first"), ROOT_ITEM_ID)
    conv.add(text("next"), "reply")  # after the reply being written: the end, so it joins the next response
    conv.add(text("last"))
    assert ids(conv) == ["a", "reply", "next", "last"]

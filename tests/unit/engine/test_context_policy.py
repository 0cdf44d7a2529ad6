"""The context policy (``ConversationState.make_room``) over a fake renderer (one id per word, no model): which
turns give way, how far a drop goes, what is never dropped, and what a dropped item's later delete or truncate does.
"""

from __future__ import annotations

import pytest

from pipeline.core.conversation_state import ConversationState, ConvItem, ItemKind
from pipeline.errors import ContextLimitError, UnknownItemError


class Renderer:
    """A message is its header (2 ids), one id per word, its footer (1 id)."""

    def header(self, role: str) -> list[int]:
        return [1, {"system": 10, "user": 11, "assistant": 12}[role]]

    def footer(self) -> list[int]:
        return [2]

    def text_message(self, role: str, text: str) -> list[int]:
        return self.header(role) + [100] * len(text.split()) + self.footer()


WORDS_7 = " ".join(["w"] * 7)  # a 10-position message


def conversation(turns: int, *, max_context: int = 100) -> ConversationState:
    """Instructions of 5 positions ("be brief"), then ``turns`` finished turns (user u<i>, reply a<i>, 10 positions
    each), then the turn being answered (user "now", 10 positions) and its open reply (2 positions)."""
    conv = ConversationState("c", Renderer(), instructions="be brief", max_context_tokens=max_context)
    for i in range(turns):
        conv.add(ConvItem(id=f"u{i}", role="user", kind=ItemKind.TEXT, text=WORDS_7))
        conv.add(ConvItem(id=f"a{i}", role="assistant", kind=ItemKind.REPLY, reply_ids=[100] * 7))
    conv.add(ConvItem(id="now", role="user", kind=ItemKind.TEXT, text=WORDS_7))
    conv.add(ConvItem(id="reply", role="assistant", kind=ItemKind.REPLY, open=True))
    return conv


def prompt_len(conv: ConversationState) -> int:
    return len(conv.render().keys)


def ids(conv: ConversationState) -> list[str]:
    return [item.id for item in conv.items]


def test_a_prompt_that_fits_keeps_every_item():
    conv = conversation(4)  # 5 + 80 + 12 = 97 positions
    conv.make_room(3, drop_oldest=True, retention_ratio=0.5)
    assert prompt_len(conv) == 97 and conv.dropped == set()


def test_the_oldest_turns_give_way_down_to_the_retention_ratio():
    conv = conversation(4)  # 97 positions, room beside a 10-token reply: 90
    conv.make_room(10, drop_oldest=True, retention_ratio=0.65)  # target: at most 58 positions
    assert ids(conv) == ["u2", "a2", "u3", "a3", "now", "reply"]
    assert prompt_len(conv) == 57
    assert conv.dropped == {"u0", "a0", "u1", "a1"}
    assert conv.render().keys[:5] == Renderer().text_message("system", "be brief"), "the instructions stay"


def test_a_ratio_of_one_drops_only_what_the_reply_needs():
    conv = conversation(4)
    conv.make_room(10, drop_oldest=True, retention_ratio=1.0)  # 97 -> at most 90: one 10-position turn half
    assert ids(conv) == ["u1", "a1", "u2", "a2", "u3", "a3", "now", "reply"], "whole turns: no reply left orphaned"
    assert prompt_len(conv) == 77


def test_after_a_drop_the_next_turns_fit_without_dropping_again():
    conv = conversation(6, max_context=140)  # 5 + 120 + 12 = 137 positions, room 130
    conv.make_room(10, drop_oldest=True, retention_ratio=0.7)  # target 91
    assert prompt_len(conv) <= 91
    drops = len(conv.dropped)
    for i in range(2):  # each new turn adds 20 positions: two more turns fit in the room the drop freed
        conv.items[-1].open = False
        conv.items[-1].reply_ids = [100] * 7
        conv.add(ConvItem(id=f"next{i}", role="user", kind=ItemKind.TEXT, text=WORDS_7))
        conv.add(ConvItem(id=f"next-reply{i}", role="assistant", kind=ItemKind.REPLY, open=True))
        conv.make_room(10, drop_oldest=True, retention_ratio=0.7)
        assert len(conv.dropped) == drops


def test_the_turn_being_answered_is_never_dropped():
    conv = conversation(2, max_context=60)
    conv.add(ConvItem(id="more", role="user", kind=ItemKind.TEXT, text=WORDS_7))  # the turn: "now" and "more"
    conv.items.append(conv.items.pop(-2))  # the open reply last again
    conv.make_room(10, drop_oldest=True, retention_ratio=0.1)  # target 5: everything droppable goes
    assert ids(conv) == ["now", "more", "reply"]


def test_an_input_that_alone_does_not_fit_fails_naming_sizes_and_drops_nothing():
    conv = conversation(2, max_context=60)
    conv.items[-2].text = " ".join(["w"] * 50)  # the turn being answered: 53 positions
    before = ids(conv)
    message = r"instructions \(5 tokens\) and the input being answered \(55 tokens\) with up to 10 reply tokens.* 60 "
    with pytest.raises(ContextLimitError, match=message):
        conv.make_room(10, drop_oldest=True, retention_ratio=0.8)
    assert ids(conv) == before and conv.dropped == set()


def test_the_error_policy_refuses_and_drops_nothing():
    conv = conversation(4)
    with pytest.raises(ContextLimitError, match="conversation has 97 tokens.*context limit of 100"):
        conv.make_room(10, drop_oldest=False)
    assert len(conv.items) == 10 and conv.dropped == set()


def test_deleting_or_truncating_a_dropped_item_does_nothing():
    conv = conversation(4)
    conv.make_room(10, drop_oldest=True, retention_ratio=0.6)
    conv.items[-1].open = False
    kept = ids(conv)
    conv.truncate_reply("a0", 10)
    conv.delete("u0")
    assert ids(conv) == kept and "u0" not in conv.dropped and "a0" in conv.dropped
    with pytest.raises(UnknownItemError):
        conv.delete("u0")  # forgotten once deleted
    with pytest.raises(UnknownItemError):
        conv.delete("never-there")


def test_a_history_limit_below_the_context_drops_down_to_its_ratio():
    conv = conversation(4, max_context=200)  # 97 positions: the context fits them, a 40-token history limit does not
    conv.make_room(10, drop_oldest=True, retention_ratio=1.0, max_history_tokens=40)
    assert ids(conv) == ["u3", "a3", "now", "reply"], "down to 45 positions (instructions + 40), whole turns"
    assert prompt_len(conv) == 37
    assert conv.dropped == {"u0", "a0", "u1", "a1", "u2", "a2"}


def test_a_history_limit_above_the_context_changes_nothing():
    conv, same = conversation(4), conversation(4)
    conv.make_room(10, drop_oldest=True, retention_ratio=0.65, max_history_tokens=1000)
    same.make_room(10, drop_oldest=True, retention_ratio=0.65)
    assert ids(conv) == ids(same)


def test_the_error_policy_names_the_history_limit():
    conv = conversation(2)  # 52 positions after the instructions
    with pytest.raises(ContextLimitError, match="52 tokens after the instructions, more than its limit of 30"):
        conv.make_room(10, drop_oldest=False, max_history_tokens=30)
    assert conv.dropped == set()
    with pytest.raises(ContextLimitError, match=r"input being answered \(12 tokens\) exceeds .* limit of 10 tokens"):
        conv.make_room(10, drop_oldest=True, max_history_tokens=10)
    assert conv.dropped == set()

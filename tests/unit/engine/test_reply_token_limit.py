"""The reply's text-token limit: one rule (``pipeline.api.reply_token_limit``), used by the engine and the session."""

from __future__ import annotations

import pytest

from pipeline.api import reply_token_limit
from pipeline.errors import InvalidInputError


@pytest.mark.parametrize(
    ("requested", "cap", "limit"),
    [(None, 64, 64), (10, 64, 10), (100, 64, 64), (64, 64, 64), (None, None, None), (7, None, 7)],
)
def test_a_reply_gets_what_it_asked_within_the_engine_cap(requested, cap, limit):
    assert reply_token_limit(requested, cap) == limit


@pytest.mark.parametrize("requested", [0, -3])
def test_a_limit_below_one_is_invalid_input_naming_the_field(requested):
    with pytest.raises(InvalidInputError, match="positive") as caught:
        reply_token_limit(requested, 64)
    assert caught.value.param == "max_output_tokens"

"""``CachedRope``: the rope positions a conversation's cached positions ran at, for the talker's prompt."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.core.cached_rope import CachedRope


def identity(start: int, end: int) -> np.ndarray:
    return np.tile(np.arange(start, end), (3, 1))


def test_nothing_is_stored_while_every_position_is_its_cache_index():
    rope = CachedRope()
    rope.record(0, 10)
    rope.record(10, 1, shift=0)
    rope.record(11, 3, identity(11, 14))  # explicit positions always count
    assert rope.get(0, 11) is not None
    fresh = CachedRope()
    fresh.record(0, 10)
    assert fresh.get(0, 10) is None


def test_explicit_spans_text_shifts_growth_and_rollback():
    rope = CachedRope()
    rope.record(0, 4)
    span = np.array([[4, 4, 4, 4], [4, 4, 5, 5], [4, 5, 4, 5]])
    rope.record(4, 4, span)
    rope.record(8, 2, shift=-2)
    np.testing.assert_array_equal(rope.get(0, 10), np.concatenate([identity(0, 4), span, identity(6, 8)], axis=1))
    rope.record(10, 200, shift=-2)  # grows past the first capacity
    np.testing.assert_array_equal(rope.get(205, 210), identity(203, 208))
    np.testing.assert_array_equal(rope.get(300, 302), identity(300, 302))  # never recorded: the identity
    rope.record(4, 3)  # rolled back to 4 and run again without the picture
    np.testing.assert_array_equal(rope.get(2, 7), identity(2, 7))
    got = rope.get(0, 4)
    got[:] = -1  # a copy
    np.testing.assert_array_equal(rope.get(0, 4), identity(0, 4))
    rope.clear()
    assert rope.get(0, 10) is None
    with pytest.raises(ValueError, match="shape"):
        rope.record(0, 2, identity(0, 3))

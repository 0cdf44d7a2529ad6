"""scripts/context_drop_cost.py: the summary splits the turns that dropped context from the others."""

from __future__ import annotations

from conftest import load_script


def test_summary_separates_drop_turns():
    rows = [(715, 6, 2.8), (1279, 6, 3.7), (7899, 6, 16.5), (6104, 5989, 85.4), (6721, 6, 13.9), (6145, 6030, 150.2)]
    table = load_script("context_drop_cost").summary(rows).splitlines()
    assert table[2] == "| with a drop | 2 | 6010 | 117.8, 150.2 |"
    assert table[3] == "| without | 4 | 6 | 8.8, 16.5 |"

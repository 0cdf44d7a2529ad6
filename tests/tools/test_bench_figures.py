"""scripts/bench_figures.py: BENCHMARKS.md's plots hold the page's own figures (every number of
docs/bench/figures.toml stands in the table it names), are drawn by one command, and are shown on the page."""

from __future__ import annotations

import re

import pytest

from conftest import load_script
from tests.helpers.paths import REPO

PAGE = REPO / "BENCHMARKS.md"
PAIR = re.compile(r"(\d+(?:\.\d+)?) / (\d+(?:\.\d+)?)")


@pytest.fixture(scope="module")
def bench_figures():
    return load_script("bench_figures")


def sections(markdown: str) -> dict[str, list[list[str]]]:
    """Heading -> the cells of the table rows below it, up to the next heading."""
    found: dict[str, list[list[str]]] = {}
    rows: list[list[str]] = []
    for line in markdown.splitlines():
        if heading := re.match(r"^#+ (.+)$", line):
            rows = found.setdefault(heading.group(1).strip(), [])
        elif line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return found


def pairs_in_table(rows: list[list[str]], before: list[str], users: int) -> list[list[tuple[float, float]]]:
    """For each row whose first cells are ``before`` then ``users``: the "a / b" pairs of its other cells."""
    key = [*before, str(users)]
    return [
        [(float(a), float(b)) for a, b in PAIR.findall(" | ".join(row[len(key) :]))]
        for row in rows
        if row[: len(key)] == key
    ]


def test_every_plotted_number_is_in_the_table_it_names(bench_figures):
    import tomllib

    tables = sections(PAGE.read_text(encoding="utf-8"))
    data = tomllib.loads(bench_figures.DATA.read_text(encoding="utf-8"))
    checked = 0
    for figure in data["figure"]:
        for series in figure["series"]:
            assert series["section"] in tables, f"{series['label']}: BENCHMARKS.md has no heading {series['section']}"
            for users, p50, p95 in zip(series["users"], series["p50"], series["p95"], strict=True):
                rows = pairs_in_table(tables[series["section"]], series.get("before", []), users)
                index = series["pair"]
                assert any(len(pairs) > index and pairs[index] == (p50, p95) for pairs in rows), (
                    f"{figure['file']}, {series['label']}, {users} users: {p50} / {p95} is not in the table under "
                    f"'{series['section']}' (rows found: {rows})"
                )
                checked += 1
    assert checked >= 20


def test_the_check_finds_a_number_the_page_does_not_have():
    page = "## Load\n\n| users | TTFA p50 / p95 | v2v |\n|---:|---:|---:|\n| 16 | **73 / 340** | 685 / 933 |\n"
    rows = sections(page)["Load"]
    assert pairs_in_table(rows, [], 16) == [[(73.0, 340.0), (685.0, 933.0)]]
    assert pairs_in_table(rows, [], 4) == []
    assert pairs_in_table(rows, ["1"], 16) == []


def test_one_command_draws_every_figure_the_page_shows(bench_figures, tmp_path):
    figures = bench_figures.read_figures(bench_figures.DATA)
    bench_figures.main(["--out", str(tmp_path)])
    page = PAGE.read_text(encoding="utf-8")
    for figure in figures:
        drawn, committed = tmp_path / figure.file, bench_figures.DATA.parent / figure.file
        assert drawn.read_bytes().startswith(b"\x89PNG") and drawn.stat().st_size > 10_000, figure.file
        assert committed.is_file() and committed.stat().st_size < 100_000, f"{committed} missing or over 100 KB"
        assert f"](docs/bench/{figure.file})" in page, f"BENCHMARKS.md does not show {figure.file}"


def test_a_series_with_a_value_missing_is_refused(bench_figures, tmp_path):
    data = tmp_path / "figures.toml"
    data.write_text(
        '[[figure]]\nfile = "a.png"\ntitle = "t"\nylabel = "ms"\n'
        '[[figure.series]]\nlabel = "ours"\nusers = [1, 4]\np50 = [1, 2]\np95 = [3]\n'
    )
    with pytest.raises(ValueError, match="1 p95 for 2 levels"):
        bench_figures.read_figures(data)

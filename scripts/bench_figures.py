"""BENCHMARKS.md's plots: one PNG per ``[[figure]]`` of a figures file (``docs/bench/figures.toml``, whose numbers
are copied from the page's tables), drawn by the bench's own plotting code (:mod:`realtime.bench.report`), as a run's
``ttfa_vs_concurrency.png`` is.

    python scripts/bench_figures.py                 # docs/bench/figures.toml -> docs/bench/*.png

Needs the ``bench`` extra (matplotlib)."""

from __future__ import annotations

import argparse
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the repository, when not installed

from realtime.bench.report import (  # noqa: E402
    PERCENTILE_STYLES,
    PercentileSeries,
    percentile_figure,
    pyplot,
    save_figure,
)

DATA = REPO / "docs" / "bench" / "figures.toml"


@dataclass(frozen=True)
class Figure:
    """One PNG: its series against the number of users."""

    file: str
    title: str
    ylabel: str
    series: list[PercentileSeries]
    log_y: bool = False
    line_at: float | None = None


def read_figures(path: Path) -> list[Figure]:
    """The figures of a figures file; a series' percentile list must have one value per level of its ``users``."""
    figures = []
    for fig in tomllib.loads(path.read_text(encoding="utf-8"))["figure"]:
        series = []
        for s in fig["series"]:
            values = {q: s[q] for q in PERCENTILE_STYLES if q in s}
            for q, ys in values.items():
                if len(ys) != len(s["users"]):
                    raise ValueError(f"{path}: {fig['file']}, {s['label']}: {len(ys)} {q} for {len(s['users'])} levels")
            series.append(PercentileSeries(s["label"], s["users"], values, s.get("color")))
        figures.append(
            Figure(fig["file"], fig["title"], fig["ylabel"], series, fig.get("log_y", False), fig.get("line_at"))
        )
    return figures


def draw(figures: list[Figure], out: Path) -> list[Path]:
    """Each figure written to ``out/<file>``; returns the paths."""
    plt = pyplot()
    paths = []
    for figure in figures:
        fig = percentile_figure(plt, figure.series, figure.ylabel, log_y=figure.log_y, line_at=figure.line_at)
        # a page's figure has more series than a run's: the legend goes beside the axes, not over the lines
        fig.axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
        fig.set_size_inches(8.5, 4)
        save_figure(plt, fig, out / figure.file, figure.title)
        paths.append(out / figure.file)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="the figures file (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="where the PNGs go (default: beside the figures file)")
    args = parser.parse_args(argv)
    out = args.out or args.data.parent
    out.mkdir(parents=True, exist_ok=True)
    for path in draw(read_figures(args.data), out):
        print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()

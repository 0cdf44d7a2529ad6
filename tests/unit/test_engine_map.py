"""docs/engine.md's module map (the block under "## The layout") matches the tree under ``pipeline/``: every module and
packaged file is named there, and every name there exists.

The map's grammar: one entry a line, ``<indent><name>  <what it holds>``, its indent two spaces per folder level; a
line indented past ``ENTRY_INDENT_MAX`` continues the description above it. A folder entry either has entries of its
own on the lines below or names its files in its description (``a.py (...), b.py, c.py``); both may be mixed."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

ENGINE_DOC = REPO / "docs" / "engine.md"
ROOT = "pipeline/"
ENTRY_INDENT_MAX = 12
ENTRY = re.compile(r"^(?P<indent> *)(?P<name>[\w.]+/|[\w.]+\.(?:py|yaml))(?: {2,}(?P<what>.*))?$")
FILE_NAME = re.compile(r"(?<![\w.])([\w]+\.(?:py|yaml))\b")
MAPPED_SUFFIXES = (".py", ".yaml")


@dataclass
class ModuleMap:
    """What a map names, as paths relative to the repository: files (``pipeline/x/y.py``) and folders
    (``pipeline/x/``)."""

    files: list[str]
    folders: list[str]


def layout_block(doc: str) -> list[str]:
    """The lines of the first fenced block after the "## The layout" heading."""
    after = doc.split("\n## The layout\n", 1)
    if len(after) != 2:
        raise ValueError("no '## The layout' section")
    match = re.search(r"^```\n(.*?)^```$", after[1], re.S | re.M)
    if match is None:
        raise ValueError("no fenced block under '## The layout'")
    return match.group(1).splitlines()


def parse_map(lines: list[str]) -> ModuleMap:
    """Parse the map's lines (see the module docstring); a line that fits the grammar nowhere raises ValueError."""
    if not lines or lines[0].rstrip() != ROOT:
        raise ValueError(f"the map must start with {ROOT!r}")
    files: list[str] = []
    folders: list[str] = [ROOT]
    stack = [ROOT]  # stack[k]: the folder whose entries sit at indent 2 * k
    last_folder: str | None = None  # the folder entry whose description a continuation line extends
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent > ENTRY_INDENT_MAX:
            if last_folder is not None:
                files += [last_folder + name for name in FILE_NAME.findall(line)]
            continue
        entry = ENTRY.match(line)
        if entry is None or indent % 2 or not 0 < indent // 2 <= len(stack):
            raise ValueError(f"map line {number} is neither an entry nor a continuation: {line!r}")
        del stack[indent // 2 :]
        path = stack[-1] + entry["name"]
        what = entry["what"] or ""
        if path.endswith("/"):
            folders.append(path)
            stack.append(path)
            last_folder = path
            files += [path + name for name in FILE_NAME.findall(what)]
        else:
            files.append(path)
            last_folder = None
    return ModuleMap(files=files, folders=folders)


def needs_naming(path: Path) -> bool:
    """Whether the map must name this file: every module and packaged file, except a package's ``__init__.py`` that
    holds nothing but its docstring."""
    if path.suffix not in MAPPED_SUFFIXES or "__pycache__" in path.parts:
        return False
    if path.name != "__init__.py":
        return True
    body = ast.parse(path.read_text()).body
    return not (len(body) <= 1 and all(isinstance(node, ast.Expr) for node in body))


@pytest.fixture(scope="module")
def engine_map() -> ModuleMap:
    return parse_map(layout_block(ENGINE_DOC.read_text()))


def test_every_name_in_the_map_exists(engine_map: ModuleMap) -> None:
    missing = [f for f in engine_map.files if not (REPO / f).is_file()]
    missing += [d for d in engine_map.folders if not (REPO / d).is_dir()]
    assert not missing, f"docs/engine.md's map names what the tree does not hold: {missing}"


def test_every_module_under_pipeline_is_in_the_map(engine_map: ModuleMap) -> None:
    tree = sorted(p.relative_to(REPO).as_posix() for p in (REPO / ROOT).rglob("*") if p.is_file() and needs_naming(p))
    unnamed = sorted(set(tree) - set(engine_map.files))
    assert not unnamed, f"docs/engine.md's map does not name: {unnamed}"


def test_the_map_names_each_file_once(engine_map: ModuleMap) -> None:
    twice = sorted({f for f in engine_map.files if engine_map.files.count(f) > 1})
    assert not twice, f"docs/engine.md's map names these twice: {twice}"


def test_the_parser_reads_entries_inline_lists_and_continuations() -> None:
    sample = [
        "pipeline/",
        "  api.py                   the Protocols, never tensors",
        "  step/",
        "    phases.py              StepPhases: runs a plan",
        "  kernels/                 cuda_graphs.py (CapturedCall), sdpa.py",
        "                           noise.py",
        "  models/",
        "    family.py              the protocol; see common.py for more",  # a module's description names no files
        "    common/                chatml.py (its renderer), bpe.py,",
        "                           log_mel.py (incremental)",
        "  errors.py                PipelineError",
    ]
    parsed = parse_map(sample)
    assert parsed.files == [
        "pipeline/api.py",
        "pipeline/step/phases.py",
        "pipeline/kernels/cuda_graphs.py",
        "pipeline/kernels/sdpa.py",
        "pipeline/kernels/noise.py",
        "pipeline/models/family.py",
        "pipeline/models/common/chatml.py",
        "pipeline/models/common/bpe.py",
        "pipeline/models/common/log_mel.py",
        "pipeline/errors.py",
    ]
    assert parsed.folders == [
        "pipeline/",
        "pipeline/step/",
        "pipeline/kernels/",
        "pipeline/models/",
        "pipeline/models/common/",
    ]
    with pytest.raises(ValueError, match="line 2"):
        parse_map(["pipeline/", "   odd.py   three spaces in"])

"""Each public class name is defined once in ``pipeline/`` and ``realtime/``: a protocol keeps the concept's name and
its implementations get specific ones (a family's takes the family's prefix, ``Qwen25Omni...`` / ``Qwen3Omni...``), so
an import or a search for a name finds one class. Public: a top-level ``class`` statement of a module whose name does
not start with ``_``; a re-export (an import) is not a definition."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.helpers.paths import REPO

PACKAGES = ("pipeline", "realtime")


def public_classes(root: Path, packages: tuple[str, ...]) -> dict[str, list[str]]:
    """Public class name -> the modules (paths relative to ``root``, sorted) whose top level defines it, over every
    ``.py`` file under ``root/<package>`` for each of ``packages``."""
    found: dict[str, list[str]] = defaultdict(list)
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in tree.body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    found[node.name].append(path.relative_to(root).as_posix())
    return dict(found)


def duplicates(classes: dict[str, list[str]]) -> dict[str, list[str]]:
    """The names of ``classes`` defined in more than one module (or twice in one)."""
    return {name: modules for name, modules in classes.items() if len(modules) > 1}


def test_each_public_class_name_is_defined_once():
    classes = public_classes(REPO, PACKAGES)
    assert len(classes) > 200 and "ModelFamily" in classes, "the walk sees pipeline/ and realtime/"
    found = {name: modules for name, modules in duplicates(classes).items()}
    assert not found, "public class names defined in several modules (rename the implementation, or merge):\n" + (
        "\n".join(f"{name}: {', '.join(modules)}" for name, modules in sorted(found.items()))
    )


def test_the_walk_finds_top_level_public_classes_only(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg.a import Shared\n")
    (package / "a.py").write_text("class Shared:\n    class Inner: ...\n\nclass _Private: ...\n\nclass Once: ...\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text(
        "from typing import Protocol\n\nclass Shared(Protocol): ...\n\nclass _Private: ...\n\n"
        "def f():\n    class Once: ...\n"
    )
    classes = public_classes(tmp_path, ("pkg",))
    assert classes == {"Shared": ["pkg/a.py", "pkg/sub/b.py"], "Once": ["pkg/a.py"]}
    assert duplicates(classes) == {"Shared": ["pkg/a.py", "pkg/sub/b.py"]}

"""Import structure: no import cycles among the first-party packages, no module outside a model family's folder
imports the family, serving never loads the benchmark, and no test file imports another (shared helpers live in
``tests/helpers/``)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.imports import cycles, import_graph, imported_modules, module_files, one_cycle
from tests.helpers.paths import REPO

FIRST_PARTY = ("pipeline", "realtime")


def test_the_first_party_packages_have_no_import_cycles():
    graph = import_graph(REPO, FIRST_PARTY)
    assert len(graph) > 50 and sum(map(len, graph.values())) > 100, "the graph of pipeline/ and realtime/"
    found = [" -> ".join(one_cycle(graph, component)) for component in cycles(graph)]
    assert not found, "import cycles (module-level, TYPE_CHECKING and function-level imports count):\n" + "\n".join(
        found
    )


def test_the_cycle_finder_sees_every_kind_of_import(tmp_path):
    """Module-level, ``from . import``, ``TYPE_CHECKING`` and function-level imports all make edges."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub.c import C\n")
    (package / "sub" / "c.py").write_text("def later():\n    from ..a import thing\n")
    (package / "sub" / "d.py").write_text("import pkg.sub.c\nfrom . import e\n")
    (package / "sub" / "e.py").write_text("X = 1\n")
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.sub.c"} and graph["pkg.sub.c"] == {"pkg.a"}
    assert graph["pkg.sub.d"] == {"pkg.sub.c", "pkg.sub.e"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    assert one_cycle(graph, ["pkg.a", "pkg.b", "pkg.sub.c"]) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]


def family_packages(root: Path) -> set[str]:
    """The model families' packages: every package under ``pipeline/models/`` but ``common`` (shared code)."""
    models = root / "pipeline" / "models"
    return {
        f"pipeline.models.{p.name}" for p in models.iterdir() if (p / "__init__.py").exists() and p.name != "common"
    }


def foreign_family_imports(graph: dict[str, set[str]], families: set[str]) -> list[str]:
    """``module -> imported`` for each import of a family's module by a module outside that family's package."""

    def family(name: str) -> str | None:
        return next((f for f in families if name == f or name.startswith(f + ".")), None)

    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if family(target) is not None and family(target) != family(module)
    )


def test_only_a_family_imports_its_own_modules():
    """The engine and the server reach a model family through :mod:`pipeline.models` (``family_of``) and the
    protocols of :mod:`pipeline.models.family`; no module of pipeline/ or realtime/ outside a family's folder imports
    it, another family's included (what families share lives in ``pipeline/models/common/``). The registry names
    families in strings, which are not imports. Tests may import a family."""
    graph = import_graph(REPO, FIRST_PARTY)
    families = family_packages(REPO)
    assert "pipeline.models.qwen2_5_omni" in families and "pipeline.models.common" not in families
    inside = [t for m, ts in graph.items() if m.startswith("pipeline.models.qwen2_5_omni.") for t in ts]
    assert any(t.startswith("pipeline.models.qwen2_5_omni.") for t in inside), "the graph sees a family's own imports"
    found = foreign_family_imports(graph, families)
    assert not found, "modules outside a family import it (ask the family object instead):\n" + "\n".join(found)


def test_foreign_family_imports_are_found():
    families = {"pipeline.models.a", "pipeline.models.b"}
    graph = {
        "pipeline.models.a.x": {"pipeline.models.a.y", "pipeline.models.common.z"},
        "pipeline.models.b": {"pipeline.models.a.x"},
        "pipeline.core.engine_core": {"pipeline.models", "pipeline.models.b"},
        "realtime.cli.main": {"pipeline.models.family"},
    }
    assert foreign_family_imports(graph, families) == [
        "pipeline.core.engine_core -> pipeline.models.b",
        "pipeline.models.b -> pipeline.models.a.x",
    ]


SERVE_PROBE = """
import json, sys
import uvicorn
import realtime.cli.main

def probe(self, *args, **kwargs):  # in place of uvicorn's run: the engine and the app are built by now
    print("PROBE " + json.dumps(sorted(m for m in sys.modules if m.startswith("realtime.bench"))), flush=True)

uvicorn.Server.run = probe
sys.exit(realtime.cli.main.main(sys.argv[1:]))
"""

IMPORT_PROBE = """
import json, sys
import realtime.cli.main, realtime.server.app
realtime.cli.main.server_config(realtime.cli.main.build_parser().parse_args(["serve"]))
before = sorted(m for m in sys.modules if m.startswith("realtime.bench"))
import realtime.bench.cli  # the probe sees the benchmark when it is there
print("PROBE " + json.dumps([before, "realtime.bench.cli" in sys.modules]), flush=True)
"""


def _probe(code: str, *args: str) -> object:
    env = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=180
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert done.returncode == 0 and len(lines) == 1, done.stdout + done.stderr
    return json.loads(lines[0].removeprefix("PROBE "))


def test_importing_the_server_and_the_serve_parser_loads_no_benchmark_module():
    before, seen = _probe(IMPORT_PROBE)
    assert before == [] and seen


@pytest.mark.slow
def test_omni_realtime_serve_loads_no_benchmark_module(tiny_model_dir, tmp_path):
    loaded = _probe(
        SERVE_PROBE,
        "--log-level",
        "WARNING",
        "serve",
        "--model",
        str(tiny_model_dir),
        "--cache-dir",
        str(tmp_path),
        "--port",
        "0",
        "--no-webrtc",
    )
    assert loaded == []


def test_no_test_file_imports_another():
    """Test files share code through ``tests/helpers/`` (and ``tests/fakes.py``), never through each other:
    a test module imported by name is a second copy of the one pytest collected (its module-level code
    runs twice, its globals are other objects), and one file's tests come to depend on another's. A
    script a test runs in a subprocess counts too, even when it imports its own test file."""
    modules = module_files(REPO, ["tests"])
    test_files = {name for name, path in modules.items() if path.name.startswith("test_")}  # at any depth
    assert len(test_files) > 40
    offenders = {}
    for name, path in modules.items():
        imported = (imported_modules(path, name, modules) & test_files) | _test_modules_in_strings(path, test_files)
        if imported:
            offenders[str(path.relative_to(REPO))] = sorted(imported)
    assert not offenders, f"test files imported by other code (move what they share to tests/helpers/): {offenders}"


def _test_modules_in_strings(path: Path, test_files: set[str]) -> set[str]:
    """Test modules that the string constants of ``path`` (scripts run in a subprocess) import."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value:
            found |= {name for name in test_files if f"{name} import" in node.value or f"import {name}" in node.value}
    return found


PROTOCOL_MAY_IMPORT = (
    "realtime.protocol",
    "realtime.errors",
    "realtime.ids",
    "pipeline.api",
    "pipeline.tools",
    "pipeline.response_events",
    "pipeline.errors",
)


def test_the_protocol_models_import_no_server_module():
    """``realtime.protocol`` is pure data and validation: it reaches no VAD, codec, session or server module (and so
    none of torch, soxr or starlette), transitively."""
    graph = import_graph(REPO, FIRST_PARTY)
    seen: set[str] = set()
    todo = [m for m in graph if m.startswith("realtime.protocol")]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    outside = sorted(m for m in seen if not m.startswith(PROTOCOL_MAY_IMPORT))
    assert not outside, f"realtime.protocol reaches {outside}"

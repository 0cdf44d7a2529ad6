"""Packaging: each extra of pyproject.toml declares what the code it serves imports.

Read from source (nothing is imported, nothing installed): every first-party module belongs to one part of the
install, the base dependencies or one extra (:data:`PARTS`). A part's third-party imports (module- or
function-level) must each be provided by a distribution that the part's extra declares, directly or through the
extras it includes and the base dependencies; ``importlib.metadata.packages_distributions()`` names the
distribution behind an import. A module-level first-party import may only reach a module of a part the extra
installs, so that importing the part's code loads nothing another extra brings. An import inside
``try: ... except ImportError`` is optional (the code runs without it) and is not checked.

Then installed (slow, :func:`test_each_extra_installed_alone_imports_and_runs_what_it_serves`): each extra alone, with
torch, in a fresh venv without system site-packages (tests/helpers/extra_installs.py), imports every module of the
parts it installs and runs its commands, so a dependency that only another extra or this machine brings fails there.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Collection, Iterator, Mapping
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.helpers.extra_installs import ExtraCheck, ExtraInstalls
from tests.helpers.imports import absolute_module, module_files
from tests.helpers.paths import REPO

PROJECT = "omni-realtime"
BASE = ""  # the part the plain install serves

# module prefix -> the part that serves it; the longest matching prefix wins
PARTS = {
    "pipeline": BASE,
    "realtime": "server",
    "realtime.media.video": "webrtc",
    "realtime.transports.webrtc": "webrtc",  # the package: endpoint, call, transport, lifecycle, media
    "realtime.transports.peer": "webrtc",
    "realtime.transports.media": "webrtc",
    "realtime.transports.media_workers": "webrtc",
    "realtime.transports.opus_packets": "webrtc",
    "realtime.transports.receive_buffer": "webrtc",
    "realtime.bench": "bench",
    "realtime.deploy.ray_serve": "ray",
}

# imported by name but tested for before use (CUDA builds of torch ship Triton; the kernels check it is there)
OPTIONAL = {"triton"}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(pyproject: Mapping) -> dict[str, set[str]]:
    """Extra (``""`` for the base) -> the distributions it installs: its own requirements, those of the extras it
    includes (``omni-realtime[...]``), and the base dependencies."""
    project = pyproject["project"]
    own = {BASE: [Requirement(r) for r in project["dependencies"]]}
    own |= {extra: [Requirement(r) for r in reqs] for extra, reqs in project["optional-dependencies"].items()}

    def closure(extra: str, seen: frozenset[str]) -> set[str]:
        found = set()
        for req in own[extra] + (own[BASE] if extra != BASE else []):
            if normalized(req.name) == PROJECT:
                assert not req.extras & seen, f"extras include each other in a cycle: {extra} -> {req.extras}"
                for included in req.extras:
                    found |= closure(included, seen | {included})
            else:
                found.add(normalized(req.name))
        return found

    return {extra: closure(extra, frozenset({extra})) for extra in own}


def part_of(module: str, parts: Mapping[str, str] = PARTS) -> str:
    matches = [p for p in parts if module == p or module.startswith(p + ".")]
    assert matches, f"{module} is in no part of the install: add it to PARTS"
    return parts[max(matches, key=len)]


def imports(path: Path, module: str, modules: Collection[str]) -> Iterator[tuple[str, bool]]:
    """``(imported module, at module level)`` for each import of ``module``'s source that is not optional;
    ``from package import name`` imports ``package.name`` when that is one of ``modules``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST, top: bool) -> Iterator[tuple[str, bool]]:
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            for child in node.handlers + node.orelse + node.finalbody:
                yield from visit(child, top)
            return
        if isinstance(node, ast.Import):
            yield from ((alias.name, top) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = absolute_module(node.module, node.level, module, is_package)
            for alias in node.names:
                yield (f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base), top
        inner = top and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            yield from visit(child, inner)

    yield from visit(tree, True)


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names)


def missing(
    pyproject: Mapping, modules: Mapping, providers: Mapping[str, list[str]], parts: Mapping[str, str] = PARTS
) -> list[str]:
    """One line per import that the extra serving the importing module does not install."""
    installs = declared(pyproject)
    found = set()
    for module, path in modules.items():
        part = part_of(module, parts)
        label = f"[{part}]" if part else "the base install"
        for name, top_level in imports(path, module, modules):
            root = name.split(".")[0]
            if root in modules or root in ("pipeline", "realtime", "web_demo"):
                needed = part_of(name, parts) if name in modules else part
                if top_level and needed != part and not declared_includes(installs, part, needed):
                    found.add(f"{module} imports {name} (part [{needed}]) at module level; {label} lacks it")
            elif root not in OPTIONAL and root not in sys.stdlib_module_names:
                dists = {normalized(d) for d in providers.get(root, ())}
                if not dists:
                    found.add(f"{module} imports {root}, which no installed distribution provides")
                elif not dists & installs[part]:
                    found.add(f"{module} imports {root} (from {sorted(dists)}); {label} does not declare it")
    return sorted(found)


def declared_includes(installs: Mapping[str, set[str]], extra: str, other: str) -> bool:
    """Whether installing ``extra`` installs everything ``other`` declares."""
    return installs[other] <= installs[extra]


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_extra_declares_what_its_code_imports():
    modules = module_files(REPO, ["pipeline", "realtime"])
    assert {part_of(m) for m in modules} == set(PARTS.values()), "every part serves some module"
    found = missing(pyproject(), modules, packages_distributions())
    assert not found, "pyproject.toml: an extra lacks what its code imports:\n" + "\n".join(found)


def test_a_missing_declaration_is_found(tmp_path):
    """The check fails on the case a new user met: a server module imports PIL, which only [bench] brought."""
    package = tmp_path / "realtime"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "images.py").write_text("from PIL import Image\n")
    (package / "bench.py").write_text("import matplotlib\n")
    (package / "server.py").write_text("def later():\n    import realtime.bench\nfrom realtime import images\n")
    (package / "peer.py").write_text("import aiortc\n")
    optional_av = "try:\n    import av\nexcept ImportError:\n    av = None\n"
    (package / "eager.py").write_text("from realtime import peer\n" + optional_av)
    toml = {
        "project": {
            "dependencies": ["numpy>=1"],
            "optional-dependencies": {
                "server": ["starlette"],
                "webrtc": ["omni-realtime[server]", "aiortc"],
                "bench": ["matplotlib>=3", "tqdm"],
            },
        }
    }
    parts = {"realtime": "server", "realtime.bench": "bench", "realtime.peer": "webrtc"}
    providers = {"PIL": ["pillow"], "matplotlib": ["matplotlib"], "aiortc": ["aiortc"], "av": ["av"]}
    found = missing(toml, module_files(tmp_path, ["realtime"]), providers, parts)
    assert found == [
        "realtime.eager imports realtime.peer (part [webrtc]) at module level; [server] lacks it",
        "realtime.images imports PIL (from ['pillow']); [server] does not declare it",
    ]
    assert declared(toml)["webrtc"] == {"starlette", "aiortc", "numpy"}


def test_a_plain_server_install_serves_semantic_vad():
    """``[server]`` brings the turn model (the ``turn`` extra: the pipecat-ai wheel that ships Smart Turn v3.2, and
    onnxruntime), so that ``semantic_vad``, the demo's default, is served by the model and not by silence alone."""
    installs = declared(pyproject())
    assert {"pipecat-ai", "onnxruntime"} <= installs["server"]
    assert declared_includes(installs, "server", "turn")


def included_extras(pyproject: Mapping, extra: str) -> set[str]:
    """The parts installing ``extra`` brings: itself, the base and the extras it includes (``omni-realtime[...]``),
    transitively."""
    found, todo = {BASE, extra}, [extra]
    while todo:
        for requirement in pyproject["project"]["optional-dependencies"].get(todo.pop(), []):
            req = Requirement(requirement)
            if normalized(req.name) == PROJECT:
                todo += sorted(req.extras - found)
                found |= req.extras
    return found


# what each extra must make work beyond importing its modules: its commands (run in the venv, from the repository)
COMMANDS = {
    "server": (("omni-realtime", "serve", "--help"),),
    "webrtc": (("omni-realtime", "serve", "--help"),),
    "bench": (("omni-realtime", "bench", "--help"),),
    # the suite's every module imported, its pytest plugins there (an unknown ini option is an error) and the linter
    "dev": (
        ("python", "-m", "pytest", "-W", "error::pytest.PytestConfigWarning", "--collect-only", "-q")
        + ("-p", "no:cacheprovider", "-m", "not background"),
        ("ruff", "--version"),
    ),
}


def extra_checks() -> list[ExtraCheck]:
    """One check per extra and one for the plain install: every module of the parts it installs, its commands."""
    toml = pyproject()
    modules = module_files(REPO, ["pipeline", "realtime"])
    extras = [BASE, *toml["project"]["optional-dependencies"]]
    return [
        ExtraCheck(
            extra,
            tuple(m for m in modules if part_of(m) in included_extras(toml, extra)),
            COMMANDS.get(extra, ()),
        )
        for extra in extras
    ]


EXTRA_CHECKS = extra_checks()
EXTRA_INSTALLS = ExtraInstalls(EXTRA_CHECKS, timeout_s=900)


@pytest.mark.slow
@pytest.mark.install
@pytest.mark.timeout(EXTRA_INSTALLS.timeout_s + 60)
@pytest.mark.background(EXTRA_INSTALLS)
@pytest.mark.parametrize("check", EXTRA_CHECKS, ids=lambda c: c.extra or "base")
def test_each_extra_installed_alone_imports_and_runs_what_it_serves(check, request):
    """A fresh venv holding torch and ``.[extra]`` alone (tests/helpers/extra_installs.py) imports every module of
    the parts the extra installs and runs its commands: a dependency the extra leaves out fails here."""
    result = EXTRA_INSTALLS.result(request.config, check.extra)
    assert result.installed, f"torch and .[{check.extra}] alone do not install: {result.install_error}"
    assert not result.failed_imports, f".[{check.extra}] alone cannot import:\n" + "\n".join(
        f"{m}: {e}" for m, e in result.failed_imports.items()
    )
    assert not result.failed_commands, f".[{check.extra}] alone cannot run:\n" + "\n".join(
        f"{c}: {e}" for c, e in result.failed_commands.items()
    )


def test_an_extra_brings_the_parts_of_the_extras_it_includes():
    toml = {
        "project": {
            "optional-dependencies": {
                "server": ["starlette"],
                "webrtc": ["omni-realtime[server]", "aiortc"],
                "bench": ["omni-realtime[webrtc]", "matplotlib"],
                "dev": ["omni-realtime[bench,server]", "pytest"],
            }
        }
    }
    assert included_extras(toml, "bench") == {BASE, "server", "webrtc", "bench"}
    assert included_extras(toml, "server") == {BASE, "server"}
    assert included_extras(toml, BASE) == {BASE}
    assert included_extras(toml, "dev") == {BASE, "server", "webrtc", "bench", "dev"}

"""Packaging: each extra of pyproject.toml declares what the code it serves imports.

Read from source (nothing is imported, nothing installed): every first-party module belongs to one part of the
install, the base dependencies or one extra (:data:`PARTS`). A part's third-party imports (module- or
function-level) must each be provided by a distribution that the part's extra declares, directly or through the
extras it includes and the base dependencies; ``importlib.metadata.packages_distributions()`` names the
distribution behind an import. A module-level first-party import may only reach a module of a part the extra
installs, so that importing the part's code loads nothing another extra brings. An import inside
``try: ... except ImportError`` is optional (the code runs without it) and is not checked.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Collection, Iterator, Mapping
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement

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

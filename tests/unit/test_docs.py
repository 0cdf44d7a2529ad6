"""The repository's documents stand on their own: every relative link resolves inside the repository, and the
README's test command is the one CI runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

DOCS = sorted([*REPO.glob("*.md"), *(REPO / "docs").glob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve_inside_the_repository(doc: Path) -> None:
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(REPO.resolve()), f"{doc.name} links outside the repository: {target}"
        assert path.exists(), f"{doc.name} links a missing file: {target}"
    assert "DESIGN.md" not in doc.read_text(), f"{doc.name} refers to a document outside the repository"


def test_the_readme_test_command_is_what_ci_runs() -> None:
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    readme = (REPO / "README.md").read_text()
    command = ci.replace("pip install -q ", "pip install ")
    assert f"```bash\n{command}\n```" in readme

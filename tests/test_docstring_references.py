"""The package cites only files that exist: every ``docs/…``, ``deploy/…`` and
``scripts/…`` path named in predictive_scaler/ is in the repository, and no design document
outside it is cited."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "predictive_scaler"
#: A repository path the package may cite: docs/planner.md, deploy/base/crd.yaml, scripts/x.sh.
CITED = re.compile(r"\b(?:docs|deploy|scripts)/[A-Za-z0-9_./-]*[A-Za-z0-9_]")


def cited_paths(text: str) -> list[str]:
    return CITED.findall(text)


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".proto", ".pyi") and p.is_file())


@pytest.mark.parametrize(("text", "found"), [
    pytest.param("see docs/planner.md for every reason", ["docs/planner.md"], id="doc"),
    pytest.param("(deploy/base/rbac-controller.yaml)", ["deploy/base/rbac-controller.yaml"], id="in-parentheses"),
    pytest.param("derived: docs/kube-api-calls.md.", ["docs/kube-api-calls.md"], id="sentence-end"),
    pytest.param("the backtest's docs", [], id="no-path"),
])
def test_cited_paths_are_found(text: str, found: list[str]) -> None:
    assert cited_paths(text) == found


def test_the_scan_reads_the_package() -> None:
    # The scan would pass vacuously if it found no sources or no citations.
    sources = _sources()
    assert len(sources) > 50
    assert any(cited_paths(p.read_text(encoding="utf-8")) for p in sources)


def test_every_cited_file_exists() -> None:
    missing = [
        f"{source.relative_to(ROOT)}:{n}: {path}"
        for source in _sources()
        for n, line in enumerate(source.read_text(encoding="utf-8").splitlines(), start=1)
        for path in cited_paths(line)
        if not (ROOT / path).exists()
    ]
    assert not missing, "the package cites files that are not in the repository:\n" + "\n".join(missing)


def test_no_design_document_outside_the_repository_is_cited() -> None:
    # `grep -rn DESIGN predictive_scaler`: the design notes are not shipped, so nothing may cite them.
    hits = [
        f"{source.relative_to(ROOT)}:{n}"
        for source in _sources()
        for n, line in enumerate(source.read_text(encoding="utf-8").splitlines(), start=1)
        if "DESIGN" in line
    ]
    assert not hits, hits


def how_it_decides(readme: str) -> str:
    """The README's "How it decides" section."""
    start = readme.index("## How it decides")
    end = readme.find("\n## ", start + 1)
    return readme[start:end if end >= 0 else None]


#: A module or part named in backticks: `reconcile.py`, `kube/client.py`, `policy/`.
NAMED = re.compile(r"`((?:[a-z_]+/)*(?:[a-z_]+\.py|[a-z_]+/))`")


def _exists_in_package(name: str) -> bool:
    if (PACKAGE / name.removeprefix("predictive_scaler/")).exists():
        return True
    # A bare module name in a sentence about one part (`transport.py` under kube/).
    return "/" not in name.rstrip("/") and any(PACKAGE.rglob(name.rstrip("/")))


def test_the_readme_names_the_parts_as_they_are() -> None:
    named = NAMED.findall(how_it_decides((ROOT / "README.md").read_text(encoding="utf-8")))
    named += NAMED.findall((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert len(named) > 10, named  # the section names its parts; the scan found them
    missing = sorted({name for name in named if not _exists_in_package(name)})
    assert not missing, f"README 'How it decides' or docs/architecture.md names modules not in predictive_scaler/: {missing}"

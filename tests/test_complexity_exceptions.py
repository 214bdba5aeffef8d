"""Every complexity exception `make lint` allows is listed, with its reason, in docs/development.md.

ruff's C901 (max complexity 15) and PLR0915 (too many statements) run on the whole tree; a
``# noqa`` for either on a function that the list does not name fails here, and so does a
listed exception that no longer exists.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RULES = ("C901", "PLR0915")
LISTED = re.compile(r"^- `(?P<path>[^`]+)` `(?P<name>[^`]+)` \((?P<rules>[^)]+)\): \S", re.M)


def _exceptions_in_code() -> dict[tuple[str, str], set[str]]:
    found: dict[tuple[str, str], set[str]] = {}
    for top in ("predictive_scaler", "benchmarks", "tests", "backtests", "scripts"):
        for path in sorted((ROOT / top).rglob("*.py")):
            lines = path.read_text().splitlines()
            tree = ast.parse("\n".join(lines))
            owners = {id(child): parent.name for parent in ast.walk(tree) if isinstance(parent, ast.ClassDef)
                      for child in parent.body}
            for node in ast.walk(tree):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    continue
                noqa = lines[node.lineno - 1].partition("# noqa:")[2]
                rules = {r for r in RULES if r in noqa}
                if rules:
                    owner = owners.get(id(node))
                    name = f"{owner}.{node.name}" if owner else node.name
                    found[(str(path.relative_to(ROOT)), name)] = rules
    return found


def _exceptions_listed() -> dict[tuple[str, str], set[str]]:
    text = (ROOT / "docs" / "development.md").read_text().split("## Complexity exceptions", 1)[1]
    return {(m["path"], m["name"]): {r.strip() for r in m["rules"].split(",")} for m in LISTED.finditer(text)}


def test_every_complexity_exception_is_listed_with_its_reason() -> None:
    in_code, listed = _exceptions_in_code(), _exceptions_listed()
    assert in_code, "no exception found: the scan is broken"
    flat_code = {(path, name, rule) for (path, name), rules in in_code.items() for rule in rules}
    flat_listed = {(path, name, rule) for (path, name), rules in listed.items() for rule in rules}
    assert flat_code == flat_listed, {"in code, not listed": sorted(flat_code - flat_listed),
                                      "listed, not in code": sorted(flat_listed - flat_code)}


def test_lint_checks_complexity() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'select = \[[^\]]*"C901"', pyproject) and re.search(r'select = \[[^\]]*"PLR0915"', pyproject)
    assert re.search(r"max-complexity = 15\b", pyproject)

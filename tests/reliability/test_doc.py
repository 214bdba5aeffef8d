"""docs/reliability.md is the rendering of the scenario table, and every row names a test that exists."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.reliability.render_doc import DOC, render
from tests.reliability.scenarios import SCENARIOS

HERE = Path(__file__).parent


def test_doc_is_the_rendered_table() -> None:
    assert DOC.read_text() == render(), (
        "docs/reliability.md is stale: run `python -m tests.reliability.render_doc > docs/reliability.md`")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_every_row_names_an_existing_test(scenario) -> None:  # type: ignore[no-untyped-def]
    module, _, function = scenario.test.partition("::")
    tree = ast.parse((HERE / module).read_text())
    assert function in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_ids_are_unique() -> None:
    assert len({s.id for s in SCENARIOS}) == len(SCENARIOS)

"""The suite's own bookkeeping: the markers of what a test needs are the same in pyproject, the
Makefile and tests/support/markers.py, `-m` leaves out exactly the modules it must, and the
Hypothesis profiles scale a pinned example count."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support import markers, profiles

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_the_makefile_and_the_table_name_the_same_markers() -> None:
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {line.split(":", 1)[0].strip() for line in ini["markers"]}
    assert registered - {"slow"} == set(markers.NEEDS)
    [line] = [ln for ln in (ROOT / "Makefile").read_text().splitlines() if ln.startswith("NEEDS_MARKERS")]
    assert set(re.findall(r"\w+", line.split(":=", 1)[1])) - {"or"} == set(markers.NEEDS)
    assert set(markers.FIXTURE_NEEDS.values()) <= set(markers.NEEDS)
    assert all(needs <= set(markers.NEEDS) for needs in markers.IMPORT_NEEDS.values())


def test_every_module_that_needs_a_program_to_be_imported_exists() -> None:
    tests = Path(__file__).parent
    assert all((tests / module).is_file() for module in markers.IMPORT_NEEDS)


@pytest.mark.parametrize(("markexpr", "carried", "selectable"), [
    pytest.param("", {"kubectl"}, True, id="no-expression"),
    pytest.param("not (prometheus or promtool or kubectl or kubeapi or peers)", {"kubectl"}, False, id="make-unit"),
    pytest.param("not kubeapi", {"kubeapi", "kubectl"}, False, id="one-of-two-deselected"),
    pytest.param("prometheus or promtool or kubectl or kubeapi or peers", {"kubectl"}, True, id="make-test"),
    pytest.param("prometheus", {"kubeapi", "kubectl"}, True, id="a-test-may-add-the-marker"),
    pytest.param("prometheus and not kubectl", {"kubeapi", "kubectl"}, False, id="excluded-whatever-it-adds"),
    pytest.param("slow", {"kubectl"}, True, id="unrelated-marker"),
])
def test_a_module_is_left_out_only_when_none_of_its_tests_could_be_selected(
        markexpr: str, carried: set[str], selectable: bool) -> None:
    assert markers.could_select(markexpr, frozenset(carried)) is selectable


@pytest.mark.parametrize(("names", "label"), [
    pytest.param(["parametrize", "slow"], "unmarked", id="none"),
    pytest.param(["kubectl", "kubeapi", "kubectl", "slow"], "kubeapi+kubectl", id="two"),
])
def test_the_time_summary_groups_by_what_a_test_needs(names: list[str], label: str) -> None:
    assert markers.group(names) == label


def test_the_unit_profile_scales_a_pinned_count_and_full_keeps_it() -> None:
    assert profiles.examples(10_000, profile=settings.get_profile(profiles.FULL)) == 10_000
    assert profiles.examples(10_000, profile=settings.get_profile(profiles.UNIT)) == 1_000
    assert profiles.examples(3, profile=settings.get_profile(profiles.UNIT)) == 1

"""The third round of hostile input as a whole: every class of the outside check has its cases, the
round adds at least a hundred inputs, and none of them repeats an input an earlier round tried.

The cases live beside the code they exercise: Prometheus answers (``test_hostile_prometheus``),
files and the store (``test_hostile_files``), numbers and meaning (``test_hostile_values``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tests.reliability import test_hostile_files, test_hostile_prometheus, test_hostile_values
from tests.reliability.hostile import Case
from tests.reliability.test_hostile_suite import CLASSES as EARLIER

MODULES = (test_hostile_prometheus, test_hostile_files, test_hostile_values)

#: The classes of the outside check, each with at least five inputs of its own.
KINDS = ("security", "impossible demand", "hangs", "store I/O", "numeric extremes", "nonsense",
         "unbounded input", "wrong reasons")


def round_three() -> dict[str, list[Case]]:
    out: dict[str, list[Case]] = {}
    for module in MODULES:
        for kind, cases in module.CASES.items():
            assert kind in KINDS, f"{module.__name__}: unknown class {kind!r} (one of {KINDS})"
            out.setdefault(kind, []).extend(cases)
    return out


def _input(case: Case) -> tuple[Any, ...]:
    """What the command was given: its argv, its files (a writer function by identity), its environment and,
    for a Prometheus case, what the server answers (by identity) — not what it must answer."""
    files = tuple(sorted(case.files.items(), key=lambda kv: kv[0]))
    return (case.argv, files, tuple(sorted(case.env.items())), getattr(case, "serve", None))


def _all(groups: Iterable[list[Case]]) -> list[Case]:
    return [c for cases in groups for c in cases]


def test_every_class_has_five_inputs_and_the_round_a_hundred() -> None:
    cases = round_three()
    sizes = {kind: len(cases.get(kind, [])) for kind in KINDS}
    assert all(n >= 5 for n in sizes.values()), sizes
    assert sum(sizes.values()) >= 100, sizes


def test_no_input_is_tried_twice_in_the_round() -> None:
    cases = _all(round_three().values())
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    seen: dict[tuple[Any, ...], str] = {}
    for case in cases:
        key = _input(case)
        assert key not in seen, f"{case.id} repeats the input of {seen[key]}"
        seen[key] = case.id


def test_no_input_repeats_an_earlier_round() -> None:
    earlier = {_input(c): c.id for c in _all(EARLIER.values())}
    repeats = {c.id: earlier[_input(c)] for c in _all(round_three().values()) if _input(c) in earlier}
    assert not repeats, repeats

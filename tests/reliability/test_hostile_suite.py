"""The hostile-input suite as a whole: big enough in every class, the motivating examples all in it,
and a few cases through the real console script, to prove no traceback reaches a user there either."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability import (
    test_hostile_flags,
    test_hostile_kubeconfig,
    test_hostile_outputs,
    test_hostile_specs,
    test_hostile_store,
    test_hostile_traces,
)
from tests.reliability.hostile import Case, csv, rows

CLASSES: dict[str, list[Case]] = {
    "traces": test_hostile_traces.CASES,
    "scenarios and flags": test_hostile_flags.CASES,
    "specs": test_hostile_specs.CASES,
    "model store": test_hostile_store.CASES,
    "kubeconfig and credentials": test_hostile_kubeconfig.CASES,
    "output paths": test_hostile_outputs.CASES,
}

#: The bad inputs that motivated the suite (a user must get a clear message, never a traceback), each a case id.
WHY = {
    "traces": ["mixed-z-and-naive", "naive-without-timezone", "trace-is-a-directory", "year-9999",
               "two-hundred-years-later", "exactly-14-days-evaluate", "one-step-short-of-14-days",
               "ninety-five-percent-missing"],
    "scenarios and flags": ["evaluation-zero", "evaluation-negative", "scenario-evaluation-negative",
                            "prewarm-disabled-no-budget", "scenario-forecaster-misspelt", "train-models-misspelt",
                            "scenario-is-a-directory", "demand-over-max-replicas"],
    "model store": ["not-json-rollback-repairs", "not-json-promote-repairs", "not-json-train-repairs",
                    "not-json-verify-names-it"],
    "kubeconfig and credentials": ["not-yaml"],
    "output paths": ["out-under-a-file", "report-under-a-file", "report-checked-before-the-trace"],
}


def test_the_suite_is_large_enough_in_every_class() -> None:
    sizes = {name: len(cases) for name, cases in CLASSES.items()}
    assert sum(sizes.values()) >= 150, sizes
    assert all(n >= 10 for n in sizes.values()), sizes


@pytest.mark.parametrize("kind", sorted(WHY))
def test_every_example_of_the_issue_is_a_case(kind: str) -> None:
    have = {c.id for c in CLASSES[kind]}
    assert set(WHY[kind]) <= have, set(WHY[kind]) - have


def console_script() -> Path:
    script = Path(sys.executable).parent / "predictive-scaler"
    assert script.exists(), f"{script}: install the package (make install) — the console script is tested"
    return script


@pytest.mark.parametrize("argv, files, says", [
    (["train", "--trace", "{d}", "--out", "{d}/store"], {}, "is a directory, not a trace file"),
    (["evaluate", "--trace", "{d}/t.csv"], {"t.csv": "timestamp,value\n2024-01-01T00:00:00Z,1\n9999-12-31T00:00:00Z,1\n"},
     "outside the years 1678–2261"),
    (["evaluate", "--trace", "{d}/t.csv", "--models", "persistence"],
     {"t.csv": csv([(t if i % 2 else t.rstrip("Z"), v) for i, (t, v) in enumerate(rows(600))])}, "no UTC offset"),
    (["backtest", "--trace", "{d}/t.csv", "--report", "{d}/f/report"], {"f": "x"}, "is a file, not a directory"),
    (["controller", "--kubeconfig", "{d}/kc", "--prometheus-url", "http://127.0.0.1:9", "--model-store", "{d}"],
     {"kc": "clusters: [\n"}, "not valid YAML"),
], ids=["trace-directory", "year-9999", "mixed-timestamps", "report-under-a-file", "kubeconfig-not-yaml"])
def test_the_real_entry_point_prints_no_traceback(tmp_path: Path, argv: list[str], files: dict[str, str],
                                                  says: str) -> None:
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    proc = subprocess.run([str(console_script()), *(a.format(d=tmp_path) for a in argv)], capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert says in proc.stderr and proc.stderr.startswith("error: "), proc.stderr

"""Output paths are checked before the work starts: `train --out`, `backtest --report` and
`--save-history` under a regular file, being a file (or a directory), or unwritable are refused at
once — the trace is not even read (a missing trace would be reported otherwise) and nothing is
written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.hostile import Case, check, ids

TRAIN = "train --trace {d}/good.csv --name web --models persistence --out"
BACKTEST = "backtest --trace {d}/good.csv --no-progress --report"
#: A trace that does not exist: when the output is refused first, it was never looked at.
NO_TRACE = "train --trace {d}/missing.csv --name web --out"
PULL = ("backtest --prometheus http://127.0.0.1:9 --scaler {d}/missing.yaml --no-progress --save-history")
FILE = {"afile": "I am a regular file\n"}

CASES: list[Case] = [
    Case("out-under-a-file", TRAIN + " {d}/afile/store", 2,
         ("--out", "afile is a file, not a directory", "nothing can be written under it", "choose another --out"), FILE),
    Case("out-deep-under-a-file", TRAIN + " {d}/afile/a/b/c", 2, ("afile is a file, not a directory",), FILE),
    Case("out-is-a-file", TRAIN + " {d}/afile", 2, ("--out", "is a file, not a directory", "created if missing"), FILE),
    Case("out-checked-before-the-trace", NO_TRACE + " {d}/afile/store", 2, ("--out", "is a file, not a directory"),
         FILE),
    Case("out-in-proc", TRAIN + " /proc/predictive-scaler-store", 2, ("--out", "cannot write in /proc",
                                                                      "choose another --out")),
    Case("out-in-sys", TRAIN + " /sys/kernel/predictive-scaler-store", 2, ("cannot write in /sys/kernel",)),
    Case("report-under-a-file", BACKTEST + " {d}/afile/report", 2,
         ("--report", "afile is a file, not a directory", "choose another --report"), FILE),
    Case("report-is-a-file", BACKTEST + " {d}/afile", 2, ("--report", "is a file, not a directory"), FILE),
    Case("report-checked-before-the-trace", "backtest --trace {d}/missing.csv --no-progress --report {d}/afile/r", 2,
         ("--report", "is a file, not a directory"), FILE),
    Case("report-checked-before-the-scenario", BACKTEST + " {d}/afile/r --scenario {d}/missing.yaml", 2,
         ("--report", "is a file"), FILE),
    Case("report-in-proc", BACKTEST + " /proc/predictive-scaler-report", 2, ("cannot write in /proc",)),
    Case("retrain-store-under-a-file", "retrain --config {d}/missing.yaml --prometheus http://127.0.0.1:9 --store "
         "{d}/afile/store", 2, ("--store", "afile is a file, not a directory"), FILE),
    Case("save-history-under-a-file", PULL + " {d}/afile/h.csv", 2, ("--save-history", "is a file, not a directory"),
         FILE),
    Case("save-history-is-a-directory", PULL + " {d}", 2, ("--save-history", "is a directory",
                                                           "the path of a file to write")),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_hostile_output_path(case: Case, work: Path) -> None:
    check(case, work)
    assert (work / "afile").read_text() == "I am a regular file\n" if (work / "afile").exists() else True

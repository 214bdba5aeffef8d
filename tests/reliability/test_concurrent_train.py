"""Concurrent `train --out` into one store: 6 writers × 4 rounds with `--keep 1`, real
processes, with a `forecast` reader and a `models rollback` pruning the pointer's history racing them.

Every run exits 0 or with a clear message (never a traceback); at least one writer per round
succeeds; `forecast` works from the serving version after every round; no version a writer
reported is lost while it serves; and `models verify` passes at the end.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.reliability.hostile import csv, rows, run_cli

WRITERS = 6
ROUNDS = 4


def console_script() -> str:
    script = Path(sys.executable).parent / "predictive-scaler"
    assert script.exists(), f"{script}: install the package (make install)"
    return str(script)


def test_six_writers_four_rounds_keep_one(tmp_path: Path) -> None:
    store = tmp_path / "store"
    traces = []
    for w in range(WRITERS):  # a different level per writer: different bytes, different versions
        path = tmp_path / f"w{w}.csv"
        path.write_text(csv(rows(15 * 288, level=100.0 + 10 * w)))
        traces.append(path)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    script = console_script()
    started = time.perf_counter()
    reported: set[str] = set()
    for round_ in range(ROUNDS):
        procs = [subprocess.Popen([script, "train", "--trace", str(t), "--out", str(store), "--name", "web",
                                   "--series", "web", "--models", "persistence", "--keep", "1",
                                   "--min-history", "14d"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for t in traces]
        racers = []
        if round_ > 0:  # a reader and a pointer-rewriting operator race the writers
            racers.append(subprocess.Popen([script, "forecast", "--model", str(store / "web"), "--trace",
                                            str(traces[0])], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           text=True, env=env))
            racers.append(subprocess.Popen([script, "models", "rollback", "--store", str(store), "--name", "web"],
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        ok = 0
        for p in procs + racers:
            out, err = p.communicate(timeout=300)
            assert "Traceback" not in out + err, f"round {round_}: {err}"
            assert p.returncode in (0, 2), f"round {round_}: exit {p.returncode}: {err}"
            if p.returncode == 2:
                assert err.startswith("error: ") and ("; " in err or " — " in err), f"unclear: {err}"
            if p in procs and p.returncode == 0:
                ok += 1
                found = re.search(r"^version (\S+) \(serving\)", out, re.M)
                assert found, out
                reported.add(found.group(1))
        assert ok >= 1, f"round {round_}: no writer succeeded"
        serving = json.loads((store / "web" / "serving").read_text())["version"]
        assert serving in reported, f"round {round_}: serving {serving}, which no writer published"
        assert (store / "web" / "versions" / serving).is_dir(), f"round {round_}: the serving version is gone"
        forecast = run_cli(["forecast", "--model", str(store / "web"), "--trace", str(traces[0])])
        assert forecast.code == 0, f"round {round_}: forecast from the serving version: {forecast.err}"
        leftovers = [p.name for p in (store / "web" / "versions").iterdir() if p.name.startswith(".tmp-")]
        assert not leftovers, f"round {round_}: temporaries left by finished writers: {leftovers}"
    verify = run_cli(["models", "verify", "--store", str(store)])
    assert verify.code == 0, verify.text
    assert "web: serving" in verify.out and ": ok" in verify.out
    assert time.perf_counter() - started < 240

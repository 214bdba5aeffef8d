"""Benchmark of the retraining job: N scalers × D days at 5 minutes, with 1 and 2 worker processes.

    python -m benchmarks.retrain --out backtests/results/retrain.md

History is synthetic and generated in-process (each worker regenerates a scaler's
series from its name), so the figures measure the job — selection, fitting,
the holdout comparison, artifact writes — not Prometheus. Each configuration runs
``--weeks`` times on a fresh store (default 2): week 1 (no serving model) and week 2
(a serving model to beat), so the comparison path is timed too; ``--weeks 1`` times
only the first training, e.g. to afford every candidate kind for 200 scalers.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")  # before numpy: one BLAS thread per process (see retrain/job.py)

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from predictive_scaler.forecasting.registry import FORECASTER_KINDS, parse_kinds  # noqa: E402
from predictive_scaler.forecasting.store import ModelStore  # noqa: E402
from predictive_scaler.retrain.history import GpuUsage  # noqa: E402
from predictive_scaler.retrain.job import run_retrain  # noqa: E402
from predictive_scaler.retrain.settings import RetrainSettings, ScalerTarget, scaler_from_manifest  # noqa: E402
from predictive_scaler.series import Series  # noqa: E402

START = datetime(2026, 1, 5, tzinfo=UTC)
STEP = 300


@dataclass(frozen=True)
class SyntheticHistory:
    """Daily + weekly shaped demand with bursts, one deterministic series per scaler; picklable."""

    days: int

    def _series(self, key: str) -> Series:
        seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big")
        rng = np.random.default_rng(seed)
        n = self.days * 86400 // STEP
        t = np.arange(n)
        level = rng.uniform(20, 2000)
        daily = 1 + rng.uniform(0.3, 0.8) * np.sin(2 * np.pi * (t / 288 + rng.uniform()))
        weekly = 1 + 0.15 * np.sin(2 * np.pi * t / (7 * 288))
        bursts = 1 + (rng.random(n) < 0.002) * rng.uniform(0.5, 2.0, n)
        noise = np.exp(0.08 * rng.standard_normal(n))
        return Series(values=level * daily * weekly * bursts * noise, start=pd.Timestamp(START),
                      step_seconds=STEP, name="demand")

    def demand(self, target, start, end, step_seconds, *, min_history, max_missing_fraction):  # noqa: ANN001
        s = self._series(target.key)
        return s.slice(s.index_at(start), s.index_at(end))

    def gpu_usage(self, target, start, end, step_seconds):  # noqa: ANN001
        return GpuUsage()


def targets(count: int) -> list[ScalerTarget]:
    return [scaler_from_manifest({
        "metadata": {"name": f"svc-{i:03d}", "namespace": f"team-{i % 7}"},
        "spec": {"target": {"name": f"svc-{i:03d}"}, "capacity": {"requestsPerReplica": 50},
                 "demand": {"kind": "requests", "query": "sum(rate(x[5m]))"}},
    }) for i in range(count)]


@dataclass(frozen=True)
class Row:
    processes: int
    week: int
    scalers: int
    wall_seconds: float
    mean_scaler_seconds: float
    results: str


def measure(count: int, days: int, processes: int, kinds: tuple[str, ...], weeks: int = 2) -> list[Row]:
    settings = RetrainSettings(kinds=kinds, history=timedelta(days=days))
    history = SyntheticHistory(days=days + 7 * max(weeks - 1, 1))
    fleet = targets(count)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-retrain-") as root:
        store = ModelStore(root)
        for week in range(1, weeks + 1):
            now = START + timedelta(days=days + 7 * (week - 1))
            t0 = time.perf_counter()
            report = run_retrain(fleet, history=history, store=store, settings=settings, now=now,
                                 run_id=f"bench-w{week}", processes=processes)
            wall = time.perf_counter() - t0
            counts = ", ".join(f"{k} {v}" for k, v in sorted(report.counts().items()))
            per = float(np.mean([o.seconds for o in report.outcomes]))
            rows.append(Row(processes, week, count, wall, per, counts))
            print(f"processes={processes} week={week}: {wall:.1f}s wall, {per:.2f}s/scaler ({counts})",
                  file=sys.stderr, flush=True)
    return rows


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, "
            f"load average at start {load[0]:.1f} (shared machine)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="write the Markdown report here")
    p.add_argument("--scalers", type=int, default=200)
    p.add_argument("--days", type=int, default=21)
    p.add_argument("--processes", default="1,2", help="comma-separated process counts (default 1,2)")
    p.add_argument("--models", default=",".join(FORECASTER_KINDS), help="candidate kinds")
    p.add_argument("--weeks", type=int, default=2,
                   help="weekly runs per configuration on one store (default 2: first training, then a "
                        "challenger against a serving model)")
    args = p.parse_args(argv)
    if args.weeks < 1:
        p.error("--weeks must be at least 1")
    kinds = parse_kinds(args.models)
    started = datetime.now(UTC)
    header = machine()
    rows = [r for n in (int(x) for x in args.processes.split(",")) for r in
            measure(args.scalers, args.days, n, kinds, args.weeks)]
    lines = [
        f"## Retraining {args.scalers} scalers × {args.days} days at 5 minutes",
        "",
        f"Candidates: {', '.join(kinds)}; {args.weeks} weekly run(s) per configuration. Synthetic history generated in-process (no Prometheus). "
        f"{started:%Y-%m-%d %H:%M} UTC; {header}.",
        "",
        "| processes | week | scalers | wall time | per scaler (in its process) | scalers/min | outcomes |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r.processes} | {r.week} | {r.scalers} | {r.wall_seconds:.1f} s | "
                     f"{r.mean_scaler_seconds:.2f} s | {r.scalers / r.wall_seconds * 60:.1f} | {r.results} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Capacity on the bundled H200 ladders: the plots and figures of docs/gpu-capacity.md.

    .venv/bin/python -m benchmarks.gpu_capacity [--out docs] [--window 15] [--step 5]

For each ladder (backtests/telemetry/) it reads the windows as Prometheus would
(benchmarks/gpu_ladders.py), runs the capacity-at-SLO estimator
(predictive_scaler/policy/slo_capacity.py), the old requests-per-busy-GPU ratio
(predictive_scaler/capacity_estimate.py, on the per-second rows of the ladder, utilisation
target 1) and the demand-signal check (predictive_scaler/policy/saturation.py), and writes:

- ``<out>/gpu-capacity-ladders.png``: per ladder, served rate against GPU and SM utilisation
  and against p95 latency, with the plateau, the new estimate and the old one marked;
- ``<out>/gpu-capacity-figures.md``: the table the page quotes.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.common import write_markdown
from benchmarks.gpu_ladders import (
    LADDERS,
    LadderSeries,
    highest_served,
    ladder_series,
    plateau,
    rows,
)
from predictive_scaler.capacity_estimate import estimate_capacity
from predictive_scaler.policy.saturation import ServingHistory, SignalCheck, check_demand_signal
from predictive_scaler.policy.slo_capacity import SloCapacity, estimate_slo_capacity
from predictive_scaler.series import Series


@dataclass(frozen=True)
class Figures:
    name: str
    series: LadderSeries
    estimate: SloCapacity
    old: float
    check: SignalCheck
    truth: float | None
    highest: float


def old_ratio(name: str) -> float:
    """Requests per busy GPU as the old estimator computes it, on the ladder's own per-second rows."""
    frame = rows(name)
    frame = frame[frame["mode"] != "idle"]
    start = ladder_series(name).served.start

    def s(values: np.ndarray) -> Series:
        return Series(np.asarray(values, dtype=float), start, 1)

    util = frame["gpu_util"].to_numpy(dtype=float)
    est = estimate_capacity(s(frame["served"].to_numpy()), s(util / 100), mean_utilisation=s(util),
                            utilization_target=1.0, min_steps=2)
    return est.requests_per_replica


def figures(name: str, window: int, step: int) -> Figures:
    s = ladder_series(name, window, step)
    est = estimate_slo_capacity(s.served, s.mean_latency, latency_quantile=s.p95, running=s.running,
                                gpu_util=s.gpu_util, sm_util=s.sm_util, window_seconds=s.window_seconds)
    ones = Series(np.ones(len(s.served)), s.served.start, step)
    check = check_demand_signal(ServingHistory(s.served, ones, s.gpu_util, s.mean_latency))
    return Figures(name, s, est, old_ratio(name), check, plateau(name), highest_served(name))


def plot(all_figures: Sequence[Figures], out: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")  # no display needed; chosen before pyplot loads
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    for ax, f in zip(axes.ravel(), all_figures, strict=True):
        s = f.series
        x = s.served.values
        # Points, not lines: windows after the load stopped (a backlog draining) sit left of the peak.
        ax.plot(x, s.gpu_util.values, "o", ms=3, color="tab:red", label="gpu_util % (DCGM GPU_UTIL)")
        ax.plot(x, s.sm_util.values, "s", ms=3, color="tab:orange", label="sm_util % (PROF_SM_ACTIVE)")
        ax.set_ylim(0, 105)
        ax.set_xlabel(f"served req/s ({s.window_seconds}-s windows)")
        ax.set_ylabel("utilisation %")
        lat = ax.twinx()
        lat.semilogy(x, s.p95.values * 1000, "^", ms=3, color="tab:blue", label="p95 latency ms")
        lat.set_ylabel("p95 latency ms (log)")
        top = max(float(np.max(x)), f.estimate.value) * 1.15
        if f.truth is not None:
            ax.axvline(f.truth, color="black", lw=2, alpha=0.35, label=f"plateau {f.truth:.4g}")
        kind = "knee" if f.estimate.kind == "point" else "lower bound"
        ax.axvline(f.estimate.value, color="tab:green", lw=1.5, label=f"new: {kind} {f.estimate.value:.4g}")
        if f.old <= top:
            ax.axvline(f.old, color="tab:purple", ls="--", lw=1.5, label=f"old: {f.old:.4g}")
        else:
            ax.annotate(f"old: {f.old:.4g} (off the chart) →", xy=(top * 0.98, 30), ha="right", color="tab:purple")
        ax.set_xlim(0, top)
        verdict = {"tracks-load": "utilisation tracks load", "pinned": "utilisation pinned",
                   "blind": "utilisation blind (CPU-bound)"}.get(f.check.verdict, f.check.verdict)
        ax.set_title(f"{f.name}: {verdict}")
        handles = ax.get_legend_handles_labels()
        more = lat.get_legend_handles_labels()
        ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize=7, loc="upper left")
    fig.suptitle("H200 ladders (backtests/telemetry/): served rate vs utilisation vs latency")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpu-capacity-ladders.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def table(all_figures: Sequence[Figures], window: int, step: int) -> list[str]:
    lines = [f"Windows of {window} s every {step} s. Plateau: the ladder's truth (mean served over the rungs that "
             "fall ≥ 5 % short while the queue grows). Old: requests per busy GPU (capacity_estimate.py) on the "
             "per-second rows, utilisation target 1.",
             "",
             "| ladder | plateau (truth) | new estimate | interval | new ÷ truth | old (req/s per busy GPU) | "
             "old ÷ truth | utilisation |",
             "|---|---|---|---|---|---|---|---|"]
    for f in all_figures:
        e = f.estimate
        truth = f.truth if f.truth is not None else f.highest
        label = f"{f.truth:,.0f}" if f.truth is not None else f"none (highest served {f.highest:,.0f})"
        high = "∞" if math.isinf(e.high) else f"{e.high:,.0f}"
        lines.append(f"| {f.name} | {label} | {e.kind} {e.value:,.0f} | {e.low:,.0f}–{high} | "
                     f"{e.value / truth:.2f}{'' if f.truth is not None else ' (of highest)'} | {f.old:,.1f} | "
                     f"{f.old / truth:.2f} | {f.check.verdict} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs", help="where the PNG and the figures go (default: docs)")
    parser.add_argument("--window", type=int, default=15, help="rate window, seconds (default 15)")
    parser.add_argument("--step", type=int, default=5, help="query step, seconds (default 5)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    all_figures = [figures(name, args.window, args.step) for name in LADDERS]
    print(f"wrote {plot(all_figures, out)}")
    lines = table(all_figures, args.window, args.step)
    write_markdown(out / "gpu-capacity-figures.md", lines)
    print("\n".join(lines))
    for f in all_figures:
        print(f"\n{f.name}: {f.estimate.explanation}\n  signal: {f.check.message}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

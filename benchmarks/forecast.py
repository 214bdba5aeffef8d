"""Forecasting benchmark: walk-forward scores of every model on every long-enough shared trace.

    python -m benchmarks.forecast --traces backtests/traces --out backtests/results/forecast.md

Traces of 14 days or more are evaluated (those shorter than 15 days with a
7-day initial training window, since 14 days would leave nothing to score).
Also measures, pinned to one core, the ARIMA fit time on 21 days at 5 minutes
and the latency of one forecast with its state update (re-filtering the
recent window). Not a timed test: results depend on the machine and its load,
which the report records.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path

import numpy as np

from benchmarks.common import reexec_with_one_blas_thread, write_markdown
from predictive_scaler.errors import ScalerError
from predictive_scaler.forecasting.evaluation import (
    EvaluationReport,
    EvaluationSettings,
    evaluate,
    initial_history_for,
    planned_fits,
)
from predictive_scaler.forecasting.registry import FORECASTER_KINDS, parse_kinds
from predictive_scaler.series import Series, format_duration, load_trace

MIN_SPAN = timedelta(days=14)
TIMING_TRACE = "nasa_http_1995.csv"
LIBRARIES = ("numpy", "pandas", "scipy", "statsmodels", "prophet")


def machine() -> list[str]:
    uname = " ".join(platform.uname())
    try:
        uname = subprocess.run(["uname", "-a"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    versions = [f"python {platform.python_version()}"]
    for lib in LIBRARIES:
        try:
            versions.append(f"{lib} {metadata.version(lib)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{lib} (not installed)")
    load = os.getloadavg()
    return [
        f"- machine: `{uname}`; nproc {os.cpu_count()}; load average at start "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (the machine is shared)",
        f"- date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- libraries: {', '.join(versions)}",
    ]


def time_arima(trace: Path, repeats: int = 3, forecasts: int = 200) -> dict[str, float]:
    """ARIMA fit on 21 days at 5 min, and forecast-with-state-update latency, on one core."""
    from predictive_scaler.forecasting.arima import ArimaForecaster
    from predictive_scaler.forecasting.evaluation import model_series

    series = model_series(load_trace(trace, min_history=None))
    history = series.slice(0, 21 * 86400 // series.step_seconds)
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(previous)})
    try:
        ArimaForecaster().fit(history.slice(0, 3 * 288))  # warm imports, not timed
        walls, cpus = [], []
        for _ in range(repeats):
            w0, c0 = time.perf_counter(), time.process_time()
            model = ArimaForecaster().fit(history)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        lat = []
        for i in range(forecasts):
            recent = series.slice(0, len(history) + i + 1)
            t0 = time.perf_counter()
            model.forecast(recent, 6, (0.5, 0.95))
            lat.append(time.perf_counter() - t0)
    finally:
        os.sched_setaffinity(0, previous)
    return {
        "fit_wall_median": float(np.median(walls)),
        "fit_cpu_median": float(np.median(cpus)),
        "forecast_ms_median": 1000 * float(np.median(lat)),
        "forecast_ms_p95": 1000 * float(np.percentile(lat, 95)),
        "points": float(len(history)),
    }


def _fmt(v: float | None, pct: bool = False, digits: int = 4) -> str:
    if v is None:
        return "–"
    return f"{100 * v:.1f} %" if pct else f"{v:.{digits}g}"


def trace_table(name: str, series: Series, min_history: timedelta, report: EvaluationReport, seconds: float) -> list[str]:
    lines = [
        f"### {name}",
        "",
        f"{format_duration(series.span)} at {series.step_seconds}s → model step {report.step_seconds}s; "
        f"initial training {format_duration(min_history)}, {report.blocks} weekly refit(s); "
        f"{series.missing_fraction:.1%} missing; evaluated in {seconds:.0f} s.",
        "",
        "| model | MAE | WAPE | MASE | pinball P95 | coverage 10m | coverage 20m | coverage 30m | fit s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, m in report.models.items():
        h30 = m.horizons.get("30m", {})
        mark = " **(selected)**" if kind == report.selected else ""
        if m.error:
            lines.append(f"| {kind} | failed: {m.error} | | | | | | | |")
            continue
        cov = [_fmt(m.horizons.get(h, {}).get("coverage"), digits=3) for h in ("10m", "20m", "30m")]
        lines.append(
            f"| {kind}{mark} | {_fmt(h30.get('mae'))} | {_fmt(h30.get('wape'), pct=True)} | "
            f"{_fmt(h30.get('mase'), digits=3)} | {_fmt(h30.get('pinball'))} | {' | '.join(cov)} | "
            f"{_fmt(m.fit_seconds, digits=3)} |"
        )
    lines.extend(f"\nNote: {n}." for n in report.notes)
    lines.append("")
    return lines


def summary_row(name: str, report: EvaluationReport) -> tuple[str, bool | None, int]:
    """One summary line; returns (row, coverage in band, baselines the selected model beats of 2)."""
    sel = report.selected

    def metric(kind: str | None, key: str) -> float | None:
        m = report.models.get(kind) if kind else None
        return None if m is None or m.error else m.horizons.get("30m", {}).get(key)

    c = metric(sel, "coverage")
    in_band = None if c is None else 0.93 <= c <= 0.97
    p_sel = metric(sel, "pinball")
    verdicts = []
    beaten = 0
    for baseline in ("persistence", "holt-winters"):
        p_base = metric(baseline, "pinball")
        if sel == baseline:
            verdicts.append("is it")
        elif p_sel is None or p_base is None:
            verdicts.append("–")
        elif p_sel < p_base:
            verdicts.append(f"yes ({(p_base - p_sel) / p_base:.0%} lower)")
            beaten += 1
        else:
            verdicts.append(f"no ({(p_sel - p_base) / p_base:.0%} higher)")
    models = [k for k in ("arima", "prophet", "ensemble") if metric(k, "pinball") is not None]
    best_model = min(models, key=lambda k: metric(k, "pinball") or 0.0) if models else None
    row = (
        f"| {name} | {sel or '–'} | {_fmt(c, digits=3)} | "
        f"{'yes' if in_band else 'no' if in_band is not None else '–'} | {_fmt(p_sel)} | "
        f"{best_model or '–'} {_fmt(metric(best_model, 'pinball'))} | "
        f"{_fmt(metric('persistence', 'pinball'))} | {_fmt(metric('holt-winters', 'pinball'))} | "
        f"{verdicts[0]} | {verdicts[1]} |"
    )
    return row, in_band, beaten


#: One-core numbers must not hide a second BLAS thread; these must be set before numpy loads.
def main(argv: list[str] | None = None) -> int:  # noqa: PLR0915
    reexec_with_one_blas_thread("benchmarks.forecast", argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default="backtests/traces", help="directory of timestamp,value CSVs")
    parser.add_argument("--out", default="backtests/results/forecast.md", help="Markdown report to write")
    parser.add_argument("--models", default=",".join(FORECASTER_KINDS), help="comma-separated model kinds")
    parser.add_argument("--only", default="", help="comma-separated trace names (default: all long enough)")
    parser.add_argument("--no-timing", action="store_true", help="skip the pinned ARIMA timing")
    parser.add_argument("--timing-only", action="store_true", help="only the pinned ARIMA timing")
    args = parser.parse_args(argv)
    from tqdm import tqdm

    kinds = parse_kinds(args.models)
    traces_dir = Path(args.traces)
    wanted = {n.strip() for n in args.only.split(",") if n.strip()}
    lines = ["# Forecasting benchmark", "",
             "Generated by `make bench-forecast` (`python -m benchmarks.forecast`); do not edit.", ""]
    lines += machine()
    lines += [
        "",
        "Method: rolling origin. The first 14 days (7 days for traces of 14 days) are the initial "
        "training period; then week by week each model is fitted on up to 28 days ending 7 days "
        "(3.5 for the 14-day traces) before the week, conformally calibrated per horizon step on "
        "those days (out of sample), and scored on "
        "the week — data neither fit nor calibration saw. Every forecast at t reads observations up "
        "to t only. Series are modelled on a 5-minute grid (coarser traces at their own step); values "
        "are read as rates. Metrics at the 30-minute horizon: MAE and WAPE of the median (P50), "
        "MASE against the in-sample one-step naive error, pinball loss and coverage of the P95. "
        "The ensemble learns its per-step weights inside its own fit window (members fitted on the "
        "first three quarters, weights chosen on the last quarter, 1–7 days, then members refitted "
        "on all of it), so it too never sees the calibration or scored data.",
        "",
    ]
    timing: dict[str, float] | None = None
    if not args.no_timing and (traces_dir / TIMING_TRACE).exists():
        print("timing ARIMA on one core …", file=sys.stderr)
        timing = time_arima(traces_dir / TIMING_TRACE)
    summary: list[str] = []
    sections: list[str] = []
    in_band_count = beats_count = long_count = 0
    missed: list[str] = []
    for path in sorted(traces_dir.glob("*.csv")):
        if args.timing_only:
            break
        if wanted and path.stem not in wanted:
            continue
        try:
            series = load_trace(path, min_history=None)
        except ScalerError as exc:
            print(f"skip {path.name}: {exc}", file=sys.stderr)
            continue
        if series.span < MIN_SPAN:
            continue
        min_history = initial_history_for(series.span)
        settings = EvaluationSettings(min_history=min_history)
        t0 = time.perf_counter()
        with tqdm(total=planned_fits(series, kinds, settings), desc=path.stem, unit="fit",
                  file=sys.stderr) as bar:
            report = evaluate(series, kinds, settings, progress=bar)
        seconds = time.perf_counter() - t0
        sections += trace_table(path.stem, series, min_history, report, seconds)
        row, in_band, beaten = summary_row(path.stem, report)
        summary.append(row)
        if series.span >= timedelta(days=21):
            long_count += 1
            in_band_count += bool(in_band)
            beats_count += beaten == 2
            if beaten < 2:
                missed.append(f"{path.stem} (selected {report.selected or 'none'})")
    if timing:
        lines += [
            "## ARIMA cost (one pinned core)",
            "",
            f"- fit on 21 days at 5 minutes ({timing['points']:.0f} points of {TIMING_TRACE}): "
            f"median {timing['fit_wall_median']:.2f} s wall, {timing['fit_cpu_median']:.2f} s CPU "
            "(target ≤ 2 s)",
            f"- forecast with state update (re-filter the last day with fixed parameters, 6 steps, "
            f"P50+P95): median {timing['forecast_ms_median']:.1f} ms, p95 {timing['forecast_ms_p95']:.1f} ms "
            "(target ≤ 50 ms)",
            "",
        ]
    lines += [
        "## Summary (30-minute horizon, P95)",
        "",
        "| trace | selected | coverage | in [0.93, 0.97] | pinball selected | best of ARIMA/Prophet/ensemble | "
        "persistence | Holt-Winters | beats persistence | beats Holt-Winters |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *summary,
        "",
        f"On the {long_count} traces of 21 days or more: selected coverage in band on {in_band_count}, "
        f"the selected model's pinball beats both persistence and Holt-Winters on {beats_count} "
        "(where a baseline is itself selected, it was the best model there: the table says so)"
        + (f"; missed on {', '.join(missed)}." if missed else "."),
        "",
        "## Per trace",
        "",
        *sections,
    ]
    write_markdown(args.out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())

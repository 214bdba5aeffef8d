"""The project's forecasts against statsforecast's, trace by trace, in one protocol.

    make bench-peers   # = .venv-peers/bin/python -m predictive_scaler.bench.peers --out backtests/results/peers.md

Runs :func:`predictive_scaler.forecasting.protocol.run_protocol` (docs/forecast-protocol.md)
on every bundled long trace and writes, per trace, the model ``train`` would have served
against the best statsforecast peer: 30-minute normalised pinball at the P95 and their
ratio, coverage, selection regret, fit and forecast times. It also times, on one pinned
core, training every default candidate on 21 days at 5 minutes and one forecast with
state update of each. Needs the ``peers`` extra (statsforecast, pandas<3): ``make
bench-peers`` creates ``.venv-peers`` for it.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from datetime import timedelta
from importlib import metadata
from pathlib import Path

import numpy as np

from predictive_scaler.bench.forecast import THREAD_VARS, machine
from predictive_scaler.forecasting.peers import PEER_NAMES, require_statsforecast
from predictive_scaler.forecasting.protocol import (
    ProtocolReport,
    ProtocolSettings,
    planned_blocks,
    run_protocol,
)
from predictive_scaler.forecasting.registry import FORECASTER_KINDS, parse_kinds
from predictive_scaler.series import load_trace

#: The bundled traces of 14 days or more.
LONG_TRACES: tuple[str, ...] = (
    "nasa_http_1995", "ms_mongodb_machine01_rps", "nab_nyc_taxi", "nab_twitter_aapl",
    "nab_rds_cpu_e47b3b", "servegen_m_small", "servegen_m_large",
)
TIMING_TRACE = "nasa_http_1995.csv"
#: Targets (issue 14).
COVERAGE_BAND = (0.93, 0.97)
RATIO_GEOMEAN_TARGET = 0.90
REGRET_TARGET = 1.05
TRAIN_BUDGET_SECONDS = 3.0
FORECAST_BUDGET_MS = 10.0


def time_candidates(trace: Path, kinds: tuple[str, ...], forecasts: int = 100) -> dict[str, tuple[float, float]]:
    """kind -> (fit seconds on 21 days at 5 min, median ms of one calibrated forecast), one pinned core."""
    from predictive_scaler.forecasting.evaluation import model_series
    from predictive_scaler.forecasting.selection import fit_calibrated, settings_for_history

    series = model_series(load_trace(trace, min_history=None))
    n = 21 * 86400 // series.step_seconds
    history = series.slice(0, n)
    cfg = settings_for_history(history.span)
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(previous)})
    out: dict[str, tuple[float, float]] = {}
    try:
        fit_calibrated("arima", history.slice(0, 4 * 288), settings_for_history(timedelta(days=4)))  # warm imports
        from predictive_scaler.forecasting import registry

        for kind in kinds:
            t0 = time.perf_counter()
            base = registry.forecaster(kind).fit(history)
            fit = time.perf_counter() - t0
            model, _ = fit_calibrated(kind, history, cfg)
            del base
            window = int(getattr(model, "window_steps", 2016))
            lat = []
            for i in range(forecasts):
                end = n + 1 + i
                recent = series.slice(max(0, end - window), end)
                t1 = time.perf_counter()
                model.forecast(recent, 6, (0.5, 0.95))
                lat.append(time.perf_counter() - t1)
            out[kind] = (fit, 1000 * float(np.median(lat)))
    finally:
        os.sched_setaffinity(0, previous)
    return out


def _f(v: float | None, digits: int = 4) -> str:
    return "–" if v is None or not math.isfinite(v) else f"{v:.{digits}g}"


def summary_row(name: str, r: ProtocolReport) -> tuple[str, float | None, float | None, float | None]:
    best_peer = r.best_peer()
    peer = r.peers[best_peer] if best_peer else None
    best_cand = r.best_candidate()
    ratio, regret = r.ratio(), r.regret()
    cov = r.served.metric("coverage")
    choices = ", ".join(sorted(set(r.served.choices)))
    fc = r.served.forecast_seconds
    row = (
        f"| {name} | {choices} | {_f(r.served.metric('normalised_pinball'))} | {_f(cov, 3)} | "
        f"{best_peer or '–'} | {_f(peer.metric('normalised_pinball') if peer else None)} | "
        f"{_f(peer.metric('coverage') if peer else None, 3)} | **{_f(ratio, 3)}** | "
        f"{best_cand or '–'} | {_f(regret, 3)} | "
        f"{_f(r.served.fit_seconds, 2)} / {_f(None if fc is None else 1000 * fc, 2)} | "
        f"{_f(peer.fit_seconds if peer else None, 2)} / "
        f"{_f(None if not peer or peer.forecast_seconds is None else 1000 * peer.forecast_seconds, 2)} |"
    )
    return row, ratio, regret, cov


def detail(name: str, r: ProtocolReport, seconds: float) -> list[str]:
    lines = [
        f"### {name}", "",
        f"model step {r.step_seconds}s; initial history {r.settings['min_history']}; {r.blocks} refit(s); "
        f"served at each refit: {', '.join(r.served.choices)}; run in {seconds:.0f} s.", "",
        "| side | model | normalised pinball 30m | pinball 30m | coverage 10m | coverage 30m | MAPE 30m | fit s | forecast ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows = [("project", "served", r.served), *(("project", k, m) for k, m in r.models.items()),
            *(("peer", k, p) for k, p in r.peers.items())]
    for side, model, m in rows:
        fc = None if m.forecast_seconds is None else 1000 * m.forecast_seconds
        if m.skipped or m.error:
            lines.append(f"| {side} | {model} | skipped: {m.skipped or m.error} | | | | | {_f(m.fit_seconds, 3)} | |")
            continue
        mape = m.metric("mape")
        lines.append(
            f"| {side} | {model} | {_f(m.metric('normalised_pinball'))} | {_f(m.metric('pinball'))} | "
            f"{_f(m.metric('coverage', '10m'), 3)} | {_f(m.metric('coverage'), 3)} | "
            f"{'–' if mape is None else f'{100 * mape:.1f} %'} | {_f(m.fit_seconds, 3)} | {_f(fc, 3)} |")
    lines += [*(f"\nNote: {n}." for n in r.notes), ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    if any(os.environ.get(v) != "1" for v in THREAD_VARS):
        env = {**os.environ, **dict.fromkeys(THREAD_VARS, "1")}
        given = sys.argv[1:] if argv is None else argv
        os.execve(sys.executable, [sys.executable, "-m", "predictive_scaler.bench.peers", *given], env)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default="backtests/traces")
    parser.add_argument("--out", default="backtests/results/peers.md")
    parser.add_argument("--only", default="", help="comma-separated trace names (default: the long traces)")
    parser.add_argument("--models", default=",".join(FORECASTER_KINDS))
    parser.add_argument("--peers", default=",".join(PEER_NAMES))
    parser.add_argument("--no-timing", action="store_true")
    args = parser.parse_args(argv)
    from tqdm import tqdm

    version = require_statsforecast()
    kinds = parse_kinds(args.models)
    peers = tuple(p for p in args.peers.split(",") if p)
    traces = [n for n in args.only.split(",") if n] or list(LONG_TRACES)
    settings = ProtocolSettings(peers=peers)
    lines = ["# The project's forecasts against statsforecast", "",
             "Generated by `make bench-peers` (`python -m predictive_scaler.bench.peers` in .venv-peers); "
             "do not edit. Protocol: [docs/forecast-protocol.md](../../docs/forecast-protocol.md).", ""]
    lines += machine()
    lines.append(f"- statsforecast {version}, pandas {metadata.version('pandas')} (in .venv-peers)")
    lines.append("")
    timing = None
    if not args.no_timing and (Path(args.traces) / TIMING_TRACE).exists():
        print("timing the default candidates on one core …", file=sys.stderr)
        timing = time_candidates(Path(args.traces) / TIMING_TRACE, kinds)
    summary, sections = [], []
    ratios: list[float] = []
    misses: list[str] = []
    for name in traces:
        series = load_trace(Path(args.traces) / f"{name}.csv", min_history=None)
        t0 = time.perf_counter()
        with tqdm(total=planned_blocks(series, settings), desc=name, unit="refit", file=sys.stderr) as bar:
            report = run_protocol(series, kinds, settings, progress=bar)
        seconds = time.perf_counter() - t0
        row, ratio, regret, cov = summary_row(name, report)
        summary.append(row)
        sections += detail(name, report, seconds)
        if ratio is not None:
            ratios.append(ratio)
        why = []
        if ratio is None or ratio > 1.0:
            why.append(f"ratio {_f(ratio, 3)} > 1")
        if cov is None or not COVERAGE_BAND[0] <= cov <= COVERAGE_BAND[1]:
            why.append(f"coverage {_f(cov, 3)} outside [0.93, 0.97]")
        if regret is None or regret > REGRET_TARGET:
            why.append(f"regret {_f(regret, 3)} > {REGRET_TARGET}")
        if why:
            misses.append(f"{name}: {'; '.join(why)}")
    geo = float(np.exp(np.mean(np.log(ratios)))) if ratios else None
    lines += [
        "## Summary (30-minute horizon, P95)", "",
        "Normalised pinball = pinball loss at 0.95 ÷ mean actual. *Served* is what `train` would "
        "have served at each refit (its choices listed); ratio = served ÷ best peer (< 1: the "
        "project is better); regret = served ÷ the project's best candidate in hindsight. "
        "Times: mean fit seconds per refit / median milliseconds per forecast with state update.", "",
        "| trace | served | norm. pinball | coverage | best peer | its norm. pinball | its coverage | ratio | "
        "best candidate | regret | served fit s / forecast ms | peer fit s / forecast ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *summary, "",
        f"Geometric mean of the ratio over {len(ratios)} traces: **{_f(geo, 3)}** "
        f"(target ≤ {RATIO_GEOMEAN_TARGET}); arithmetic mean {_f(float(np.mean(ratios)) if ratios else None, 3)}.",
        "",
    ]
    if misses:
        lines += ["Targets missed (ratio ≤ 1, coverage in [0.93, 0.97], regret ≤ 1.05):", "",
                  *(f"- {m}" for m in misses), ""]
    else:
        lines += ["Every trace meets ratio ≤ 1, coverage in [0.93, 0.97] and regret ≤ 1.05.", ""]
    if timing:
        total = sum(f for f, _ in timing.values())
        lines += [
            "## Time budget (one pinned core, 21 days at 5 minutes of nasa_http_1995)", "",
            "| candidate | fit s | forecast ms (median, with state update, calibrated, 6 steps) |",
            "|---|---|---|",
            *(f"| {k} | {f:.3f} | {ms:.2f} |" for k, (f, ms) in timing.items()),
            "",
            f"Training every default candidate once: **{total:.2f} s** (budget ≤ {TRAIN_BUDGET_SECONDS:g} s); "
            f"slowest median forecast {max(ms for _, ms in timing.values()):.2f} ms "
            f"(budget ≤ {FORECAST_BUDGET_MS:g} ms).",
            "",
        ]
    lines += ["## Per trace (30-minute horizon unless stated)", "", *sections]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

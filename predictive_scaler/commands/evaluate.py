"""`predictive-scaler evaluate`: walk-forward evaluation of forecasters on a trace

Train on the first --min-history of the trace, then walk forward week by week (refit and
recalibrate weekly) and print, per model and horizon, MAE, WAPE, MAPE (non-zero actuals), MASE,
pinball loss and coverage at --quantile, and fit seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from predictive_scaler.commands._flags import DEFAULT_MODELS, add_command, add_trace_flags


def register(subparsers: Any) -> None:
    p = add_command(subparsers, __doc__)
    p.add_argument("--trace", required=True, help="timestamp,value CSV or Parquet file")
    p.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated kinds (default {DEFAULT_MODELS})")
    p.add_argument("--horizons", default="10m,20m,30m", help="comma-separated horizons, 5m–60m (default 10m,20m,30m)")
    p.add_argument("--quantile", type=float, default=0.95, help="target quantile probability (default 0.95)")
    p.add_argument("--value-kind", choices=("rate", "count"), default="rate",
                   help="values are a rate (averaged when merging steps) or a count per step (summed)")
    p.add_argument("--min-history", default="14d", help="initial training period (default 14d; lower warns)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    add_trace_flags(p)
    p.add_argument("--peers", action="store_true",
                   help="also run the statsforecast peers (AutoARIMA, AutoETS, MSTL, Naive, SeasonalNaive) "
                        "in the forecast protocol (docs/forecast-protocol.md): origins every 30 min, weekly "
                        "refits on up to 28 days, the model train would serve at each refit; needs "
                        "`pip install -e '.[peers]'`")
    p.add_argument("--peer-models", default="AutoARIMA,AutoETS,MSTL,Naive,SeasonalNaive",
                   help="with --peers: comma-separated statsforecast models (default all five)")
    p.add_argument("--peer-fit-limit", type=float, default=120.0,
                   help="with --peers: a peer whose fit takes longer (seconds) is stopped and reported as "
                        "skipped (default 120)")
    p.set_defaults(func=run)


def _json_safe(value: Any) -> Any:
    """NaN/Infinity never reach the JSON: they become null."""
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _cell(value: float | None, kind: str) -> str:
    if value is None:
        return "–"
    if kind in ("wape", "mape"):
        return f"{100 * value:.1f}%"
    if kind == "coverage":
        return f"{value:.3f}"
    return f"{value:.4g}"


def format_table(report: Any) -> str:
    from predictive_scaler.forecasting.metrics import METRIC_NAMES

    header = ["model", "horizon", *METRIC_NAMES, "fit s"]
    rows = [header]
    for name, m in report.models.items():
        fit = "–" if m.fit_seconds is None else f"{m.fit_seconds:.2f}"
        for label, metrics in m.horizons.items():
            mark = "*" if name == report.selected else ""
            rows.append([name + mark, label, *(_cell(metrics.get(k), k) for k in METRIC_NAMES), fit])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append(f"quantile {report.quantile:g}; selected: {report.selected or 'none'} (*); "
                 f"model step {report.step_seconds}s; {report.blocks} weekly refits")
    for m in report.models.values():
        if m.error:
            lines.append(f"error: {m.error}")
    lines.extend(f"note: {n}" for n in report.notes)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from predictive_scaler.commands._flags import max_missing, positive_duration
    from predictive_scaler.errors import ConfigError, DataError
    from predictive_scaler.forecasting.evaluation import EvaluationSettings, evaluate, planned_fits
    from predictive_scaler.forecasting.registry import parse_kinds
    from predictive_scaler.series import load_trace, parse_duration

    kinds = parse_kinds(args.models)
    try:
        horizons = tuple(parse_duration(h) for h in args.horizons.split(",") if h.strip())
    except DataError as exc:
        raise ConfigError(f"--horizons: {exc}", field="horizons") from exc
    min_history = positive_duration("--min-history", args.min_history)
    if args.peers:
        return _run_peers(args, kinds, horizons, min_history)
    settings = EvaluationSettings(quantile=args.quantile, horizons=horizons, min_history=min_history)
    series = load_trace(args.trace, value_kind=args.value_kind, min_history=min_history,
                        timezone=args.timezone, max_missing=max_missing(args))
    total = planned_fits(series, kinds, settings)
    with tqdm(total=total, desc="evaluate", unit="fit", file=sys.stderr, disable=None) as bar:
        report = evaluate(series, kinds, settings, progress=bar)
    if args.json:
        print(json.dumps(_json_safe(report.to_dict()), allow_nan=False, indent=2))
    else:
        print(format_table(report))
    return 0 if report.selected else 1


def _run_peers(args: argparse.Namespace, kinds: tuple[str, ...], horizons: tuple[Any, ...], min_history: Any) -> int:
    """`evaluate --peers`: the forecast protocol with the statsforecast peers beside the project's models."""
    from tqdm import tqdm

    from predictive_scaler.commands._flags import max_missing
    from predictive_scaler.errors import ConfigError
    from predictive_scaler.forecasting.rolling_origin import (
        ProtocolSettings,
        planned_blocks,
        run_protocol,
    )
    from predictive_scaler.forecasting.statsforecast_peers import PEER_NAMES, require_statsforecast
    from predictive_scaler.series import load_trace

    require_statsforecast()  # fail before loading anything when the extra is missing
    peers = tuple(p.strip() for p in args.peer_models.split(",") if p.strip())
    unknown = sorted(set(peers) - set(PEER_NAMES))
    if unknown or not peers:
        raise ConfigError(f"unknown peer(s) {', '.join(unknown) or '(none given)'}; choose from "
                          f"{', '.join(PEER_NAMES)}", field="peer-models")
    if not args.peer_fit_limit > 0:
        raise ConfigError(f"--peer-fit-limit {args.peer_fit_limit} must be a positive number of seconds",
                          field="peer-fit-limit")
    given = None if args.min_history == "14d" else min_history
    settings = ProtocolSettings(quantile=args.quantile, horizons=horizons, min_history=given, peers=peers,
                                fit_limit_seconds=args.peer_fit_limit)
    series = load_trace(args.trace, value_kind=args.value_kind, min_history=None,
                        timezone=args.timezone, max_missing=max_missing(args))
    with tqdm(total=planned_blocks(series, settings), desc="evaluate --peers", unit="refit",
              file=sys.stderr, disable=None) as bar:
        report = run_protocol(series, kinds, settings, progress=bar)
    if args.json:
        print(json.dumps(_json_safe(report.to_dict()), allow_nan=False, indent=2))
    else:
        print(format_protocol(report))
    return 0 if report.served.origins else 1


def format_protocol(report: Any) -> str:
    rows = [["side", "model", "horizon", "pinball", "normalised", "coverage", "mape", "fit s", "forecast ms"]]
    notes: list[str] = []

    def add(side: str, name: str, m: Any) -> None:
        fit = "–" if m.fit_seconds is None else f"{m.fit_seconds:.2f}"
        fc = "–" if m.forecast_seconds is None else f"{1000 * m.forecast_seconds:.2f}"
        if m.skipped or m.error:
            rows.append([side, name, "–", "skipped", "", "", "", fit, fc])
            notes.append(f"{name} skipped: {m.skipped or m.error}")
            return
        for label, h in m.horizons.items():
            rows.append([side, name, label, _cell(h.get("pinball"), "pinball"),
                         _cell(h.get("normalised_pinball"), "pinball"), _cell(h.get("coverage"), "coverage"),
                         _cell(h.get("mape"), "mape"), fit, fc])

    add("project", "served", report.served)
    for name, m in report.models.items():
        add("project", name, m)
    for name, m in report.peers.items():
        add("peer", name, m)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    ratio, regret = report.ratio(), report.regret()

    def shown(value: float | None, key: str) -> str:
        iv = report.intervals.get(key)
        return ("–" if value is None else f"{value:.3f}") + (f" [{iv[0]:.3f}, {iv[1]:.3f}]" if iv else "")

    lines += [
        "",
        f"served = what `train` would serve at each of {report.blocks} refits: {', '.join(report.served.choices)}",
        f"best peer {report.best_peer() or '–'}; served ÷ best peer (30m normalised pinball): "
        f"{shown(ratio, 'ratio_to_best_peer')}; selection regret (served ÷ best candidate "
        f"{report.best_candidate() or '–'}): {shown(regret, 'regret')}",
    ]
    if report.intervals:
        lines.append(f"[lo, hi]: 90 % interval with the {report.intervals.get('days', 0)} days of origins "
                     "resampled (both sides on the same days)")
    lines.extend(f"note: {n}" for n in (*notes, *report.notes))
    return "\n".join(lines)

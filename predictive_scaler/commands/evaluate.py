"""`predictive-scaler evaluate`: rolling-origin evaluation of forecasters on one trace."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from predictive_scaler.commands._flags import DEFAULT_MODELS, add_trace_flags


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "evaluate",
        help="walk-forward evaluation of forecasters on a trace",
        description=(
            "Train on the first --min-history of the trace, then walk forward week by week "
            "(refit and recalibrate weekly) and print, per model and horizon, MAE, WAPE, MAPE "
            "(non-zero actuals), MASE, pinball loss and coverage at --quantile, and fit seconds."
        ),
    )
    p.add_argument("--trace", required=True, help="timestamp,value CSV or Parquet file")
    p.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated kinds (default {DEFAULT_MODELS})")
    p.add_argument("--horizons", default="10m,20m,30m", help="comma-separated horizons, 5m–60m (default 10m,20m,30m)")
    p.add_argument("--quantile", type=float, default=0.95, help="target quantile probability (default 0.95)")
    p.add_argument("--value-kind", choices=("rate", "count"), default="rate",
                   help="values are a rate (averaged when merging steps) or a count per step (summed)")
    p.add_argument("--min-history", default="14d", help="initial training period (default 14d; lower warns)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    add_trace_flags(p)
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
        raise ConfigError(str(exc), field="horizons") from exc
    min_history = positive_duration("--min-history", args.min_history)
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

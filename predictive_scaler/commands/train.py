"""`predictive-scaler train`: train the best model for a trace and publish it into a model store

Evaluate the candidate models walk-forward on the trace, select the best by pinball loss at
--quantile (coverage as a guard), fit it on recent history, calibrate it out of sample, and
publish it as a new serving version in the model store at --out
(<out>/<name>/versions/<version>/{model.json,manifest.json} and <out>/<name>/serving).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from predictive_scaler.commands._flags import DEFAULT_MODELS, add_command, add_trace_flags


def register(subparsers: Any) -> None:
    p = add_command(subparsers, __doc__)
    p.add_argument("--trace", required=True, help="timestamp,value CSV or Parquet file")
    p.add_argument("--out", required=True, help="model store: a directory (created if missing) or s3://bucket/prefix")
    p.add_argument("--s3-endpoint-url", help="endpoint of an S3-compatible object store for an s3:// --out "
                                             "(default: $AWS_ENDPOINT_URL_S3, else AWS S3)")
    p.add_argument("--name", help="model name in the store (default: the trace's file name without extension)")
    p.add_argument("--series", help="series the model is for, checked when it is loaded (default: --name)")
    p.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated candidate kinds (default {DEFAULT_MODELS})")
    p.add_argument("--quantile", type=float, default=0.95, help="target quantile probability (default 0.95)")
    p.add_argument("--horizon", default="30m", help="longest horizon the model is selected for, 5m–60m (default 30m)")
    p.add_argument("--value-kind", choices=("rate", "count"), default="rate",
                   help="values are a rate (averaged when merging steps) or a count per step (summed)")
    p.add_argument("--min-history", default="14d", help="history required before the first scored week (default 14d; lower warns)")
    p.add_argument("--keep", type=int, default=5, help="versions kept in the store for rollback (default 5)")
    p.add_argument("--no-serve", action="store_true", help="publish the version without making it the serving one")
    add_trace_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tqdm import tqdm

    from predictive_scaler.commands._flags import check_output, max_missing, positive_duration
    from predictive_scaler.commands.models import open_store_flag
    from predictive_scaler.errors import ConfigError, DataError
    from predictive_scaler.forecasting.evaluation import EvaluationSettings, model_series
    from predictive_scaler.forecasting.registry import parse_kinds
    from predictive_scaler.forecasting.selection import planned_training_fits, train_model
    from predictive_scaler.forecasting.store import (
        ModelStore,
        TrainingWindow,
        check_model_name,
        is_object_store_url,
    )
    from predictive_scaler.series import format_duration, load_trace, parse_duration

    kinds = parse_kinds(args.models)
    try:
        horizon = parse_duration(args.horizon)
    except DataError as exc:
        raise ConfigError(f"--horizon: {exc}", field="horizon") from exc
    min_history = positive_duration("--min-history", args.min_history)
    name = args.name or Path(args.trace).stem
    series_name = args.series or name
    if not is_object_store_url(args.out):
        check_output("--out", args.out, directory=True)  # before the expensive training run
    store = open_store_flag(args.out, "--out", keep=args.keep, endpoint=args.s3_endpoint_url, must_exist=False)
    check_model_name(name)  # validates the name before an expensive training run
    try:
        check_model_name(series_name, what="series")  # the series name follows the same rules
    except ConfigError as exc:
        raise ConfigError(f"--series: {exc}", field="series") from exc
    series = load_trace(args.trace, value_kind=args.value_kind, min_history=min_history, name=series_name,
                        timezone=args.timezone, max_missing=max_missing(args))
    horizons = tuple(sorted({h for h in EvaluationSettings().horizons if h <= horizon} | {horizon}))
    settings = EvaluationSettings(quantile=args.quantile, horizons=horizons, min_history=min_history)
    total = planned_training_fits(series, kinds, settings)
    with tqdm(total=total, desc="train", unit="fit", file=sys.stderr, disable=None) as bar:
        result = train_model(series, kinds, args.quantile, horizon, min_history=min_history,
                             settings=settings, progress=bar)
    grid = model_series(series, result.model.step_seconds)
    metrics = dict(result.metrics)
    metrics["fit_seconds_final"] = result.fit_seconds
    version = store.publish(name, result.model, series=series_name, window=TrainingWindow.of(grid),
                            metrics=metrics, serve=not args.no_serve)

    print(f"trained {name!r} on {series.source} ({format_duration(grid.span)} at {grid.step_seconds}s)")
    members = f"{result.model.base_kind}, " if result.kind == "combination" else ""  # type: ignore[attr-defined]
    print(f"selected: {result.kind} ({members}calibrated), fit {result.fit_seconds:.2f}s")
    chosen = metrics.get("models", {}).get(result.kind, {}).get("horizons", {})
    for label, row in chosen.items():
        cells = ", ".join(f"{k} {_fmt(v)}" for k, v in row.items())
        print(f"  {label}: {cells}")
    state = "serving" if not args.no_serve else "published, not serving"
    where = store.version_dir(name, version) if isinstance(store, ModelStore) else f"{store.location}/{name}"
    print(f"version {version} ({state}) in {where}")
    return 0


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)

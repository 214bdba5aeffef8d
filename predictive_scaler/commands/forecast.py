"""`predictive-scaler forecast`: print P50/P95 per step from a trained model and a trace

Load a model (verified against its manifest) and forecast the steps after --at using the trace's
observations up to --at only. --model is an artifact directory (holding manifest.json), a store
entry <store>/<name> (its serving version), or a store with --name.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from predictive_scaler.commands._flags import add_command, add_trace_flags


def register(subparsers: Any) -> None:
    p = add_command(subparsers, __doc__)
    p.add_argument("--model", required=True, help="artifact directory, store entry, or store root (a directory or "
                                                   "s3://bucket/prefix) with --name")
    p.add_argument("--name", help="model name when --model is a store root")
    p.add_argument("--trace", required=True, help="timestamp,value CSV or Parquet file with the recent observations")
    p.add_argument("--at", help="forecast as of this ISO-8601 time (default: the last step of the trace); without an "
                                "offset it is in --timezone, else UTC")
    p.add_argument("--horizon", default="30m", help="how far ahead, 5m–60m, a multiple of the model step (default 30m)")
    p.add_argument("--quantiles", default="0.5,0.95", help="probabilities to print (default 0.5,0.95)")
    p.add_argument("--series", help="refuse a model trained for another series than this one")
    p.add_argument("--value-kind", choices=("rate", "count"), default="rate",
                   help="values are a rate (averaged when merging steps) or a count per step (summed)")
    p.add_argument("--json", action="store_true", help="print the forecast as one JSON document")
    add_trace_flags(p, history=False)
    p.set_defaults(func=run)


def resolve_model(model: str | Path, name: str | None = None, *, expected_series: str | None = None) -> Any:
    """Load a verified model from an artifact dir, a store entry, or a store root + name."""
    from predictive_scaler.errors import ModelError
    from predictive_scaler.forecasting.store import (
        MANIFEST_FILE,
        SERVING_FILE,
        ModelStore,
        is_object_store_url,
        load_artifact,
    )
    from predictive_scaler.yaml_input import describe

    if is_object_store_url(model):
        from predictive_scaler.commands.models import open_store_flag

        store = open_store_flag(str(model), "--model")
        names = [name] if name is not None else store.names()
        if len(names) != 1:
            raise ModelError(f"{model}: holds {', '.join(names) or 'no models'}; name one with --name")
        return store.serving(names[0], expected_series=expected_series)
    path = Path(model)
    if name is not None:
        return ModelStore(path).serving(name, expected_series=expected_series)
    if not path.is_dir():
        what = describe(path)
        problem = "no such directory" if what is None else f"is {what}, not a directory"
        raise ModelError(f"{path}: {problem}; give a model artifact directory, a store entry <store>/<name>, or a "
                         "store with --name — train one with `predictive-scaler train --out DIR`")
    if (path / MANIFEST_FILE).exists():
        return load_artifact(path, expected_series=expected_series)
    if (path / SERVING_FILE).exists():
        return ModelStore(path.parent).serving(path.name, expected_series=expected_series)
    names = ModelStore(path).names()
    if len(names) == 1:
        return ModelStore(path).serving(names[0], expected_series=expected_series)
    hint = f"; this store holds {', '.join(names)} — add --name" if names else ""
    raise ModelError(
        f"{path}: neither a model artifact (no {MANIFEST_FILE}) nor a store entry (no {SERVING_FILE}){hint}; "
        "train one with `predictive-scaler train --out DIR`"
    )


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from predictive_scaler.commands._flags import parse_time_flag
    from predictive_scaler.errors import ConfigError, DataError
    from predictive_scaler.forecasting.base import check_quantiles
    from predictive_scaler.forecasting.evaluation import MAX_HORIZON, MIN_HORIZON, horizon_steps
    from predictive_scaler.series import format_duration, load_trace, parse_duration

    try:
        horizon = parse_duration(args.horizon)
    except DataError as exc:
        raise ConfigError(f"--horizon: {exc}", field="horizon") from exc
    if not (MIN_HORIZON <= horizon <= MAX_HORIZON):
        raise ConfigError(f"horizon {format_duration(horizon)} is outside 5m–60m; choose one in that range", field="horizon")
    try:
        quantiles = check_quantiles([float(q) for q in args.quantiles.split(",") if q.strip()])
    except ValueError as exc:
        raise ConfigError(f"--quantiles {args.quantiles!r}: write probabilities like 0.5,0.95", field="quantiles") from exc

    loaded = resolve_model(args.model, args.name, expected_series=args.series)
    model = loaded.model
    steps = horizon_steps(horizon, model.step_seconds)
    if steps is None:
        raise ConfigError(
            f"horizon {format_duration(horizon)} is not a multiple of the model's "
            f"{format_duration(pd.Timedelta(seconds=model.step_seconds).to_pytimedelta())} step; choose one that is",
            field="horizon",
        )
    series = load_trace(args.trace, value_kind=args.value_kind, min_history=None, timezone=args.timezone)
    if args.at:
        at = parse_time_flag("--at", args.at, args.timezone)
        if not (series.start <= at <= series.last_time):
            raise ConfigError(
                f"--at {at.isoformat()} is outside the trace ({series.start.isoformat()} – "
                f"{series.last_time.isoformat()}); choose a time inside it",
                field="at",
            )
        recent = series.until(at)
    else:
        recent = series
    # On a coarser model grid the last bucket must be complete, or a partial step reads as a dip.
    if model.step_seconds > recent.step_seconds:
        end = recent.last_time + pd.Timedelta(seconds=recent.step_seconds)
        boundary = end.floor(f"{model.step_seconds}s")  # model buckets are aligned on the epoch
        if boundary > recent.start:
            recent = recent.slice(0, recent.index_at(boundary))
    forecast = model.forecast(recent, steps, quantiles)

    if args.json:
        doc = forecast.to_dict()
        doc["version"] = loaded.path.name
        doc["series"] = loaded.manifest.series
        print(json.dumps(doc, allow_nan=False, indent=2))
        return 0
    base = loaded.manifest.base_kind or loaded.manifest.kind
    print(f"model {base} ({loaded.manifest.kind}) from {loaded.path}, trained for {loaded.manifest.series!r}")
    print(f"issued at {forecast.issued_at.isoformat()} (last observed step), step {forecast.step_seconds}s")
    header = ["time", *(f"P{q * 100:g}" for q in quantiles)]
    rows = [header] + [
        [t.strftime("%Y-%m-%dT%H:%M:%SZ"), *(f"{forecast.values[k, h]:.2f}" for k in range(len(quantiles)))]
        for h, t in enumerate(forecast.times())
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths, strict=True))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    return 0

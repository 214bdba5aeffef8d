"""The demand of `backtest --prometheus URL --scaler FILE.yaml`: the scaler's demand query pulled
from the cluster's own Prometheus exactly as the weekly retraining job pulls it
(:func:`~predictive_scaler.retrain.history.history_for_scaler`)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from predictive_scaler.retrain.settings import ScalerTarget
    from predictive_scaler.series import Series

#: History pulled by default with --prometheus: the 14 days the models need plus a week to evaluate.
DEFAULT_HISTORY_DAYS = 21.0
#: Share of missing steps accepted in a pulled history (the retraining job's default).
DEFAULT_MAX_MISSING = 0.2


def check_flags(args: argparse.Namespace) -> None:
    """Refuse a second source of demand, and a pull without the manifest that names the query."""
    from predictive_scaler.errors import ConfigError

    if args.trace is not None:
        raise ConfigError("--trace and --prometheus are two sources of demand; give one: --trace FILE for a "
                          "trace file, or --prometheus URL --scaler FILE.yaml for your own history",
                          field="prometheus")
    if args.scaler is None:
        raise ConfigError("--prometheus needs --scaler FILE.yaml: the PredictiveScaler manifest whose demand "
                          "query is pulled", field="scaler")


def demand(args: argparse.Namespace, target: ScalerTarget) -> Series:
    """The pulled history, also written to ``--save-history`` when given."""
    trace = pull(args, target)
    if args.save_history is not None:
        args.save_history.write_text(history_csv(trace))
    return trace


def pull(args: argparse.Namespace, target: ScalerTarget) -> Series:
    import os
    from datetime import UTC, datetime

    from predictive_scaler.commands._flags import parse_time_flag, prometheus_auth
    from predictive_scaler.errors import (
        ConfigError,
        DataError,
        InsufficientHistoryError,
        SourceError,
    )
    from predictive_scaler.retrain.history import demand_query, history_for_scaler
    from predictive_scaler.series import parse_duration
    from predictive_scaler.sources.prometheus import (
        ImpossibleValueError,
        PrometheusSource,
        redact_url,
    )

    assert target.spec is not None
    if not args.days > 0:
        raise ConfigError(f"--days must be positive, got {args.days:g}; 21 gives two weeks to train and one "
                          "to evaluate", field="days")
    end = datetime.now(UTC)
    if args.end:
        end = parse_time_flag("--end", args.end).to_pydatetime()
    try:
        min_history = parse_duration(args.min_history)
    except DataError as exc:
        raise ConfigError(f"--min-history: {exc}", field="min_history") from exc
    query = demand_query(target.spec, target.namespace)
    where = f"{target.key}'s demand ({query}) from {redact_url(args.prometheus)}, {args.days:g} days to {end.isoformat()}"
    source = PrometheusSource(args.prometheus, timeout=args.timeout, timeout_setting="--timeout",
                              auth=prometheus_auth(args, os.environ))
    max_missing = DEFAULT_MAX_MISSING if args.max_missing is None else args.max_missing
    try:
        series = history_for_scaler(source, target.spec, end, args.days, namespace=target.namespace,
                                    min_history=min_history, max_missing_fraction=max_missing)
    except InsufficientHistoryError as exc:
        raise InsufficientHistoryError(f"{where}: {exc}; pull more with --days, check --end, or wait until "
                                       "the metric has 14 days") from exc
    except ImpossibleValueError as exc:  # before SourceError, its other base: it keeps its type
        raise ImpossibleValueError(f"{where}: {exc}") from exc
    except SourceError as exc:
        raise SourceError(f"{where}: {exc}") from exc
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from exc
    return replace(series, source=f"{redact_url(args.prometheus)} {query}")


def history_csv(series: Series) -> str:
    """``series`` as a timestamp,value CSV that ``--trace`` reads back identically (gaps as empty values)."""
    import numpy as np
    import pandas as pd

    stamps = series.start + pd.to_timedelta(np.arange(len(series)) * series.step_seconds, unit="s")
    lines = ["timestamp,value"]
    lines += [f"{t.strftime('%Y-%m-%dT%H:%M:%SZ')},{'' if not np.isfinite(v) else repr(float(v))}"
              for t, v in zip(stamps, series.values, strict=True)]
    return "\n".join(lines) + "\n"

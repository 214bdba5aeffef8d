"""The demand of `backtest --trace FILE`: a timestamp,value trace file (the bundled one by default)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from predictive_scaler.series import Series

#: The bundled trace `make demo` runs on.
BUNDLED_TRACE = Path(__file__).resolve().parents[2] / "backtests" / "traces" / "nasa_http_1995.csv"
#: Share of missing steps accepted in a trace file (series.DEFAULT_MAX_MISSING).
TRACE_MAX_MISSING = 0.5


def check_flags(args: argparse.Namespace) -> None:
    """Refuse the flags that only a pulled history has, before anything is read."""
    from predictive_scaler.errors import ConfigError

    for flag, value in (("--end", args.end), ("--save-history", args.save_history)):
        if value is not None:
            raise ConfigError(f"{flag} applies to --prometheus history only; drop it or use --prometheus",
                              field=flag.strip("-"))


def demand(args: argparse.Namespace) -> Series:
    """The trace (``--trace``, else the bundled one), refused when it misses too many steps."""
    from predictive_scaler.series import check_missing, load_trace

    trace = load_trace(args.trace or BUNDLED_TRACE, value_kind=args.value_kind, min_history=None,
                       timezone=args.timezone)
    check_missing(trace, TRACE_MAX_MISSING if args.max_missing is None else args.max_missing)
    return trace

"""`predictive-scaler backtest`: replay a trace through every policy on a simulated GPU cluster."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: The bundled trace `make demo` runs on.
BUNDLED_TRACE = Path(__file__).resolve().parents[2] / "backtests" / "nasa_http_1995.csv"


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "backtest",
        help="replay a trace through the predictive, reactive, static, Holt-Winters and oracle policies",
        description="Replay a demand trace through the controller's own reconciler and its peers on a "
                    "simulated GPU cluster; report SLO, GPU-hours, wasted prewarm cost and forecast accuracy.",
    )
    p.add_argument("--trace", type=Path, default=None,
                   help=f"timestamp,value CSV or Parquet trace (default: the bundled {BUNDLED_TRACE.name})")
    p.add_argument("--scenario", type=Path, default=None, help="scenario YAML (default: backtests/default.yaml)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout (nulls for undefined)")
    p.add_argument("--report", type=Path, default=None, metavar="DIR",
                   help="write report.md, report.html (self-contained) and PNG plots into DIR")
    p.add_argument("--peak-replicas", type=int, default=None, metavar="N",
                   help="size demand so the training window's P95 needs N replicas (max replicas 2N)")
    p.add_argument("--capacity-per-replica", type=float, default=None, metavar="X",
                   help="demand one replica serves, in the trace's unit (overrides --peak-replicas)")
    p.add_argument("--value-kind", choices=("rate", "count"), default="rate",
                   help="whether trace values are rates (default) or counts per step")
    p.add_argument("--policies", default=None, help="comma-separated subset of the scenario's policies")
    p.add_argument("--evaluation", default=None, metavar="DURATION",
                   help="walk forward over at most this span after training (e.g. 7d)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from predictive_scaler.backtest.report import terminal_table, verdict, write_report
    from predictive_scaler.backtest.runner import run_backtest
    from predictive_scaler.backtest.scenario import Scenario, load_scenario
    from predictive_scaler.errors import ConfigError
    from predictive_scaler.series import load_trace, parse_duration

    scenario = load_scenario(args.scenario)
    changes: dict[str, Any] = {}
    if args.peak_replicas is not None:
        changes["peak_replicas"] = args.peak_replicas
    if args.capacity_per_replica is not None:
        changes["capacity_per_replica"] = args.capacity_per_replica
    if args.policies:
        changes["policies"] = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    if args.evaluation:
        changes["evaluation"] = parse_duration(args.evaluation)
    if changes:
        try:
            scenario = replace(scenario, **changes)
        except TypeError as exc:  # pragma: no cover - guarded by argparse
            raise ConfigError(str(exc)) from exc
    assert isinstance(scenario, Scenario)
    trace = load_trace(args.trace or BUNDLED_TRACE, value_kind=args.value_kind, min_history=None)

    bars: list[Any] = []

    def progress_factory(name: str, total: int) -> Any:
        if args.no_progress:
            return None
        from tqdm import tqdm

        bar = tqdm(total=total, desc=f"{name:>12}", unit="tick", file=sys.stderr, leave=False, mininterval=0.5)
        bars.append(bar)
        return bar.update

    result = run_backtest(trace, scenario, progress_factory=progress_factory)
    for bar in bars:
        bar.close()
    where = write_report(result, args.report) if args.report else None
    if args.json:
        print(json.dumps(result.to_json(), allow_nan=False, indent=2))
    else:
        setup = result.setup
        print(f"trace: {setup.trace.source}  scenario: {scenario.name} (preset {scenario.preset})")
        print(f"training {setup.describe()['training']}, evaluated {setup.describe()['evaluation']} from "
              f"{setup.eval_start.isoformat()}; capacity {setup.capacity_per_replica:.4g}/replica, "
              f"peak {setup.peak_replicas}, max {setup.max_replicas} replicas")
        print(json.dumps(result.to_json()["scenario"], separators=(",", ":")))
        print()
        print(terminal_table(result))
        print()
        for line in verdict(result):
            print(f"  {line}")
    if where is not None:
        print(f"report: {where}  (Markdown: {where.with_name('report.md')})", file=sys.stderr if args.json else sys.stdout)
    return 0

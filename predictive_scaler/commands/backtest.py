"""`predictive-scaler backtest`: replay a trace through every policy on a simulated GPU cluster.

The demand comes from a trace file (``--trace``, :mod:`.backtest_trace`) or from the cluster's
own Prometheus (``--prometheus URL --scaler FILE.yaml``, :mod:`.backtest_prometheus`): the
scaler's demand query pulled exactly as the weekly retraining job pulls it
(:func:`~predictive_scaler.retrain.history.history_for_scaler`). With ``--scaler`` the
PredictiveScaler manifest is laid over the scenario (:mod:`.backtest_scaler`): every setting
the manifest gives explicitly wins, settings it leaves to the CRD default come from the
scenario, and the printed scenario says which is which.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from predictive_scaler.commands import backtest_prometheus, backtest_trace
from predictive_scaler.commands._flags import add_prometheus_auth_flags
from predictive_scaler.commands.backtest_prometheus import (
    DEFAULT_HISTORY_DAYS,
    DEFAULT_MAX_MISSING,
)
from predictive_scaler.commands.backtest_scaler import (
    ScalerScenario,
    pick_scaler,
    print_origins,
    scenario_for_scaler,
    spec_doc,
)
from predictive_scaler.commands.backtest_trace import BUNDLED_TRACE, TRACE_MAX_MISSING

if TYPE_CHECKING:
    from predictive_scaler.backtest.frontier import FrontierResult
    from predictive_scaler.backtest.runner import FrontierPoints, Result
    from predictive_scaler.backtest.scenario import Scenario
    from predictive_scaler.retrain.settings import ScalerTarget
    from predictive_scaler.series import Series

__all__ = ["PlainProgress", "register", "run"]

#: Most history ``--days`` pulls: ten years, more than any metrics store keeps at a resolution worth
#: backtesting (and, at one minute, within the steps a trace may hold).
MAX_HISTORY_DAYS = 3650.0
#: Longest ``--timeout`` per Prometheus request: an hour (a longer wait is a hang, not a slow query).
MAX_TIMEOUT_SECONDS = 3600.0


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "backtest",
        help="replay a trace through the predictive, reactive, static, Holt-Winters and oracle policies",
        description="Replay a demand trace through the controller's own reconciler and its peers on a "
                    "simulated GPU cluster; report SLO, GPU-hours, wasted prewarm cost and forecast accuracy. "
                    "The demand comes from a trace file (--trace) or from your own Prometheus "
                    "(--prometheus URL --scaler FILE.yaml), pulled as the weekly retraining job pulls it.",
    )
    p.add_argument("--trace", type=Path, default=None,
                   help=f"timestamp,value CSV or Parquet trace (default: the bundled {BUNDLED_TRACE.name})")
    p.add_argument("--prometheus", default=None, metavar="URL",
                   help="pull the --scaler's demand history from this Prometheus instead of a trace file")
    p.add_argument("--scaler", type=Path, default=None, metavar="FILE.yaml",
                   help="PredictiveScaler manifest: its spec is laid over the scenario (explicit settings win); "
                        "required with --prometheus, allowed with --trace")
    p.add_argument("--name", default=None, help="which PredictiveScaler of a --scaler file holding several")
    p.add_argument("--days", type=float, default=DEFAULT_HISTORY_DAYS,
                   help=f"with --prometheus: days of history to pull (default {DEFAULT_HISTORY_DAYS:g}; "
                        "at least 14 observed are required)")
    p.add_argument("--end", default=None, metavar="TIME",
                   help="with --prometheus: end of the history, ISO-8601 (default: now)")
    p.add_argument("--min-history", default="14d",
                   help="with --prometheus: observed history required (default 14d)")
    p.add_argument("--max-missing", type=float, default=None,
                   help=f"largest share of missing steps accepted (default {DEFAULT_MAX_MISSING} with --prometheus, "
                        f"{TRACE_MAX_MISSING} for a trace file)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="with --prometheus: seconds per Prometheus request (default 30)")
    p.add_argument("--save-history", type=Path, default=None, metavar="FILE.csv",
                   help="with --prometheus: also write the pulled history as a timestamp,value CSV (a --trace)")
    add_prometheus_auth_flags(p)
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
    p.add_argument("--frontier", action="store_true",
                   help="also run each tunable policy over its own knob (reactive and Holt-Winters over target "
                        "utilisation 0.3…0.95, the predictive policy over its planning target, static over fleet "
                        "sizes) and report cost–service frontiers and the headline figures against them")
    p.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    p.add_argument("--timezone", default=None, metavar="ZONE",
                   help="time zone of trace timestamps written without a UTC offset (IANA name: UTC, "
                        "Europe/Berlin …); without it such timestamps are refused")
    p.set_defaults(func=run)


# -- the command ------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:
    """Check every flag, build the scenario, read the demand from its source, replay it, report."""
    prometheus = args.prometheus is not None
    if prometheus:
        backtest_prometheus.check_flags(args)
    else:
        backtest_trace.check_flags(args)
    _check_flags(args)
    scenario, target, mapped = _scenario(args, per_second=prometheus)
    if prometheus:
        assert target is not None
        trace = backtest_prometheus.demand(args, target)
    else:
        trace = backtest_trace.demand(args)
    from predictive_scaler.errors import ConfigError

    try:
        if scenario.scalers:  # several scalers sharing one cluster budget (backtest/fleet.py)
            return _run_fleet(args, trace, scenario)
        return _run_policies(args, trace, scenario, target, mapped)
    except ConfigError as exc:
        # A setting refused once the trace is read (sizing, the work bound): say which file it is in.
        raise type(exc)(f"{_settings_files(args)}: {exc}", field=exc.field) from exc


def _settings_files(args: argparse.Namespace) -> str:
    """Where the settings of this run are: the scenario file, and the scaler manifest laid over it."""
    from predictive_scaler.backtest.scenario import default_scenario_path

    scenario = args.scenario or default_scenario_path()
    return f"{args.scaler} (over the scenario {scenario})" if args.scaler is not None else str(scenario)


def _check_flags(args: argparse.Namespace) -> None:
    """Every output is checked before the (long) run: a bad path must not cost the whole backtest."""
    from predictive_scaler.commands._flags import at_most, check_output
    from predictive_scaler.errors import ConfigError
    from predictive_scaler.series import parse_timezone

    if args.report is not None:
        check_output("--report", args.report, directory=True)
        from predictive_scaler.backtest.report import require_matplotlib

        require_matplotlib()  # the report's extra missing must not cost the whole replay either
    if args.save_history is not None:
        check_output("--save-history", args.save_history, directory=False)
    if args.timezone is not None:
        parse_timezone(args.timezone)
    if args.max_missing is not None and not 0.0 <= args.max_missing <= 1.0:
        raise ConfigError(f"--max-missing {args.max_missing:g} is not a share; give one between 0 and 1",
                          field="max_missing")
    if args.prometheus is not None:
        at_most("--days", args.days, MAX_HISTORY_DAYS, "days of history to pull (21 gives two weeks to train and "
                "one to evaluate)")
        at_most("--timeout", args.timeout, MAX_TIMEOUT_SECONDS, "seconds to wait for each Prometheus request "
                "(default 30)")


def _scenario(args: argparse.Namespace, *, per_second: bool,
              ) -> tuple[Scenario, ScalerTarget | None, ScalerScenario | None]:
    """The scenario file, the ``--scaler`` manifest laid over it, then the flags that change it."""
    from predictive_scaler.backtest.scenario import Scenario, load_scenario

    scenario = load_scenario(args.scenario)
    target = pick_scaler(args.scaler, args.name) if args.scaler is not None else None
    mapped: ScalerScenario | None = None
    if target is not None:
        assert target.spec is not None
        mapped = scenario_for_scaler(scenario, spec_doc(args.scaler, target), per_second=per_second)
        scenario = mapped.scenario
    scenario = _with_flags(scenario, args)
    assert isinstance(scenario, Scenario)
    return scenario, target, mapped


def _with_flags(scenario: Scenario, args: argparse.Namespace) -> Scenario:
    from predictive_scaler.errors import ConfigError

    changes: dict[str, Any] = {}
    if args.peak_replicas is not None:
        changes["peak_replicas"] = args.peak_replicas
    if args.capacity_per_replica is not None:
        changes["capacity_per_replica"] = args.capacity_per_replica
    if args.policies:
        changes["policies"] = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    if args.evaluation is not None:
        changes["evaluation"] = _evaluation(args.evaluation)
    if not changes:
        return scenario
    try:
        return replace(scenario, **changes)
    except TypeError as exc:  # pragma: no cover - guarded by argparse
        raise ConfigError(str(exc)) from exc
    except ConfigError as exc:
        flag = "--" + (exc.field or "").replace("_", "-")
        given = [f"--{k.replace('_', '-')}" for k in changes]
        if flag in given:  # a flag's value refused: name the flag
            raise type(exc)(f"{flag}: {exc}; give another value", field=exc.field) from exc
        raise


def _evaluation(text: str) -> timedelta:
    """``--evaluation``: a positive duration."""
    from predictive_scaler.errors import ConfigError, DataError
    from predictive_scaler.series import parse_duration

    try:
        evaluation = parse_duration(text)
    except DataError as exc:
        raise ConfigError(f"--evaluation: {exc}", field="evaluation") from exc
    if evaluation <= timedelta(0):
        raise ConfigError(f"--evaluation {text!r} is not a positive duration; give the span to "
                          "walk forward, e.g. --evaluation 7d", field="evaluation")
    return evaluation


def _run_fleet(args: argparse.Namespace, trace: Series, scenario: Scenario) -> int:
    """Several scalers sharing one cluster budget: exit 1 when the fleet ever held more than it."""
    from predictive_scaler.backtest.fleet import run_fleet

    fleet = run_fleet(trace, scenario).to_dict()
    print(json.dumps(fleet, allow_nan=False, indent=2 if args.json else None))
    return 0 if fleet["minutes_over_cluster_budget"] == 0 else 1


def _run_policies(args: argparse.Namespace, trace: Series, scenario: Scenario, target: ScalerTarget | None,
                  mapped: ScalerScenario | None) -> int:
    """Every policy of the scenario over ``trace`` (and their frontiers with ``--frontier``), then the report."""
    from predictive_scaler.backtest.report import write_report

    progress = _Progress(quiet=args.no_progress)
    result, frontier = _simulate(args, trace, scenario, progress)
    progress.close()
    # Settings that are valid but defeat part of their purpose (a lead time beyond the horizon …).
    result.notes += [n for n in result.setup.spec.advisories() if n not in result.notes]
    where = write_report(result, args.report, frontier=frontier) if args.report else None
    doc = result.to_json() if frontier is None else frontier.to_json()
    if target is not None and mapped is not None:
        doc["scenario"]["scaler"] = {"name": target.key, "manifest": str(args.scaler), **mapped.describe()}
    if args.json:
        print(json.dumps(doc, allow_nan=False, indent=2))
    else:
        _print_text(args, scenario, result, frontier, doc, target, mapped)
    if where is not None:
        print(f"report: {where}  (Markdown: {where.with_name('report.md')})", file=sys.stderr if args.json else sys.stdout)
    return 0


def _simulate(args: argparse.Namespace, trace: Series, scenario: Scenario,
              progress: _Progress) -> tuple[Result, FrontierResult | None]:
    from predictive_scaler.backtest.runner import run_backtest

    if not args.frontier:
        return run_backtest(trace, scenario, progress_factory=progress.factory), None
    from predictive_scaler.backtest.frontier import run_frontier
    from predictive_scaler.backtest.records import prepare
    from predictive_scaler.backtest.runner import check_work

    check_work(prepare(trace, scenario), frontier_points())  # every frontier point, before the first runs

    def say(text: str) -> None:
        if not args.no_progress:
            print(f"frontier: {text}", file=sys.stderr, flush=True)

    frontier = run_frontier(trace, scenario, progress_factory=progress.factory, say=say)
    return frontier.base, frontier


def frontier_points() -> FrontierPoints:
    """The operating points ``--frontier`` runs besides the backtest's own (for the work bound)."""
    from predictive_scaler.backtest.frontier import HPA_TARGETS, PREDICTIVE_TARGETS, static_sizes
    from predictive_scaler.backtest.runner import FrontierPoints

    return FrontierPoints(HPA_TARGETS, PREDICTIVE_TARGETS, static_sizes, service_alternative=True)


def _print_text(args: argparse.Namespace, scenario: Scenario, result: Result, frontier: FrontierResult | None,
                doc: dict[str, Any], target: ScalerTarget | None, mapped: ScalerScenario | None) -> None:
    from predictive_scaler.backtest.report import terminal_table, verdict

    setup = result.setup
    print(f"trace: {setup.trace.source}  scenario: {scenario.name} (preset {scenario.preset})")
    if target is not None and mapped is not None:
        print_origins(target.key, args.scaler, scenario, mapped)
    print(f"training {setup.describe()['training']}, evaluated {setup.describe()['evaluation']} from "
          f"{setup.eval_start.isoformat()}; capacity {setup.capacity_per_replica:.4g}/replica, "
          f"peak {setup.peak_replicas}, max {setup.max_replicas} replicas")
    print(json.dumps(doc["scenario"], separators=(",", ":")))
    print()
    print(terminal_table(result))
    print()
    for line in verdict(result, frontier):
        print(f"  {line}")
    for note in result.notes:
        print(f"  note: {note}")
    if frontier is not None:
        from predictive_scaler.backtest.report import frontier_text

        print()
        print(frontier_text(frontier))


class _Progress:
    """Each policy run's progress on stderr: tqdm bars on a terminal, plain lines when piped or
    logged, nothing with ``--no-progress``."""

    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet
        self.bars: list[Any] = []

    def factory(self, name: str, total: int) -> Any:
        if self.quiet:
            return None
        if not sys.stderr.isatty():  # piped or logged: plain lines, no carriage returns
            return PlainProgress(name, total, sys.stderr).update
        from tqdm import tqdm

        bar = tqdm(total=total, desc=f"{name:>12}", unit="tick", file=sys.stderr, leave=False, mininterval=0.5)
        self.bars.append(bar)
        return bar.update

    def close(self) -> None:
        for bar in self.bars:
            bar.close()


class PlainProgress:
    """Progress as plain lines (every 10 %), for a stderr that is not a terminal."""

    def __init__(self, name: str, total: int, stream: Any) -> None:
        self.name, self.total, self.stream = name, max(1, total), stream
        self.done, self.next_mark = 0, 10

    def update(self, n: int) -> None:
        self.done += n
        pct = 100 * self.done // self.total
        if pct >= self.next_mark:
            print(f"{self.name}: {pct} % ({self.done:,} of {self.total:,} ticks)", file=self.stream, flush=True)
            self.next_mark = (pct // 10 + 1) * 10

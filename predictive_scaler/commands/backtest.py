"""`predictive-scaler backtest`: replay a trace through every policy on a simulated GPU cluster.

The demand comes from a trace file (``--trace``) or from the cluster's own
Prometheus (``--prometheus URL --scaler FILE.yaml``): the scaler's demand query
pulled exactly as the weekly retraining job pulls it
(:func:`~predictive_scaler.retrain.history_for_scaler`). With ``--scaler`` the
PredictiveScaler manifest is laid over the scenario (:func:`scenario_for_scaler`):
every setting the manifest gives explicitly wins, settings it leaves to the CRD
default come from the scenario, and the printed scenario says which is which.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from predictive_scaler.backtest.scenario import Scenario
    from predictive_scaler.retrain import ScalerTarget
    from predictive_scaler.series import Series

#: The bundled trace `make demo` runs on.
BUNDLED_TRACE = Path(__file__).resolve().parents[2] / "backtests" / "traces" / "nasa_http_1995.csv"
#: History pulled by default with --prometheus: the 14 days the models need plus a week to evaluate.
DEFAULT_HISTORY_DAYS = 21.0
#: Share of missing steps accepted in a pulled history (the retraining job's default).
DEFAULT_MAX_MISSING = 0.2
#: Share of missing steps accepted in a trace file (series.DEFAULT_MAX_MISSING).
TRACE_MAX_MISSING = 0.5


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


# -- the manifest over the scenario (pure) --------------------------------------------------------

@dataclass(frozen=True)
class ScalerScenario:
    """A scenario with a PredictiveScaler's spec laid over it, and where each setting came from."""

    scenario: Scenario
    #: Scenario setting → the manifest field it was taken from.
    from_manifest: Mapping[str, str]
    #: Scenario settings the manifest left to the scenario (the CRD default would otherwise apply).
    from_scenario: tuple[str, ...]
    notes: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        return {"from_manifest": dict(self.from_manifest), "from_scenario": list(self.from_scenario),
                "notes": list(self.notes)}


#: Scenario settings a manifest can set; the others (preset, training, horizons, …) are the backtest's own.
_MAPPED = ("capacity_per_replica", "peak_replicas", "target_utilization", "demand_unit_seconds",
           "min_replicas", "max_replicas",
           "quantile", "control_period", "cluster.gpus_per_replica", "cluster.gpus_per_node",
           "cluster.price_per_gpu_hour", "cluster.pod_start_s", "cluster.model_load_s",
           "cluster.node_provision_s", "cluster.image_pull_s")


def scenario_for_scaler(base: Scenario, spec_doc: Mapping[str, Any], *, per_second: bool = False) -> ScalerScenario:
    """Lay a PredictiveScaler's camelCase ``spec`` over ``base``: what the manifest says explicitly wins.

    - Capacity always comes from the manifest (the CRD requires it): for ``requests`` demand a
      simulated replica serves ``requestsPerReplica`` and every policy plans on all of it
      (``target_utilization`` 1, as the controller does); for ``dcgm-busy-gpus`` a replica serves
      its GPUs fully busy and policies plan at ``gpuUtilizationTarget``. ``per_second``: request
      demand is per second (a Prometheus rate), so unserved requests count ``demand_unit_seconds`` 1.
    - ``minReplicas``, ``maxReplicas``, ``quantile``, ``controlPeriodSeconds``, ``gpusPerReplica``,
      ``prewarm.gpusPerNode`` and ``prewarm.budget.pricePerGpuHour`` replace the scenario's settings.
    - ``leadTimes`` reshape the simulated cluster so its warm and cold start times equal them,
      keeping the preset's proportions between their parts.
    - The whole spec is laid over the scenario's ``spec`` section for the predictive policy
      (``prewarm.budget`` as one setting: the manifest's budget replaces the scenario's), except
      ``mode``: the backtest simulates ``scale`` — ``forecast-only`` would do nothing to measure.
    """
    from predictive_scaler.backtest.runner import DEFAULT_MODEL_STEP, build_spec, deep_merge
    from predictive_scaler.errors import ConfigError
    from predictive_scaler.spec import ScalerSpec

    spec = ScalerSpec.from_dict(spec_doc)
    taken: dict[str, str] = {}
    notes: list[str] = []
    changes: dict[str, Any] = {}
    cluster: dict[str, Any] = {}

    def given(*path: str) -> bool:
        node: Any = spec_doc
        for key in path:
            if not isinstance(node, Mapping) or key not in node:
                return False
            node = node[key]
        return True

    if spec.demand.kind == "dcgm-busy-gpus":
        changes.update(capacity_per_replica=float(spec.gpus_per_replica), peak_replicas=None,
                       target_utilization=spec.capacity.gpu_utilization_target)
        taken.update(capacity_per_replica="spec.gpusPerReplica", peak_replicas="spec.demand.kind",
                     target_utilization="spec.capacity.gpuUtilizationTarget")
        notes.append("busy-GPU demand: a simulated replica serves its GPUs fully busy; every policy plans "
                     "at gpuUtilizationTarget")
    else:
        assert spec.capacity.requests_per_replica is not None  # the spec requires it for requests
        changes.update(capacity_per_replica=spec.capacity.requests_per_replica, peak_replicas=None,
                       target_utilization=1.0)
        taken.update(capacity_per_replica="spec.capacity.requestsPerReplica",
                     peak_replicas="spec.capacity.requestsPerReplica",
                     target_utilization="spec.capacity.requestsPerReplica")
        notes.append("request demand: a simulated replica serves requestsPerReplica and every policy plans on "
                     "all of it, as the controller does (target_utilization 1, no peak_replicas sizing)")
        if per_second:
            changes["demand_unit_seconds"] = 1.0
            taken["demand_unit_seconds"] = "spec.demand.query (a Prometheus rate is per second)"
    for key, field_name, value in (
        (("minReplicas",), "min_replicas", spec.min_replicas),
        (("maxReplicas",), "max_replicas", spec.max_replicas),
        (("quantile",), "quantile", spec.quantile),
        (("controlPeriodSeconds",), "control_period", timedelta(seconds=spec.control_period_seconds)),
    ):
        if given(*key):
            changes[field_name] = value
            taken[field_name] = "spec." + ".".join(key)
    cluster_settings: tuple[tuple[tuple[str, ...], str, float | None], ...] = (
        (("gpusPerReplica",), "gpus_per_replica", spec.gpus_per_replica),
        (("prewarm", "gpusPerNode"), "gpus_per_node", spec.prewarm.gpus_per_node),
        (("prewarm", "budget", "pricePerGpuHour"), "price_per_gpu_hour", spec.prewarm.budget.price_per_gpu_hour),
    )
    for path, setting, amount in cluster_settings:
        if given(*path):
            cluster[setting] = amount
            taken[f"cluster.{setting}"] = "spec." + ".".join(path)
    cfg = base.cluster
    warm = cfg.warm_start_s
    if given("leadTimes", "podStartSeconds"):
        warm = float(spec.lead_times.pod_start_seconds)
        cluster.update(_split(warm, ("pod_start_s", cfg.pod_start_s), ("model_load_s", cfg.model_load_s)))
        taken.update({"cluster.pod_start_s": "spec.leadTimes.podStartSeconds",
                      "cluster.model_load_s": "spec.leadTimes.podStartSeconds"})
    if given("leadTimes", "nodeStartSeconds"):
        node = spec.lead_times.node_start_seconds - warm
        if node < 0:
            raise ConfigError(
                f"spec.leadTimes.nodeStartSeconds ({spec.lead_times.node_start_seconds}) is shorter than the "
                f"warm start ({warm:g}s) the scenario's cluster takes; give podStartSeconds too, or raise it",
                field="spec.leadTimes.nodeStartSeconds")
        cluster.update(_split(node, ("node_provision_s", cfg.node_provision_s), ("image_pull_s", cfg.image_pull_s)))
        taken.update({"cluster.node_provision_s": "spec.leadTimes.nodeStartSeconds",
                      "cluster.image_pull_s": "spec.leadTimes.nodeStartSeconds"})
    if cluster:
        try:
            changes["cluster"] = cfg.with_overrides(**cluster)
        except ConfigError as exc:
            raise ConfigError(f"the manifest's spec does not fit the scenario's cluster: {exc}",
                              field=exc.field) from exc

    overlay = {k: v for k, v in spec_doc.items() if k != "mode"}
    if spec.model.step_seconds < DEFAULT_MODEL_STEP and isinstance(overlay.get("model"), Mapping):
        # The harness models finer histories at its own 5-minute step; the spec must say the same.
        overlay["model"] = {k: v for k, v in overlay["model"].items() if k != "stepSeconds"}
    if spec_doc.get("mode", "forecast-only") != "scale":
        notes.append(f"mode {spec.mode} in the manifest; the backtest simulates mode scale")
    planner_spec = dict(base.spec)
    if given("prewarm", "budget") and isinstance(planner_spec.get("prewarm"), Mapping):
        planner_spec["prewarm"] = {k: v for k, v in planner_spec["prewarm"].items() if k != "budget"}
    changes["spec"] = deep_merge(planner_spec, overlay)
    changes["name"] = base.name
    scenario = replace(base, **changes)
    # Validate now, as load_scenario does: errors name the field before any history is pulled.
    build_spec(scenario, capacity=scenario.capacity_per_replica or 1.0,
               max_replicas=scenario.resolved_max_replicas(scenario.peak_replicas or 1),
               model_step=max(DEFAULT_MODEL_STEP, spec.model.step_seconds))
    if spec.model.step_seconds < DEFAULT_MODEL_STEP:
        notes.append(f"history pulled at the manifest's {spec.model.step_seconds}s model step; the backtest "
                     f"models at {DEFAULT_MODEL_STEP}s")
    from_scenario = tuple(k for k in _MAPPED if k not in taken)
    return ScalerScenario(scenario=scenario, from_manifest=taken, from_scenario=from_scenario, notes=tuple(notes))


def _split(total: float, *parts: tuple[str, float]) -> dict[str, float]:
    """``total`` seconds shared among ``parts`` in the proportions of their current values."""
    have = sum(v for _, v in parts)
    if have <= 0:
        return {parts[0][0]: total, **{k: 0.0 for k, _ in parts[1:]}}
    return {k: total * v / have for k, v in parts}


def pick_scaler(path: Path, name: str | None) -> ScalerTarget:
    """The one PredictiveScaler of ``path`` (or the one called ``name``), with a valid spec."""
    from predictive_scaler.errors import ConfigError, did_you_mean
    from predictive_scaler.retrain import load_scalers_file

    every = load_scalers_file(path)
    targets = every
    if name is not None:
        targets = [t for t in every if name in (t.name, t.key)]
        if not targets:
            raise ConfigError(f"{path} holds no PredictiveScaler named {name!r}; "
                              f"{did_you_mean(name, [t.name for t in every])}it holds "
                              f"{', '.join(t.key for t in every)}", field="name")
    if len(targets) > 1:
        raise ConfigError(f"{path} holds {len(targets)} PredictiveScalers ({', '.join(t.key for t in targets)}); "
                          "choose one with --name", field="name")
    target = targets[0]
    if target.spec is None:
        raise ConfigError(f"{path}: PredictiveScaler {target.key} has an {target.problem}; fix the manifest "
                          "(`kubectl apply --dry-run=server -f` checks it against the CRD)", field="spec")
    return target


def history_csv(series: Series) -> str:
    """``series`` as a timestamp,value CSV that ``--trace`` reads back identically (gaps as empty values)."""
    import numpy as np
    import pandas as pd

    stamps = series.start + pd.to_timedelta(np.arange(len(series)) * series.step_seconds, unit="s")
    lines = ["timestamp,value"]
    lines += [f"{t.strftime('%Y-%m-%dT%H:%M:%SZ')},{'' if not np.isfinite(v) else repr(float(v))}"
              for t, v in zip(stamps, series.values, strict=True)]
    return "\n".join(lines) + "\n"


# -- the command ------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:
    from predictive_scaler.backtest.report import terminal_table, verdict, write_report
    from predictive_scaler.backtest.runner import run_backtest
    from predictive_scaler.backtest.scenario import Scenario, load_scenario
    from predictive_scaler.commands._flags import check_output
    from predictive_scaler.errors import ConfigError, DataError
    from predictive_scaler.series import check_missing, load_trace, parse_duration, parse_timezone

    if args.prometheus is not None and args.trace is not None:
        raise ConfigError("--trace and --prometheus are two sources of demand; give one: --trace FILE for a "
                          "trace file, or --prometheus URL --scaler FILE.yaml for your own history",
                          field="prometheus")
    if args.prometheus is not None and args.scaler is None:
        raise ConfigError("--prometheus needs --scaler FILE.yaml: the PredictiveScaler manifest whose demand "
                          "query is pulled", field="scaler")
    if args.prometheus is None:
        for flag, value in (("--end", args.end), ("--save-history", args.save_history)):
            if value is not None:
                raise ConfigError(f"{flag} applies to --prometheus history only; drop it or use --prometheus",
                                  field=flag.strip("-"))
    # Every output is checked before the (long) run: a bad path must not cost the whole backtest.
    if args.report is not None:
        check_output("--report", args.report, directory=True)
    if args.save_history is not None:
        check_output("--save-history", args.save_history, directory=False)
    if args.timezone is not None:
        parse_timezone(args.timezone)
    if args.max_missing is not None and not 0.0 <= args.max_missing <= 1.0:
        raise ConfigError(f"--max-missing {args.max_missing:g} is not a share; give one between 0 and 1",
                          field="max_missing")

    scenario = load_scenario(args.scenario)
    target = pick_scaler(args.scaler, args.name) if args.scaler is not None else None
    mapped: ScalerScenario | None = None
    if target is not None:
        assert target.spec is not None
        mapped = scenario_for_scaler(scenario, _spec_doc(args.scaler, target),
                                     per_second=args.prometheus is not None)
        scenario = mapped.scenario
    changes: dict[str, Any] = {}
    if args.peak_replicas is not None:
        changes["peak_replicas"] = args.peak_replicas
    if args.capacity_per_replica is not None:
        changes["capacity_per_replica"] = args.capacity_per_replica
    if args.policies:
        changes["policies"] = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    if args.evaluation is not None:
        try:
            evaluation = parse_duration(args.evaluation)
        except DataError as exc:
            raise ConfigError(f"--evaluation: {exc}", field="evaluation") from exc
        if evaluation <= timedelta(0):
            raise ConfigError(f"--evaluation {args.evaluation!r} is not a positive duration; give the span to "
                              "walk forward, e.g. --evaluation 7d", field="evaluation")
        changes["evaluation"] = evaluation
    if changes:
        try:
            scenario = replace(scenario, **changes)
        except TypeError as exc:  # pragma: no cover - guarded by argparse
            raise ConfigError(str(exc)) from exc
        except ConfigError as exc:
            flag = "--" + (exc.field or "").replace("_", "-")
            given = [f"--{k.replace('_', '-')}" for k in changes]
            if flag in given:  # a flag's value refused: name the flag
                raise type(exc)(f"{flag}: {exc}; give another value", field=exc.field) from exc
            raise
    assert isinstance(scenario, Scenario)

    if args.prometheus is not None:
        assert target is not None
        trace = _pull(args, target)
        if args.save_history is not None:
            args.save_history.write_text(history_csv(trace))
    else:
        trace = load_trace(args.trace or BUNDLED_TRACE, value_kind=args.value_kind, min_history=None,
                           timezone=args.timezone)
        check_missing(trace, TRACE_MAX_MISSING if args.max_missing is None else args.max_missing)

    bars: list[Any] = []

    def progress_factory(name: str, total: int) -> Any:
        if args.no_progress:
            return None
        if not sys.stderr.isatty():  # piped or logged: plain lines, no carriage returns
            return PlainProgress(name, total, sys.stderr).update
        from tqdm import tqdm

        bar = tqdm(total=total, desc=f"{name:>12}", unit="tick", file=sys.stderr, leave=False, mininterval=0.5)
        bars.append(bar)
        return bar.update

    if scenario.scalers:  # several scalers sharing one cluster budget (backtest/fleet.py)
        from predictive_scaler.backtest.fleet import run_fleet

        fleet = run_fleet(trace, scenario).to_dict()
        print(json.dumps(fleet, allow_nan=False, indent=2 if args.json else None))
        return 0 if fleet["minutes_over_cluster_budget"] == 0 else 1

    frontier = None
    if args.frontier:
        from predictive_scaler.backtest.frontier import run_frontier

        def say(text: str) -> None:
            if not args.no_progress:
                print(f"frontier: {text}", file=sys.stderr, flush=True)

        frontier = run_frontier(trace, scenario, progress_factory=progress_factory, say=say)
        result = frontier.base
    else:
        result = run_backtest(trace, scenario, progress_factory=progress_factory)
    for bar in bars:
        bar.close()
    where = write_report(result, args.report, frontier=frontier) if args.report else None
    doc = result.to_json() if frontier is None else frontier.to_json()
    if target is not None and mapped is not None:
        doc["scenario"]["scaler"] = {"name": target.key, "manifest": str(args.scaler), **mapped.describe()}
    if args.json:
        print(json.dumps(doc, allow_nan=False, indent=2))
    else:
        setup = result.setup
        print(f"trace: {setup.trace.source}  scenario: {scenario.name} (preset {scenario.preset})")
        if target is not None and mapped is not None:
            _print_origins(target.key, args.scaler, scenario, mapped)
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
    if where is not None:
        print(f"report: {where}  (Markdown: {where.with_name('report.md')})", file=sys.stderr if args.json else sys.stdout)
    return 0


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


def _spec_doc(path: Path, target: ScalerTarget) -> dict[str, Any]:
    """The raw camelCase spec of ``target`` in ``path`` (to know which settings it gives explicitly)."""
    import yaml

    for doc in yaml.safe_load_all(path.read_text()):
        items: list[Any] = doc["items"] if isinstance(doc, Mapping) and isinstance(doc.get("items"), list) else [doc]
        for item in items:
            if not isinstance(item, Mapping) or item.get("kind", "PredictiveScaler") != "PredictiveScaler":
                continue
            meta = item.get("metadata") or {}
            if meta.get("name") == target.name and str(meta.get("namespace") or "default") == target.namespace:
                return dict(item.get("spec") or {})
    raise AssertionError(f"{target.key} vanished from {path}")  # pragma: no cover - pick_scaler read it


def _pull(args: argparse.Namespace, target: ScalerTarget) -> Series:
    from datetime import UTC, datetime

    from predictive_scaler.commands._flags import parse_time_flag
    from predictive_scaler.errors import (
        ConfigError,
        DataError,
        InsufficientHistoryError,
        SourceError,
    )
    from predictive_scaler.retrain import demand_query, history_for_scaler
    from predictive_scaler.series import parse_duration
    from predictive_scaler.sources.prometheus import PrometheusSource

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
    where = f"{target.key}'s demand ({query}) from {args.prometheus}, {args.days:g} days to {end.isoformat()}"
    source = PrometheusSource(args.prometheus, timeout=args.timeout)
    max_missing = DEFAULT_MAX_MISSING if args.max_missing is None else args.max_missing
    try:
        series = history_for_scaler(source, target.spec, end, args.days, namespace=target.namespace,
                                    min_history=min_history, max_missing_fraction=max_missing)
    except InsufficientHistoryError as exc:
        raise InsufficientHistoryError(f"{where}: {exc}; pull more with --days, check --end, or wait until "
                                       "the metric has 14 days") from exc
    except SourceError as exc:
        raise SourceError(f"{where}: {exc}") from exc
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from exc
    return replace(series, source=f"{args.prometheus} {query}")


def _print_origins(key: str, manifest: Path, scenario: Scenario, mapped: ScalerScenario) -> None:
    settings = scenario.to_dict()

    def value(setting: str) -> Any:
        group, _, name = setting.rpartition(".")
        found = settings[group][name] if group else settings[setting]
        return f"{found:g}" if isinstance(found, float) else found

    print(f"scaler: {key} ({manifest}) over scenario {scenario.name}: the manifest's explicit settings win")
    by_field: dict[str, list[str]] = {}
    for setting, source in mapped.from_manifest.items():
        by_field.setdefault(source, []).append(f"{setting}={value(setting)}")
    for source, taken in by_field.items():
        print(f"  {source} → {', '.join(taken)}")
    print(f"  from the scenario: {', '.join(f'{s}={value(s)}' for s in mapped.from_scenario) or 'nothing'}, "
          "and the rest (preset, training, horizons, forecasters, policies)")
    print("  the predictive policy runs the manifest's spec laid over the scenario's spec section")
    for note in mapped.notes:
        print(f"  note: {note}")

"""`predictive-scaler shadow-report`: your live autoscaler against predictive-scaler in forecast-only.

Pulls the scaler's demand, what the live autoscaler ran (kube-state-metrics'
``kube_deployment_spec_replicas``/``kube_deployment_status_replicas_ready``, else the controller's
``predictive_scaler_target_replicas``/``predictive_scaler_current_replicas``), what the scaler decided
(``predictive_scaler_desired_replicas``, ``predictive_scaler_planned_placeholder_gpus``) and the price
(OpenCost's ``node_gpu_hourly_cost``, else the spec's), and reports per UTC day and in total: GPU-hours,
cost, demand served, unmet minutes, wasted prewarm — yours against ours — beside the replay of the same
window through the backtest. docs/shadow.md defines every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from predictive_scaler.spec import ScalerSpec

STEP_SECONDS = 60


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("shadow-report", help="your autoscaler against predictive-scaler in forecast-only, from "
                       "Prometheus", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prometheus", required=True, metavar="URL", help="the cluster's Prometheus")
    p.add_argument("--scaler", required=True, metavar="NAMESPACE/NAME", help="the PredictiveScaler (forecast-only)")
    p.add_argument("--since", default="7d", help="the window reported on, ending at --end (default 7d)")
    p.add_argument("--end", help="end of the window (default: now)")
    p.add_argument("--manifest", type=Path, metavar="FILE.yaml",
                   help="read the scaler's spec from this manifest instead of the cluster")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: its current context)")
    p.add_argument("--price-query", help="PromQL of the GPU-hour price (default: avg(node_gpu_hourly_cost))")
    p.add_argument("--training", default="14d", help="history before the window the replay trains on (default 14d)")
    p.add_argument("--forecasters", help="the replay's candidate models, comma-separated (default: the job's)")
    p.add_argument("--no-replay", action="store_true", help="skip the replay through the backtest")
    p.add_argument("--report", type=Path, metavar="DIR", help="write report.md, report.html and result.json here")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per Prometheus request (default 30)")
    p.set_defaults(func=run)


def _ref(text: str) -> tuple[str, str]:
    from predictive_scaler.errors import ConfigError

    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name:
        raise ConfigError(f"--scaler {text!r}: give NAMESPACE/NAME", field="scaler")
    return namespace, name


def scaler_doc(args: argparse.Namespace, namespace: str, name: str) -> dict[str, Any]:
    """The scaler's camelCase spec: from --manifest, else from the cluster (kube/)."""
    if args.manifest is not None:
        import yaml

        from predictive_scaler.errors import ConfigError
        from predictive_scaler.yaml_input import read_yaml_text

        text = read_yaml_text(args.manifest, what="a PredictiveScaler manifest",
                              remedy="give the YAML file the scaler was applied from", field="manifest")
        for doc in yaml.safe_load_all(text):
            meta = (doc or {}).get("metadata") or {} if isinstance(doc, dict) else {}
            if meta.get("name") == name and str(meta.get("namespace") or "default") == namespace:
                return dict(doc.get("spec") or {})
        raise ConfigError(f"--manifest {args.manifest}: no PredictiveScaler {namespace}/{name} in it", field="manifest")
    from predictive_scaler.kube.client import KubeCluster
    from predictive_scaler.kube.kubeconfig import api_client_from_environment

    kube = KubeCluster(api_client_from_environment(args.kubeconfig, args.context))
    return dict(kube.get_scaler(name, namespace).get("spec") or {})


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from predictive_scaler.backtest import shadow
    from predictive_scaler.commands._flags import parse_time_flag
    from predictive_scaler.errors import ConfigError, DataError
    from predictive_scaler.retrain.history import demand_query
    from predictive_scaler.series import parse_duration
    from predictive_scaler.sources.prometheus import PrometheusSource
    from predictive_scaler.sources.shadow import pull_shadow, shadow_queries
    from predictive_scaler.spec import ScalerSpec

    namespace, name = _ref(args.scaler)
    try:
        since, training = parse_duration(args.since), parse_duration(args.training)
    except DataError as exc:
        raise ConfigError(f"--since/--training: {exc}", field="since") from exc
    if args.report is not None and args.report.exists() and not args.report.is_dir():
        raise ConfigError(f"--report {args.report}: not a directory", field="report")
    doc = scaler_doc(args, namespace, name)
    spec = ScalerSpec.from_dict(doc)
    end = parse_time_flag("--end", args.end).to_pydatetime() if args.end else datetime.now(UTC)
    end = datetime.fromtimestamp(end.timestamp() // STEP_SECONDS * STEP_SECONDS, UTC)
    start = end - since
    source = PrometheusSource(args.prometheus, timeout=args.timeout, timeout_setting="--timeout")
    queries = {"demand": (demand_query(spec, namespace),),
               **shadow_queries(namespace, name, spec.target.kind, spec.target.name, args.price_query)}
    pulled = pull_shadow(source, queries, start, end, STEP_SECONDS)
    if pulled["demand"].query is None:
        raise DataError(f"no demand recorded for {namespace}/{name} ({queries['demand'][0]}) from {start} to {end}")
    price = pulled["price"].series.values
    default_price = spec.prewarm.budget.price_per_gpu_hour
    if not np.isfinite(price).any() and default_price is None:
        raise ConfigError("no GPU price: OpenCost's node_gpu_hourly_cost is not in Prometheus and the scaler has no "
                          "prewarm.budget.pricePerGpuHour; give --price-query or set the price", field="price_query")
    inp = shadow.ShadowInput(
        start=pulled["demand"].series.start, step_s=STEP_SECONDS, demand=pulled["demand"].series.values,
        yours_replicas=pulled["yours_replicas"].series.values, yours_ready=pulled["yours_ready"].series.values,
        ours_replicas=pulled["ours_replicas"].series.values,
        ours_placeholder_gpus=pulled["ours_placeholder_gpus"].series.values, price=price,
        default_price=float(default_price if default_price is not None else np.nanmean(price)),
        capacity_per_replica=spec.capacity_per_replica, gpus_per_replica=spec.gpus_per_replica,
        pod_start_s=spec.lead_times.pod_start_seconds, node_start_s=spec.lead_times.node_start_seconds,
        currency=spec.prewarm.budget.currency, live=f"{spec.target.kind}/{spec.target.name}'s live autoscaler",
        scaler=f"{namespace}/{name}")
    replay = None if args.no_replay else _replay(args, source, doc, spec, namespace, start, end, training)
    result = shadow.compare(inp, replay)
    if args.report is not None:
        args.report.mkdir(parents=True, exist_ok=True)
        (args.report / "report.md").write_text(shadow.markdown(result))
        (args.report / "report.html").write_text(shadow.html_page(result))
        (args.report / "result.json").write_text(json.dumps(result.to_json(), indent=2, allow_nan=False))
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=2, allow_nan=False)
        print()
    else:
        print(shadow.headline(result))
        if args.report is not None:
            print(f"report: {args.report / 'report.html'}")
    return 0


def _replay(args: argparse.Namespace, source: Any, doc: dict[str, Any], spec: ScalerSpec, namespace: str,
            start: datetime, end: datetime, training: timedelta) -> dict[str, Any]:
    """The window's demand (and ``training`` before it) through run_backtest: predictive and reactive."""
    from predictive_scaler.backtest.runner import run_backtest
    from predictive_scaler.backtest.scenario import load_scenario
    from predictive_scaler.commands.backtest_scaler import scenario_for_scaler
    from predictive_scaler.retrain.history import demand_query
    from predictive_scaler.sources.history import pull_history

    trace = pull_history(source, demand_query(spec, namespace), start - training, end, STEP_SECONDS,
                         min_history=None, name=spec.target.name)
    scenario = scenario_for_scaler(load_scenario(), doc, per_second=True).scenario
    changes: dict[str, Any] = {"training": training, "evaluation": end - start, "policies": ("predictive", "reactive")}
    if args.forecasters:
        changes["forecasters"] = tuple(f.strip() for f in args.forecasters.split(",") if f.strip())
    return run_backtest(trace, replace(scenario, **changes)).to_json()

"""`predictive-scaler retrain`: retrain every PredictiveScaler's model from Prometheus history (the weekly CronJob)

For each PredictiveScaler (from --config, or from the cluster): pull up to --history of demand and
DCGM history from Prometheus, fit and select a model on all but the last --holdout, and compare it
with the serving model on that held-out window; promote it only if it is not worse at the scaler's
quantile (pinball loss and coverage). Short or gappy history is skipped with its reason. Re-
running with the same --run-id resumes: finished scalers are skipped and no version is published
twice. Exit status 1 when a scaler failed: Prometheus could not be reached or answered garbage (a
refused query, an impossible value), or something unexpected; the report and stderr say why.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from predictive_scaler.commands._flags import add_command, add_prometheus_auth_flags

if TYPE_CHECKING:
    from predictive_scaler.kube.client import KubeCluster
    from predictive_scaler.retrain.settings import RetrainSettings, ScalerTarget


def register(subparsers: Any) -> None:
    p = add_command(subparsers, __doc__)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--config", help="YAML file of PredictiveScaler manifests (offline use)")
    where.add_argument("--in-cluster", action="store_true",
                       help="list PredictiveScalers from the cluster (default without --config)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster credentials, else ~/.kube/config)")
    p.add_argument("--namespace", help="only this namespace's scalers (default: all)")
    p.add_argument("--prometheus", "--prometheus-url", dest="prometheus",
                   default=os.environ.get("PREDICTIVE_SCALER_PROMETHEUS_URL"),
                   help="Prometheus URL (default: $PREDICTIVE_SCALER_PROMETHEUS_URL)")
    p.add_argument("--store", default=os.environ.get("PREDICTIVE_SCALER_MODEL_STORE"),
                   help="model store: a directory or s3://bucket/prefix (default: $PREDICTIVE_SCALER_MODEL_STORE)")
    p.add_argument("--s3-endpoint-url", help="endpoint of an S3-compatible object store for an s3:// --store "
                                             "(default: $AWS_ENDPOINT_URL_S3, else AWS S3)")
    p.add_argument("--shard-index", type=int, help="this pod's shard (default: $JOB_COMPLETION_INDEX, else 0)")
    p.add_argument("--shard-count", type=int, help="number of shards (default: $JOB_COMPLETIONS, else 1)")
    p.add_argument("--processes", type=int, default=1, help="worker processes in this pod (default 1)")
    p.add_argument("--now", help="end of the history, ISO-8601 (default: now)")
    p.add_argument("--run-id", help="run identifier for resuming (default: the ISO week of --now, e.g. 2026-W48)")
    p.add_argument("--models", help="comma-separated candidate kinds (default: all)")
    p.add_argument("--history", default="28d", help="history pulled per scaler (default 28d)")
    p.add_argument("--min-history", default="14d", help="observed history required, else skipped (default 14d)")
    p.add_argument("--holdout", default="2d", help="latest data held out to compare models (default 2d)")
    p.add_argument("--max-missing", type=float, default=0.2,
                   help="largest share of missing steps accepted (default 0.2)")
    p.add_argument("--keep", type=int, default=5, help="versions kept per model (default 5)")
    p.add_argument("--cold", action="store_true",
                   help="ignore what earlier weeks learnt (each scaler's selection ledger): score every candidate "
                        "and start every fit cold; the ledger is neither read nor written")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per Prometheus request (default 30)")
    add_prometheus_auth_flags(p)
    p.add_argument("--no-status", action="store_true", help="in-cluster: do not write status.retrain")
    p.add_argument("--json", action="store_true", help="print the run report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # BLAS threads per process fight over a small pod's cores (see retrain.job.SINGLE_THREAD_ENV):
    # set before numpy is imported here and inherited by the worker processes.
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    import json
    import logging
    from datetime import UTC, datetime

    from predictive_scaler.commands._flags import check_output, parse_time_flag, prometheus_auth
    from predictive_scaler.commands.models import open_store_flag
    from predictive_scaler.errors import ClusterError, ConfigError
    from predictive_scaler.forecasting.store import is_object_store_url
    from predictive_scaler.retrain.history import PrometheusHistory
    from predictive_scaler.retrain.job import run_retrain
    from predictive_scaler.retrain.outcome import ScalerOutcome
    from predictive_scaler.retrain.sharding import shard_from_environment
    from predictive_scaler.sources.prometheus import PrometheusSource

    log = logging.getLogger("predictive_scaler.retrain")
    if not args.prometheus:
        raise ConfigError("no Prometheus URL: pass --prometheus http://prometheus:9090 or set "
                          "PREDICTIVE_SCALER_PROMETHEUS_URL", field="prometheus")
    if not args.store:
        raise ConfigError("no model store: pass --store DIR or set PREDICTIVE_SCALER_MODEL_STORE", field="store")
    if not is_object_store_url(args.store):
        check_output("--store", args.store, directory=True)  # before any history is pulled
    settings = _settings(args)
    auth = prometheus_auth(args, os.environ)
    now = datetime.now(UTC)
    if args.now:
        now = parse_time_flag("--now", args.now).to_pydatetime()
    env_index, env_count = shard_from_environment()
    index = env_index if args.shard_index is None else args.shard_index
    count = env_count if args.shard_count is None else args.shard_count

    targets, kube = _targets(args)

    def write_status(outcome: ScalerOutcome) -> None:
        if kube is None or args.no_status or outcome.result == "already-done":
            return
        namespace, name = outcome.key.split("/", 1)
        try:
            kube.patch_status(name, namespace, {"retrain": outcome.status(now)})
        except ClusterError as exc:  # the store has the record; the status is a courtesy
            log.warning("could not write the retrain status of %s: %s", outcome.key, exc)

    source = PrometheusSource(args.prometheus, timeout=args.timeout, timeout_setting="--timeout", auth=auth)
    store = open_store_flag(args.store, "--store", keep=settings.keep, endpoint=args.s3_endpoint_url,
                            must_exist=False)
    report = run_retrain(targets, history=PrometheusHistory(source), store=store, settings=settings, now=now,
                         run_id=args.run_id, processes=args.processes, shard_index=index, shard_count=count,
                         on_outcome=write_status)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, allow_nan=False))
    else:
        _print_report(report)
    if report.failed:
        _print_failures(report)
    return 1 if report.failed else 0


def _settings(args: argparse.Namespace) -> RetrainSettings:
    from dataclasses import replace

    from predictive_scaler.commands._flags import positive_duration
    from predictive_scaler.errors import ConfigError, DataError
    from predictive_scaler.forecasting.registry import parse_kinds
    from predictive_scaler.retrain.settings import RetrainSettings

    try:
        settings = RetrainSettings(
            history=positive_duration("--history", args.history),
            min_history=positive_duration("--min-history", args.min_history),
            holdout=positive_duration("--holdout", args.holdout), max_missing_fraction=args.max_missing,
            keep=args.keep, reuse_earlier_weeks=not args.cold,
        )
        if args.models:
            settings = replace(settings, kinds=parse_kinds(args.models))
    except DataError as exc:
        raise ConfigError(str(exc), field="history") from exc
    return settings


def _targets(args: argparse.Namespace) -> tuple[list[ScalerTarget], KubeCluster | None]:
    """The scalers to retrain (from --config, or listed in the cluster), and the cluster client if any."""
    from predictive_scaler.retrain.settings import load_scalers_file, scaler_from_manifest

    if args.config:
        targets = load_scalers_file(args.config, default_namespace=args.namespace or "default")
        if args.namespace:
            targets = [t for t in targets if t.namespace == args.namespace]
        return targets, None
    from predictive_scaler.kube.client import KubeCluster
    from predictive_scaler.kube.kubeconfig import api_client_from_environment

    kube = KubeCluster(api_client_from_environment(args.kubeconfig))
    return [scaler_from_manifest(obj) for obj in kube.list_scalers(args.namespace)], kube


def _print_report(report: Any) -> None:
    print(f"retrain run {report.run_id} (shard {report.shard_index + 1}/{report.shard_count}, "
          f"{report.processes} process(es)): {len(report.outcomes)} scaler(s) in {report.seconds:.1f}s")
    for o in report.outcomes:
        line = f"  {o.key:<40} {o.result:<12} {o.reason}"
        if o.version and o.result == "promoted":
            line += f" [version {o.version}, {o.kind}]"
        print(line)
        if o.capacity:
            c = o.capacity
            print(f"  {'':<40} capacity: {c['requests_per_replica']:.3g} req/s per replica at "
                  f"{c['utilization_target']:.0%} (90% interval {c['low']:.3g}–{c['high']:.3g})")
        if o.learned_capacity:
            lc = o.learned_capacity
            high = "∞" if lc.get("high") is None else f"{lc['high']:.4g}"  # a lower bound's interval is open
            print(f"  {'':<40} learned capacity at {lc['slo']}: {lc['kind']} {lc['value']:.4g} {lc['unit']} per "
                  f"replica (interval {lc['low']:.4g}–{high})")
        if o.idle_gpus:
            i = o.idle_gpus
            cost = "" if i["cost_per_day"] is None else f", {i['cost_per_day']:.2f} {i['currency']}/day"
            print(f"  {'':<40} idle allocated GPUs: {i['mean']:.2f} on average "
                  f"({i['idle_gpu_hours_per_day']:.1f} GPU-h/day{cost})")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(report.counts().items()))
    idle = report.idle_summary()
    print(f"summary: {counts or 'nothing to do'}")
    if idle["scalers"]:
        cost = "" if idle["cost_per_day"] is None else f", {idle['cost_per_day']:.2f}/day"
        print(f"idle allocated GPUs (< 5% for ≥ 10 min): {idle['mean_idle_gpus']:.2f} on average, "
              f"{idle['idle_gpu_hours_per_day']:.1f} GPU-h/day{cost}")


def _print_failures(report: Any) -> None:
    """Why the run fails, on stderr whatever the report's format: the CronJob's log shows it."""
    failed = [o for o in report.outcomes if o.result == "failed"]
    print(f"{len(failed)} scaler(s) failed, so this run fails (exit 1); fix the cause and re-run with "
          f"--run-id {report.run_id} to resume:", file=sys.stderr)
    for o in failed[:10]:
        print(f"  {o.key}: {o.reason}", file=sys.stderr)
    if len(failed) > 10:
        print(f"  … and {len(failed) - 10} more (see the report)", file=sys.stderr)

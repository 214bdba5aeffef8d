"""`predictive-scaler controller`: run the controller that reconciles PredictiveScalers

Watch PredictiveScaler resources and, every --interval seconds, forecast each one's demand from
Prometheus, plan replicas and prewarmed GPUs, and (in mode: scale) act through the Kubernetes API.
Settings default to the PREDICTIVE_SCALER_* environment variables of the deploy/ ConfigMap. Run
one replica per shard: without PREDICTIVE_SCALER_SHARD_COUNT exactly one (kopf peering is not leader
election); with PREDICTIVE_SCALER_SHARD_COUNT=N, N replicas of a StatefulSet, each reconciling only
its shard of the scalers, fenced by a Lease. Logs are JSON lines on stderr; /metrics,
/healthz (liveness) and /readyz (readiness) are served over HTTP; SIGTERM stops it within seconds.
"""

from __future__ import annotations

import argparse
from typing import Any

from predictive_scaler.commands._flags import add_command, add_prometheus_auth_flags


def register(subparsers: Any) -> None:
    p = add_command(subparsers, __doc__)
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster ServiceAccount, else ~/.kube/config)")
    p.add_argument("--namespace", help="watch only this namespace (default: all namespaces)")
    p.add_argument("--dry-run", action="store_true",
                   help="send every write with dryRun=All: validated by the API server, never persisted")
    p.add_argument("--prometheus-url", help="Prometheus base URL (default: $PREDICTIVE_SCALER_PROMETHEUS_URL)")
    p.add_argument("--model-store", help="model store directory (default: $PREDICTIVE_SCALER_MODEL_STORE)")
    p.add_argument("--interval", type=float,
                   help="seconds between reconciles of one scaler, 5–600 (default: "
                        "$PREDICTIVE_SCALER_RECONCILE_INTERVAL_SECONDS or 60)")
    p.add_argument("--metrics-port", type=int, default=8080, help="port of /metrics (default 8080)")
    p.add_argument("--health-port", type=int, help="a second port for /healthz and /readyz (default: the metrics port only)")
    p.add_argument("--cluster-budget-gpus", type=int,
                   help="cluster-wide cap on speculative GPUs over all scalers "
                        "(default: $PREDICTIVE_SCALER_CLUSTER_BUDGET_GPUS; unset = no cap)")
    p.add_argument("--cluster-budget-cost-per-hour", type=float,
                   help="cluster-wide cap on speculative cost per hour "
                        "(default: $PREDICTIVE_SCALER_CLUSTER_BUDGET_COST_PER_HOUR; unset = no cap)")
    p.add_argument("--keda-tls-cert", help="PEM certificate for TLS on the KEDA gRPC port (default: "
                   "$PREDICTIVE_SCALER_KEDA_TLS_CERT; unset = plaintext)")
    p.add_argument("--keda-tls-key", help="its PEM private key (default: $PREDICTIVE_SCALER_KEDA_TLS_KEY)")
    p.add_argument("--keda-tls-client-ca", help="PEM CA that must sign KEDA's client certificate: mTLS (default: "
                   "$PREDICTIVE_SCALER_KEDA_TLS_CLIENT_CA; unset = no client certificate asked)")
    p.add_argument("--keda-only", action="store_true",
                   help="serve only KEDA's external scaler API, answering from the PredictiveScalers' status; no "
                        "reconcile (a second Deployment that keeps KEDA answered while the controller restarts)")
    p.add_argument("--team-label", metavar="LABEL",
                   help="namespace label whose value is the team label of the FinOps metrics (default: "
                        "$PREDICTIVE_SCALER_TEAM_LABEL; unset = team is empty)")
    add_prometheus_auth_flags(p)
    p.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace, environ: Any) -> Any:
    import dataclasses

    from predictive_scaler.commands._flags import prometheus_auth
    from predictive_scaler.controller.settings import ClusterBudgetLimits, ControllerSettings

    settings = ControllerSettings.from_env(
        environ, prometheus_url=args.prometheus_url, model_store=args.model_store, interval_seconds=args.interval,
        namespace=args.namespace, dry_run=args.dry_run or None, metrics_port=args.metrics_port,
        health_port=args.health_port, kubeconfig=args.kubeconfig, keda_tls_cert=args.keda_tls_cert,
        keda_tls_key=args.keda_tls_key, keda_tls_client_ca=args.keda_tls_client_ca, keda_only=args.keda_only or None,
        team_label=args.team_label,
        prometheus_auth=prometheus_auth(args, environ))
    budget = settings.cluster_budget
    if args.cluster_budget_gpus is not None or args.cluster_budget_cost_per_hour is not None:
        budget = ClusterBudgetLimits(
            max_gpus=args.cluster_budget_gpus if args.cluster_budget_gpus is not None else budget.max_gpus,
            max_cost_per_hour=(args.cluster_budget_cost_per_hour if args.cluster_budget_cost_per_hour is not None
                               else budget.max_cost_per_hour))
    return dataclasses.replace(settings, cluster_budget=budget)


def run(args: argparse.Namespace) -> int:
    import os

    from predictive_scaler.controller.run import configure_logging, run_controller

    configure_logging(getattr(args, "verbose", False))
    return run_controller(settings_from_args(args, os.environ))

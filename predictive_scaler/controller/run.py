"""Start the controller: adapters, telemetry server, kopf operator (one replica, standalone).

Everything process-wide is built here, at the edge; the pieces it wires are
tested on their own (``service``, ``handlers``, ``ports``, ``telemetry``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

from predictive_scaler.clock import SystemClock
from predictive_scaler.controller.settings import ControllerSettings

log = logging.getLogger("predictive_scaler.controller")

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and any ``extra={…}`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value if isinstance(value, str | int | float | bool | type(None)) else str(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(verbose: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def run_controller(settings: ControllerSettings) -> int:
    """Run until stopped (SIGTERM/SIGINT). Returns the exit code."""
    import kopf

    from predictive_scaler.controller.api_activity import ApiActivity
    from predictive_scaler.controller.handlers import build_registry
    from predictive_scaler.controller.service import ControllerService
    from predictive_scaler.controller.telemetry import Telemetry, TelemetryServer
    from predictive_scaler.forecasting.store import ModelStore
    from predictive_scaler.kube.client import KubeCluster, api_client_from_environment
    from predictive_scaler.sources.prometheus import PrometheusSource

    if settings.kubeconfig:
        # kopf's own login reads $KUBECONFIG; our adapter gets the same file explicitly.
        os.environ["KUBECONFIG"] = settings.kubeconfig
    clock = SystemClock()
    # The API client and the retry sleep are observed, so retries absorbed inside a call reach ApiDegraded.
    activity = ApiActivity()
    kube = KubeCluster(activity.wrap(api_client_from_environment(settings.kubeconfig)), clock=clock,
                       sleep=activity.sleep(time.sleep), dry_run=settings.dry_run)
    source = PrometheusSource(settings.prometheus_url, timeout=settings.prometheus_timeout_seconds, clock=clock)
    telemetry = Telemetry()
    service = ControllerService(settings, kube, source, ModelStore(settings.model_store), clock, telemetry=telemetry,
                                api_activity=activity)
    registry, _ = build_registry(service)
    keda = start_keda_server(service)
    assert settings.health_stale_after_seconds is not None
    server = TelemetryServer(telemetry, settings.metrics_host, settings.metrics_port, settings.health_port,
                             settings.health_stale_after_seconds).start()
    log.info("controller starting", extra={
        "namespace": settings.namespace or "*", "dry_run": settings.dry_run, "interval_s": settings.interval_seconds,
        "prometheus": settings.prometheus_url, "model_store": str(settings.model_store),
        "cluster_budget_gpus": settings.cluster_budget.max_gpus,
        "cluster_budget_cost_per_hour": settings.cluster_budget.max_cost_per_hour,
        "ports": ",".join(map(str, server.ports))})
    try:
        kopf.run(registry=registry, standalone=True, clusterwide=settings.namespace is None,
                 namespaces=[settings.namespace] if settings.namespace else ())
    finally:
        server.stop()
        if keda is not None:
            keda.stop()
    return 0


def start_keda_server(service: Any) -> Any:
    """KEDA's external scaler gRPC API over the service's decisions, on its own port (None: disabled)."""
    port = service.settings.keda_port
    if port is None:
        return None
    from predictive_scaler.keda.server import KedaServer

    return KedaServer(service.keda_board, service.settings.metrics_host, port).start()

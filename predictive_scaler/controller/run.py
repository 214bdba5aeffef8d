"""Start the controller: adapters, telemetry server, kopf operator (one replica, standalone).

Everything process-wide is built here, at the edge; the pieces it wires are
tested on their own (``service``, ``handlers``, ``ports``, ``telemetry``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

from predictive_scaler.clock import SystemClock
from predictive_scaler.controller.settings import ControllerSettings

if TYPE_CHECKING:
    from predictive_scaler.clock import Clock
    from predictive_scaler.sources.prometheus import PrometheusSource

log = logging.getLogger("predictive_scaler.controller")

#: Record attributes never logged: kopf attaches its whole OperatorSettings (2,225 characters,
#: measured) and two internal flags to every per-object record; the object itself is kept, short.
_DROPPED = ("settings", "k8s_skip", "k8s_ref")


class JsonFormatter(_JsonFormatter):
    """python-json-logger, one object per line: time, level, logger, message, object, and ``extra={…}`` fields."""

    def __init__(self) -> None:
        super().__init__("%(message)s", reserved_attrs=[*RESERVED_ATTRS, *_DROPPED],
                         rename_fields={"exc_info": "exception"}, json_ensure_ascii=False)

    def add_fields(self, log_record: dict[str, Any], record: logging.LogRecord,
                   message_dict: dict[str, Any]) -> None:
        log_record["time"] = (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                              + f".{int(record.msecs):03d}Z")
        log_record["level"] = record.levelname.lower()
        log_record["logger"] = record.name
        super().add_fields(log_record, record, message_dict)
        ref = getattr(record, "k8s_ref", None)
        if isinstance(ref, dict) and ref.get("name"):
            log_record["object"] = f"{ref.get('namespace') or ''}/{ref['name']}".lstrip("/")


def configure_logging(verbose: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class KopfOperator:
    """kopf in its own thread and event loop, stopped through its ``stop_flag`` (never by a signal).

    The main thread owns SIGTERM (see lifecycle.py): kopf's own graceful stop waits for
    handler threads it cannot cancel, and its last resort is a SIGKILL after 10 minutes.
    """

    def __init__(self, registry: Any, settings: ControllerSettings, on_exit: Callable[[str], None]) -> None:
        self.registry = registry
        self.settings = settings
        self.stop_flag = threading.Event()
        self.failed: BaseException | None = None
        self._on_exit = on_exit
        self._thread: threading.Thread | None = None

    def start(self) -> KopfOperator:
        logging.getLogger("kopf._core.reactor.running").addFilter(_NotMainThreadNote())
        self._thread = threading.Thread(target=self._main, name="kopf", daemon=True)
        self._thread.start()
        return self

    def _main(self) -> None:
        import kopf

        try:
            asyncio.run(kopf.operator(
                registry=self.registry, standalone=True, clusterwide=self.settings.namespace is None,
                namespaces=[self.settings.namespace] if self.settings.namespace else (), stop_flag=self.stop_flag))
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # noqa: BLE001 — reported, then the process stops with exit code 1
            self.failed = exc
            log.exception("kopf stopped with an error")
        finally:
            self._on_exit("the operator loop ended")

    def stop(self, timeout: float = 1.0) -> None:
        self.stop_flag.set()
        if self._thread is not None:
            self._thread.join(timeout)


class _NotMainThreadNote(logging.Filter):
    """kopf warns that it ignores OS signals off the main thread: by design here, so not a warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "not in the main thread" not in record.getMessage()


def run_controller(settings: ControllerSettings) -> int:
    """Run until SIGTERM/SIGINT; exits the process (see lifecycle.py) with 0, or 1 when kopf failed."""
    from predictive_scaler.controller.api_activity import ApiActivity
    from predictive_scaler.controller.handlers import build_registry
    from predictive_scaler.controller.health import DependencyProbe, LoopMonitor, Readiness
    from predictive_scaler.controller.lifecycle import Shutdown
    from predictive_scaler.controller.service import ControllerService
    from predictive_scaler.controller.telemetry import Telemetry, TelemetryServer
    from predictive_scaler.forecasting.store import open_store
    from predictive_scaler.kube.cache import ClusterCache
    from predictive_scaler.kube.client import KubeCluster
    from predictive_scaler.kube.kubeconfig import api_client_from_environment

    if settings.kubeconfig:
        # kopf's own login reads $KUBECONFIG; our adapter gets the same file explicitly.
        os.environ["KUBECONFIG"] = settings.kubeconfig
    if settings.keda_only:
        return run_keda_only(settings)
    clock = SystemClock()
    # The API client and the retry sleep are observed, so retries absorbed inside a call reach ApiDegraded.
    activity = ApiActivity()
    shutdown = Shutdown(activity)
    kube = KubeCluster(activity.wrap(api_client_from_environment(settings.kubeconfig)), clock=clock,
                       sleep=activity.sleep(shutdown.sleep), dry_run=settings.dry_run)
    source = prometheus_source(settings, clock=clock, sleep=shutdown.sleep)
    telemetry = Telemetry()
    assert settings.liveness_timeout_seconds is not None
    loop = LoopMonitor(settings.liveness_timeout_seconds, scalers=lambda: telemetry.scalers)
    # One watch-fed cache of pods, nodes, HPAs and ScaledObjects for every reconcile (its own client:
    # watch streams are long reads that must not count as a reconcile's API trouble).
    cache = ClusterCache(KubeCluster(api_client_from_environment(settings.kubeconfig), clock=clock),
                         namespace=settings.namespace)
    shards = None
    if settings.shard_count > 1:
        from predictive_scaler.controller.shards import ShardMembership
        from predictive_scaler.crd import CONTROLLER_NAMESPACE

        shards = ShardMembership(kube, os.environ.get("POD_NAMESPACE") or CONTROLLER_NAMESPACE, settings.shard_index,
                                 settings.shard_count, os.environ.get("HOSTNAME") or f"pid-{os.getpid()}",
                                 clock=time.time)
    service = ControllerService(settings, kube, source, open_store(settings.model_store), clock, telemetry=telemetry,
                                api_activity=activity, loop=loop, shutdown=shutdown, cache=cache, shards=shards)
    registry, _ = build_registry(service)
    probe_timeout = min(5.0, settings.readiness_timeout_seconds)
    every = settings.probe_interval_seconds
    readiness = Readiness([
        DependencyProbe("kubernetes", lambda: kube.ping(probe_timeout),
                        timeout_s=settings.readiness_timeout_seconds, interval_s=every),
        DependencyProbe("prometheus", lambda: source.check_connection(probe_timeout),
                        timeout_s=settings.readiness_timeout_seconds, interval_s=every),
    ])
    server = TelemetryServer(telemetry, settings.metrics_host, settings.metrics_port, settings.health_port,
                             loop.verdict, readiness.verdict)
    operator = KopfOperator(registry, settings, on_exit=shutdown.request)
    # Started in this order, stopped in reverse. Another server (e.g. gRPC) is one more entry.
    components: list[Component] = [server, readiness, cache, operator]
    if shards is not None:
        from predictive_scaler.controller.shards import ShardKeeper

        components.insert(3, ShardKeeper(shards, service.observe_shards, settings.interval_seconds))
    keda = keda_server(service, keda_reader(settings, clock)) if settings.keda_port is not None else None
    if keda is not None:
        components.insert(1, keda)
    log.info("controller starting", extra={
        "namespace": settings.namespace or "*", "dry_run": settings.dry_run, "interval_s": settings.interval_seconds,
        "prometheus": source.shown, "prometheus_auth": settings.prometheus_auth.describe(),
        "model_store": str(settings.model_store),
        "cluster_budget_gpus": settings.cluster_budget.max_gpus,
        "cluster_budget_cost_per_hour": settings.cluster_budget.max_cost_per_hour,
        "team_label": settings.team_label,
        "liveness_timeout_s": settings.liveness_timeout_seconds,
        "readiness_timeout_s": settings.readiness_timeout_seconds,
        "ports": ",".join(map(str, server.ports))})
    code = serve(components, shutdown, loop)
    if operator.failed is not None:
        code = 1
    _exit(code)
    return code


def prometheus_source(settings: ControllerSettings, *, clock: Clock, sleep: Callable[[float], None]) -> PrometheusSource:
    """The controller's Prometheus: its URL, timeout and credentials (``settings.prometheus_auth``)."""
    from predictive_scaler.sources.prometheus import PrometheusSource

    return PrometheusSource(settings.prometheus_url, timeout=settings.prometheus_timeout_seconds, clock=clock,
                            sleep=sleep, auth=settings.prometheus_auth)


class Component(Protocol):
    def start(self) -> object: ...

    def stop(self) -> None: ...


def serve(components: list[Component], shutdown: Any, loop: Any) -> int:
    """Start ``components``, wait for a stop request, stop them within the shutdown grace."""

    def on_signal(signum: int, _frame: Any) -> None:
        if shutdown.requested.is_set():
            os._exit(128 + signum)  # a second signal: the operator asked twice
        shutdown.request(signal.Signals(signum).name)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    started: list[Component] = []
    try:
        for component in components:
            component.start()
            started.append(component)
        while not shutdown.requested.wait(0.5):
            pass
        began = time.monotonic()
        log.info("stopping", extra={"reason": shutdown.reason, "reconciles_running": loop.in_flight})
        finished = loop.wait_idle(shutdown.grace_s)
        for component in reversed(started):
            component.stop()
        log.info("stopped", extra={"seconds": round(time.monotonic() - began, 2),
                                   "reconciles_abandoned": 0 if finished else loop.in_flight})
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0


def _exit(code: int) -> None:
    """End the process now: a reconcile thread blocked in a socket read would otherwise be joined at exit."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def keda_reader(settings: ControllerSettings, clock: Any) -> Any:
    """The kube layer the KEDA server reads scalers and ScaledObjects through: its own client, and few retries
    (a gRPC call must not wait out the reconcile's 20-s retry budget; KEDA asks again anyway)."""
    from predictive_scaler.kube.client import KubeCluster
    from predictive_scaler.kube.kubeconfig import api_client_from_environment
    from predictive_scaler.kube.retry import RetryPolicy

    return KubeCluster(api_client_from_environment(settings.kubeconfig), clock=clock, request_timeout=5.0,
                       retry=RetryPolicy(max_attempts=2, max_elapsed=3.0))


def keda_server(service: Any, kube: Any = None) -> Any:
    """KEDA's external scaler gRPC API over the service's decisions, and over every scaler's status read
    through ``kube`` (default: the service's), on its own port, not yet started (None: disabled)."""
    settings = service.settings
    if settings.keda_port is None:
        return None
    from predictive_scaler.keda.server import KedaServer
    from predictive_scaler.keda.status import ScalerStatusReader
    from predictive_scaler.keda.targets import (
        TargetCheck,
        cached_scaled_objects,
        listed_scaled_objects,
    )
    from predictive_scaler.keda.tls import TlsFiles

    kube = kube or service.kube
    status = ScalerStatusReader(lambda namespace, name: kube.get_scaler(name, namespace), service.clock,
                                stale_after_seconds=settings.liveness_timeout_seconds,
                                interval_seconds=settings.interval_seconds)
    targets = TargetCheck(listed_scaled_objects(kube), service.clock,
                          cached=cached_scaled_objects(service.cache) if service.cache is not None else None)
    return KedaServer(service.keda_board, settings.metrics_host, settings.keda_port, status=status, targets=targets,
                      tls=TlsFiles.of(settings.keda_tls_cert, settings.keda_tls_key, settings.keda_tls_client_ca))


def run_keda_only(settings: ControllerSettings) -> int:
    """Serve KEDA's API from the scalers' status, with /healthz and /readyz; no kopf, no reconcile."""
    from predictive_scaler.controller.api_activity import ApiActivity
    from predictive_scaler.controller.health import DependencyProbe, LoopMonitor, Readiness
    from predictive_scaler.controller.lifecycle import Shutdown
    from predictive_scaler.controller.telemetry import Telemetry, TelemetryServer
    from predictive_scaler.keda.board import KedaBoard

    clock = SystemClock()
    kube = keda_reader(settings, clock)
    assert settings.liveness_timeout_seconds is not None
    # An empty board: every answer comes from a scaler's status (ScalerStatusReader).
    service = KedaOnly(settings, clock, KedaBoard(clock, settings.liveness_timeout_seconds))
    keda = keda_server(service, kube)
    loop = LoopMonitor(settings.liveness_timeout_seconds)
    readiness = Readiness([DependencyProbe("kubernetes", lambda: kube.ping(min(5.0, settings.readiness_timeout_seconds)),
                                           timeout_s=settings.readiness_timeout_seconds,
                                           interval_s=settings.probe_interval_seconds)])
    http = TelemetryServer(Telemetry(), settings.metrics_host, settings.metrics_port, settings.health_port,
                           loop.verdict, readiness.verdict)
    log.info("serving KEDA only", extra={"keda_port": settings.keda_port, "ports": ",".join(map(str, http.ports))})
    code = serve([http, readiness, keda], Shutdown(ApiActivity()), loop)
    _exit(code)
    return code


class KedaOnly:
    """What :func:`keda_server` reads of a ControllerService, in a process that reconciles nothing."""

    def __init__(self, settings: ControllerSettings, clock: Any, board: Any) -> None:
        self.settings, self.clock, self.keda_board, self.kube, self.cache = settings, clock, board, None, None

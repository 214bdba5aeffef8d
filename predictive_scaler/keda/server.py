"""The gRPC server of KEDA's external scaler API.

A ScaledObject trigger (``type: external`` or ``external-push``) names the
PredictiveScaler in its metadata: ``scalerName``, or ``scalerNameFromEnv`` naming an
environment variable of the scale target's container (KEDA resolves it and sends the value
under that key, or drops the key when the variable is unset or empty). The scaler must be in
the ScaledObject's namespace and in ``mode: keda``, and the ScaledObject must scale the
workload the scaler plans for. Answers (see :mod:`answer` for the numbers):

- GetMetricSpec — one metric, target one replica (``targetSize`` 1, ``targetSizeFloat`` 1.0);
- GetMetrics — the replicas the plan provisions for, in both the integer and the float field;
- IsActive / StreamIsActive — those replicas are above zero (the stream sends the current
  value at once, then each change).

Where the answer comes from: this process's own decisions (:class:`KedaBoard`), else the
scaler's object (:class:`ScalerStatusReader`: its spec and ``status.keda``), so every replica
answers for every scaler.

Errors: malformed trigger metadata → INVALID_ARGUMENT; a ScaledObject that scales another
workload → PERMISSION_DENIED; no such PredictiveScaler → NOT_FOUND; a scaler not served
(another mode, paused, invalid, beside another autoscaler) → FAILED_PRECONDITION; only what
passes by itself — no decision yet, a stale one, the API unreachable — is UNAVAILABLE.
GetMetricSpec answers whenever the ScaledObject itself is right: its target does not depend on
the scaler, and KEDA builds its HPA's metric list from it once (when the ScaledObject is created
or changed), so refusing it because the scaler is missing or not ready yet would leave the HPA
without this metric after the scaler is fixed. StreamMetricSpec is UNIMPLEMENTED, which KEDA
documents as "poll GetMetricSpec instead".

TLS (optional): a server certificate and key, and a client CA to require client certificates
(mTLS); the files are read again when they change (a rotated Secret), for new connections.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator, Mapping
from concurrent import futures
from typing import Any

import grpc

from predictive_scaler.errors import ConfigError
from predictive_scaler.keda import externalscaler_pb2 as pb
from predictive_scaler.keda import externalscaler_pb2_grpc as pb_grpc
from predictive_scaler.keda.answer import METRIC_NAME, TARGET_REPLICAS, KedaAnswer
from predictive_scaler.keda.board import KedaBoard, Lookup
from predictive_scaler.keda.status import ScalerStatusReader
from predictive_scaler.keda.targets import TargetCheck
from predictive_scaler.keda.tls import TlsFiles, server_credentials

log = logging.getLogger("predictive_scaler.keda")

#: The trigger metadata keys naming the PredictiveScaler (KEDA resolves ``…FromEnv`` itself).
SCALER_NAME_KEY = "scalerName"
SCALER_NAME_FROM_ENV_KEY = "scalerNameFromEnv"

#: A Kubernetes object name (RFC 1123 subdomain).
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

_CODES = {"unavailable": grpc.StatusCode.UNAVAILABLE, "failed-precondition": grpc.StatusCode.FAILED_PRECONDITION,
          "not-found": grpc.StatusCode.NOT_FOUND}


def scaler_name(metadata: Mapping[str, str], namespace: str, scaled_object: str) -> str:
    """The PredictiveScaler a trigger names; ConfigError saying what to write when it names none."""
    so = f"ScaledObject {namespace}/{scaled_object}"
    given = {k: str(metadata[k]).strip() for k in (SCALER_NAME_KEY, SCALER_NAME_FROM_ENV_KEY) if k in metadata}
    values = {v for v in given.values() if v}
    if not values:
        raise ConfigError(f"{so}: the trigger's metadata has no {SCALER_NAME_KEY}; set it to the PredictiveScaler's "
                          f"name (same namespace), or set {SCALER_NAME_FROM_ENV_KEY} to an environment variable of "
                          "the scale target's container that holds it (KEDA sends nothing when that variable is "
                          "unset or empty)", field=SCALER_NAME_KEY)
    if len(values) > 1:
        raise ConfigError(f"{so}: {SCALER_NAME_KEY} and {SCALER_NAME_FROM_ENV_KEY} name different PredictiveScalers "
                          f"({' and '.join(sorted(repr(v) for v in values))}); keep one", field=SCALER_NAME_KEY)
    [name] = values
    if "/" in name:
        raise ConfigError(f"{so}: {SCALER_NAME_KEY} {name!r} names a namespace; the PredictiveScaler must be in the "
                          f"ScaledObject's namespace ({namespace}), named by its name alone", field=SCALER_NAME_KEY)
    if len(name) > 253 or not _NAME.fullmatch(name):
        raise ConfigError(f"{so}: {SCALER_NAME_KEY} {name!r} is not a Kubernetes object name (lower-case letters, "
                          "digits, '-' and '.')", field=SCALER_NAME_KEY)
    return name


def metric_spec() -> Any:
    """GetMetricSpec's answer: the same for every scaler, so KEDA's HPA can be built before any decision."""
    return pb.GetMetricSpecResponse(metricSpecs=[pb.MetricSpec(
        metricName=METRIC_NAME, targetSize=TARGET_REPLICAS, targetSizeFloat=float(TARGET_REPLICAS))])


def metric_values(metric_name: str, answer: KedaAnswer) -> Any:
    """GetMetrics' answer: the replicas, whole, in the field each KEDA release reads."""
    return pb.GetMetricsResponse(metricValues=[pb.MetricValue(
        metricName=metric_name, metricValue=answer.replicas, metricValueFloat=float(answer.replicas))])


class AnswerSources:
    """This process's decisions first (the freshest), then the scaler's own object."""

    def __init__(self, board: KedaBoard, status: ScalerStatusReader | None = None) -> None:
        self.board = board
        self.status = status

    def lookup(self, namespace: str, name: str, *, stale_ok: bool = False) -> Lookup:
        local = self.board.lookup(namespace, name, stale_ok=stale_ok)
        if local.code != "unavailable" or self.status is None:
            return local
        found = self.status.lookup(namespace, name, stale_ok=stale_ok)
        if found.code == "unavailable" and local.target is not None:
            return local  # this process decided it, long ago: its "N s old" says more
        return found


class ExternalScaler(pb_grpc.ExternalScalerServicer):
    def __init__(self, answers: AnswerSources, stopping: threading.Event, max_streams: int,
                 targets: TargetCheck | None = None) -> None:
        self.answers = answers
        self.board = answers.board
        self.targets = targets
        self.stopping = stopping
        #: Each open stream holds a worker thread; the rest stay free for the polling calls.
        self.max_streams = max_streams
        self._streams = threading.BoundedSemaphore(max_streams)

    # -- answers ---------------------------------------------------------------------------
    def _lookup(self, ref: Any, context: grpc.ServicerContext, *, for_spec: bool = False) -> Lookup:
        """The scaler's lookup, after the checks of the ScaledObject itself (metadata, target)."""
        try:
            name = scaler_name(ref.scalerMetadata, ref.namespace, ref.name)
        except ConfigError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        found = self.answers.lookup(ref.namespace, name, stale_ok=for_spec)
        if found.target is not None and self.targets is not None:
            verdict = self.targets.check(ref.name, name, found.target)
            if verdict.verdict == "refused":
                context.abort(grpc.StatusCode.PERMISSION_DENIED, verdict.message)
            if verdict.verdict == "unknown" and not for_spec:
                context.abort(grpc.StatusCode.UNAVAILABLE, verdict.message)
        return found

    def _answer(self, ref: Any, context: grpc.ServicerContext) -> KedaAnswer:
        found = self._lookup(ref, context)
        if found.answer is None or found.code != "ok":
            context.abort(_CODES[found.code], found.message)
        assert found.answer is not None
        return found.answer

    def IsActive(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (gRPC names)
        return pb.IsActiveResponse(result=self._answer(request, context).active)

    def StreamIsActive(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        if not self._streams.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{self.max_streams} StreamIsActive streams are open already; use trigger type "
                          "external (polled) for more ScaledObjects")
        try:
            last: bool | None = None
            while context.is_active() and not self.stopping.is_set():
                version = self.board.version
                active = self._answer(request, context).active  # also notices a stale or withdrawn answer
                if active != last:
                    last = active
                    yield pb.IsActiveResponse(result=active)
                self.board.wait(version, timeout=1.0)
        finally:
            self._streams.release()

    def GetMetricSpec(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self._lookup(request, context, for_spec=True)
        return metric_spec()

    def GetMetrics(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        asked = request.metricName or METRIC_NAME
        if not asked.endswith(METRIC_NAME):
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"unknown metric {asked!r}: this scaler serves only {METRIC_NAME!r}")
        return metric_values(asked, self._answer(request.scaledObjectRef, context))


class KedaServer:
    """The gRPC server on ``host:port`` (port 0 picks a free one; see :attr:`port`)."""

    def __init__(self, board: KedaBoard, host: str, port: int, *, workers: int = 64,
                 polling_workers: int = 8, status: ScalerStatusReader | None = None,
                 targets: TargetCheck | None = None, tls: TlsFiles | None = None) -> None:
        self.board = board
        self._stopping = threading.Event()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="keda-grpc"))
        servicer = ExternalScaler(AnswerSources(board, status), self._stopping,
                                  max_streams=max(1, workers - polling_workers), targets=targets)
        pb_grpc.add_ExternalScalerServicer_to_server(servicer, self._server)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.tls = tls
        try:
            if tls is None:
                self.port = self._server.add_insecure_port(address)
            else:
                self.port = self._server.add_secure_port(address, server_credentials(tls))
        except RuntimeError as exc:
            raise ConfigError(f"cannot listen for KEDA on {address} ({exc}); choose another port with "
                              "PREDICTIVE_SCALER_KEDA_PORT", field="kedaPort") from exc
        if not self.port:
            raise ConfigError(f"cannot listen for KEDA on {address}; choose another port with "
                              "PREDICTIVE_SCALER_KEDA_PORT", field="kedaPort")

    def start(self) -> KedaServer:
        self._server.start()
        log.info("KEDA external scaler listening", extra={
            "port": self.port, "tls": "off" if self.tls is None else "mtls" if self.tls.client_ca else "on"})
        return self

    def stop(self, grace: float = 2.0) -> None:
        self._stopping.set()
        self._server.stop(grace).wait(grace + 1)

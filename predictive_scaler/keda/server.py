"""The gRPC server of KEDA's external scaler API, answering from the :class:`KedaBoard`.

A ScaledObject trigger (``type: external`` or ``external-push``) names the
PredictiveScaler in its metadata (``scalerName``); the scaler must be in the
ScaledObject's namespace and in ``mode: keda``. Answers:

- IsActive / StreamIsActive — the metric is above zero (the stream sends the
  current value at once, then each change);
- GetMetricSpec — one metric, target = one replica's planned capacity;
- GetMetrics — the demand the plan provisions for (see :mod:`answer`).

No decision yet, or a stale one → UNAVAILABLE (GetMetricSpec still answers from a stale
decision: the target depends on the spec only); a scaler not served (another
mode, paused, invalid, conflicting) → FAILED_PRECONDITION with the reason; no
``scalerName`` → INVALID_ARGUMENT. StreamMetricSpec is UNIMPLEMENTED, which KEDA
documents as "poll GetMetricSpec instead".

Plain gRPC without TLS: the NetworkPolicy admits only KEDA's namespace to the port.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc

from predictive_scaler.errors import ConfigError
from predictive_scaler.keda import externalscaler_pb2 as pb
from predictive_scaler.keda import externalscaler_pb2_grpc as pb_grpc
from predictive_scaler.keda.answer import METRIC_NAME, KedaAnswer
from predictive_scaler.keda.board import KedaBoard

log = logging.getLogger("predictive_scaler.keda")

#: The trigger metadata key naming the PredictiveScaler.
SCALER_NAME_KEY = "scalerName"

_CODES = {"unavailable": grpc.StatusCode.UNAVAILABLE, "failed-precondition": grpc.StatusCode.FAILED_PRECONDITION}


class ExternalScaler(pb_grpc.ExternalScalerServicer):
    def __init__(self, board: KedaBoard, stopping: threading.Event, max_streams: int) -> None:
        self.board = board
        self.stopping = stopping
        #: Each open stream holds a worker thread; the rest stay free for the polling calls.
        self.max_streams = max_streams
        self._streams = threading.BoundedSemaphore(max_streams)

    # -- answers ---------------------------------------------------------------------------
    def _answer(self, ref: Any, context: grpc.ServicerContext, *, stale_ok: bool = False) -> KedaAnswer:
        name = str(ref.scalerMetadata.get(SCALER_NAME_KEY, "")).strip()
        if not name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"ScaledObject {ref.namespace}/{ref.name}: the trigger's metadata has no "
                          f"{SCALER_NAME_KEY}; set it to the PredictiveScaler's name (same namespace)")
        found = self.board.lookup(ref.namespace, name, stale_ok=stale_ok)
        if found.answer is None:
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
        # The target depends on the spec only: a stale decision's target still holds, so KEDA keeps
        # its HPA's metric spec while GetMetrics says UNAVAILABLE (and the HPA holds its replicas).
        answer = self._answer(request, context, stale_ok=True)
        return pb.GetMetricSpecResponse(metricSpecs=[pb.MetricSpec(
            metricName=METRIC_NAME, targetSizeFloat=answer.target_size,
            targetSize=max(1, round(answer.target_size)))])

    def GetMetrics(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        asked = request.metricName or METRIC_NAME
        if not asked.endswith(METRIC_NAME):
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"unknown metric {asked!r}: this scaler serves only {METRIC_NAME!r}")
        answer = self._answer(request.scaledObjectRef, context)
        return pb.GetMetricsResponse(metricValues=[pb.MetricValue(
            metricName=asked, metricValueFloat=answer.metric_value,
            metricValue=math.ceil(answer.metric_value))])


class KedaServer:
    """The gRPC server on ``host:port`` (port 0 picks a free one; see :attr:`port`)."""

    def __init__(self, board: KedaBoard, host: str, port: int, *, workers: int = 64,
                 polling_workers: int = 8) -> None:
        self.board = board
        self._stopping = threading.Event()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="keda-grpc"))
        servicer = ExternalScaler(board, self._stopping, max_streams=max(1, workers - polling_workers))
        pb_grpc.add_ExternalScalerServicer_to_server(servicer, self._server)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            self.port = self._server.add_insecure_port(address)
        except RuntimeError as exc:
            raise ConfigError(f"cannot listen for KEDA on {address} ({exc}); choose another port with "
                              "PREDICTIVE_SCALER_KEDA_PORT", field="kedaPort") from exc
        if not self.port:
            raise ConfigError(f"cannot listen for KEDA on {address}; choose another port with "
                              "PREDICTIVE_SCALER_KEDA_PORT", field="kedaPort")

    def start(self) -> KedaServer:
        self._server.start()
        log.info("KEDA external scaler listening", extra={"port": self.port})
        return self

    def stop(self, grace: float = 2.0) -> None:
        self._stopping.set()
        self._server.stop(grace).wait(grace + 1)

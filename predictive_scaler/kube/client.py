"""The Kubernetes adapter: the only module that imports ``kubernetes``.

``KubeCluster`` wraps a ``kubernetes.client.ApiClient`` (in-cluster config,
a kubeconfig, or a test server via ``Configuration(host=…)``) and speaks raw
JSON over ``ApiClient.call_api``: one code path for Deployments,
StatefulSets and any custom resource with a ``/scale`` subresource, no
per-call model deserialisation (cheap with thousands of pods), and an exact,
reviewable list of every request it can make — ``API_CALLS`` — from which
the RBAC rules and docs/kube-api-calls.md are derived.

Every ``ApiException``/transport error becomes a ``ClusterError`` (``from
exc``): 409 → ``ConflictError``, 429 → ``ThrottledError`` with Retry-After,
5xx and connection errors retryable. Reads and idempotent writes go through
``call_with_retry``; read-modify-write operations re-read on 409.
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from predictive_scaler.clock import Clock, SystemClock
from predictive_scaler.errors import (
    ClusterError,
    ConfigError,
    ConflictError,
    DataError,
    MissingApiError,
    ThrottledError,
)
from predictive_scaler.kube import manifests
from predictive_scaler.kube.retry import RetryPolicy, call_with_retry

T = TypeVar("T")

_CR_PREFIX = f"/apis/{manifests.GROUP}/{manifests.VERSION}"


# ---------------------------------------------------------------- API calls ---


@dataclass(frozen=True)
class ApiCall:
    """One kind of request the adapter makes.

    ``path`` is a template ({namespace}, {name}, {group}, {version}, {plural});
    ``group``/``resource``/``verb`` are the RBAC rule that permits it
    (``resource`` empty for non-resource URLs such as discovery).
    """

    method: str
    path: str
    verb: str
    group: str
    resource: str
    why: str

    def matches(self, method: str, path: str) -> bool:
        return (
            method.upper() == self.method and _template_regex(self.path).fullmatch(path) is not None
        )


def _template_regex(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[a-z]+\})", template)
    return re.compile("".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts))


_TARGET = "the target workload's group"
API_CALLS: tuple[ApiCall, ...] = (
    ApiCall(
        "GET",
        "/version",
        "get",
        "",
        "",
        "readiness: is the API server reachable (granted to everyone by system:public-info-viewer)",
    ),
    ApiCall(
        "GET",
        "/api/v1",
        "get",
        "",
        "",
        "discovery: resolve a core-group target kind to its plural and check it has /scale",
    ),
    ApiCall(
        "GET",
        "/apis/{group}",
        "get",
        "",
        "",
        "discovery: which versions of the autoscaling group the server serves (the HPA "
        "conflict check uses autoscaling/v2, else v2beta2)",
    ),
    ApiCall(
        "GET",
        "/apis/{group}/{version}",
        "get",
        "",
        "",
        "discovery: resolve a target kind (e.g. a custom resource) to its plural and check "
        "it has /scale; only for kinds not in the built-in table",
    ),
    ApiCall(
        "GET",
        "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}/scale",
        "get",
        _TARGET,
        "{plural}/scale",
        "read the target's desired/current replicas, pod selector and resourceVersion",
    ),
    ApiCall(
        "PATCH",
        "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}/scale",
        "patch",
        _TARGET,
        "{plural}/scale",
        "scale the target (JSON merge patch of spec.replicas, resourceVersion precondition)",
    ),
    ApiCall(
        "GET",
        "/api/v1/namespaces/{namespace}/{plural}/{name}/scale",
        "get",
        "",
        "{plural}/scale",
        "read the scale of a core-group target (ReplicationController)",
    ),
    ApiCall(
        "PATCH",
        "/api/v1/namespaces/{namespace}/{plural}/{name}/scale",
        "patch",
        "",
        "{plural}/scale",
        "scale a core-group target (ReplicationController)",
    ),
    ApiCall(
        "GET",
        "/api/v1/namespaces/{namespace}/pods",
        "list",
        "",
        "pods",
        "count the target's ready and starting pods (labelSelector from its /scale)",
    ),
    ApiCall(
        "GET",
        "/api/v1/pods",
        "list",
        "",
        "pods",
        "sum the GPUs requested on GPU nodes (fieldSelector: not Succeeded/Failed)",
    ),
    ApiCall(
        "GET",
        "/api/v1/nodes",
        "list",
        "",
        "nodes",
        "allocatable nvidia.com/gpu of ready, schedulable GPU nodes",
    ),
    ApiCall(
        "GET",
        "/api/v1/pods",
        "watch",
        "",
        "pods",
        "the cluster cache (kube/cache.py): live pods, watched from the list's resourceVersion",
    ),
    ApiCall(
        "GET",
        "/api/v1/nodes",
        "watch",
        "",
        "nodes",
        "the cluster cache: GPU nodes, watched",
    ),
    ApiCall(
        "GET",
        "/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
        "get",
        "apps",
        "deployments",
        "read the placeholder Deployment <scaler>-prewarm",
    ),
    ApiCall(
        "POST",
        "/apis/apps/v1/namespaces/{namespace}/deployments",
        "create",
        "apps",
        "deployments",
        "create the placeholder Deployment (owned by the PredictiveScaler)",
    ),
    ApiCall(
        "PATCH",
        "/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
        "patch",
        "apps",
        "deployments",
        "resize the placeholder Deployment (merge patch of spec.replicas)",
    ),
    ApiCall(
        "PUT",
        "/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
        "update",
        "apps",
        "deployments",
        "replace the placeholder Deployment when its pod template changed (image, GPUs, "
        "node selector, tolerations, PriorityClass)",
    ),
    ApiCall(
        "DELETE",
        "/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
        "delete",
        "apps",
        "deployments",
        "remove the placeholder (prewarm disabled, forecast-only mode, budget zero)",
    ),
    ApiCall(
        "GET",
        "/apis/scheduling.k8s.io/v1/priorityclasses/{name}",
        "get",
        "scheduling.k8s.io",
        "priorityclasses",
        "check that the placeholder pods' PriorityClass exists and is negative, so real pods "
        "preempt placeholders (cached for minutes)",
    ),
    ApiCall(
        "GET",
        "/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers",
        "list",
        "autoscaling",
        "horizontalpodautoscalers",
        "refuse to act when an HPA targets the same workload",
    ),
    ApiCall(
        "GET",
        "/apis/autoscaling/v2beta2/namespaces/{namespace}/horizontalpodautoscalers",
        "list",
        "autoscaling",
        "horizontalpodautoscalers",
        "the same on servers without autoscaling/v2 (Kubernetes 1.12–1.22)",
    ),
    ApiCall(
        "GET",
        "/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects",
        "list",
        "keda.sh",
        "scaledobjects",
        "refuse to act when a KEDA ScaledObject targets the same workload (404 = KEDA "
        "not installed)",
    ),
    ApiCall(
        "GET",
        "/apis/autoscaling/{version}/horizontalpodautoscalers",
        "list",
        "autoscaling",
        "horizontalpodautoscalers",
        "the cluster cache: HPAs in all namespaces (paginated; v2, else v2beta2)",
    ),
    ApiCall(
        "GET",
        "/apis/autoscaling/{version}/horizontalpodautoscalers",
        "watch",
        "autoscaling",
        "horizontalpodautoscalers",
        "the cluster cache: HPAs, watched (a namespaced controller watches its namespace's path)",
    ),
    ApiCall(
        "GET",
        "/apis/keda.sh/v1alpha1/scaledobjects",
        "list",
        "keda.sh",
        "scaledobjects",
        "the cluster cache: KEDA ScaledObjects in all namespaces (404 = KEDA not installed)",
    ),
    ApiCall(
        "GET",
        "/apis/keda.sh/v1alpha1/scaledobjects",
        "watch",
        "keda.sh",
        "scaledobjects",
        "the cluster cache: ScaledObjects, watched",
    ),
    ApiCall(
        "GET",
        "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
        "list",
        "coordination.k8s.io",
        "leases",
        "sharding: read every shard's Lease (label predictive-scaler.io/shard) in the controller's namespace",
    ),
    ApiCall(
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
        "create",
        "coordination.k8s.io",
        "leases",
        "sharding: create this replica's shard Lease the first time",
    ),
    ApiCall(
        "PUT",
        "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}",
        "update",
        "coordination.k8s.io",
        "leases",
        "sharding: acquire (when expired) and renew this replica's shard Lease (resourceVersion precondition)",
    ),
    ApiCall(
        "POST",
        "/api/v1/namespaces/{namespace}/events",
        "create",
        "",
        "events",
        "record strategy changes, clamps and refusals on the PredictiveScaler",
    ),
    ApiCall(
        "GET",
        _CR_PREFIX + "/namespaces/{namespace}/" + manifests.PLURAL + "/{name}",
        "get",
        manifests.GROUP,
        manifests.PLURAL,
        "read one PredictiveScaler",
    ),
    ApiCall(
        "GET",
        _CR_PREFIX + "/namespaces/{namespace}/" + manifests.PLURAL,
        "list",
        manifests.GROUP,
        manifests.PLURAL,
        "list the PredictiveScalers of a namespace",
    ),
    ApiCall(
        "GET",
        _CR_PREFIX + "/" + manifests.PLURAL,
        "list",
        manifests.GROUP,
        manifests.PLURAL,
        "list PredictiveScalers in all namespaces",
    ),
    ApiCall(
        "PATCH",
        _CR_PREFIX + "/namespaces/{namespace}/" + manifests.PLURAL + "/{name}/status",
        "patch",
        manifests.GROUP,
        manifests.PLURAL + "/status",
        "write conditions, forecast, replicas and planner state (merge patch)",
    ),
)


def api_call_for(method: str, path: str, *, watch: bool = False) -> ApiCall | None:
    """The ``API_CALLS`` entry a request (method, path without query) belongs to; ``watch``: the
    request carried ``watch=true`` (a watch of that collection, its own RBAC verb)."""
    for call in API_CALLS:
        if (call.verb == "watch") == watch and call.matches(method, path):
            return call
    return None


def api_calls_markdown() -> str:
    """docs/kube-api-calls.md, generated from ``API_CALLS``."""
    lines = [
        "# Kubernetes API calls made by predictive-scaler",
        "",
        "Generated from `predictive_scaler.kube.client.API_CALLS` — do not edit by hand;",
        "regenerate with `python -m predictive_scaler.kube.client > docs/kube-api-calls.md`.",
        "A test fails when this file and the constant differ, and the adapter's tests check",
        "that every request it makes matches one of these rows. RBAC rules are derived",
        "from the *verb / group / resource* columns (discovery paths are non-resource",
        "URLs every authenticated user may read). The custom resource's own watch and",
        "patch calls made by kopf are not listed here.",
        "",
        "| Method | Path | RBAC verb | API group | Resource | Why |",
        "|---|---|---|---|---|---|",
    ]
    for call in API_CALLS:
        group = f"`{call.group}`" if call.group else ('`""` (core)' if call.resource else "—")
        resource = f"`{call.resource}`" if call.resource else "(non-resource URL)"
        lines.append(
            f"| {call.method} | `{call.path}` | {call.verb} | {group} | {resource} | {call.why} |"
        )
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------ value types ---


@dataclass(frozen=True)
class WorkloadRef:
    """What a PredictiveScaler scales: anything with a ``/scale`` subresource.

    ``plural`` may be given for a custom resource to skip discovery.
    """

    api_version: str
    kind: str
    name: str
    namespace: str
    plural: str | None = None

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    def describe(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name} ({self.api_version})"


@dataclass(frozen=True)
class ScaleInfo:
    """The target's ``/scale``: desired replicas (spec), current (status), selector."""

    replicas: int
    status_replicas: int
    selector: str | None
    resource_version: str


@dataclass(frozen=True)
class PodCounts:
    """Pods matching a selector. ``starting`` counts pods that exist but are not
    ready yet (including ``unscheduled`` ones waiting for a node); terminating
    and finished pods are in neither."""

    ready: int
    starting: int
    unscheduled: int
    terminating: int


@dataclass(frozen=True)
class NodeCapacity:
    """GPUs on ready, schedulable nodes carrying the GPU resource.

    ``free_gpus`` is summed per node (a node cannot lend to another);
    ``placeholder_gpus`` is the part of ``requested_gpus`` held by
    predictive-scaler placeholders, which any real pod can preempt.
    """

    nodes: int
    allocatable_gpus: int
    requested_gpus: int
    placeholder_gpus: int
    free_gpus: int


@dataclass(frozen=True)
class ConflictingAutoscaler:
    kind: str  # "HorizontalPodAutoscaler" or "ScaledObject"
    name: str
    namespace: str
    #: A ScaledObject's external-scaler triggers: the ``scalerName`` each one names.
    external_scalers: tuple[str, ...] = ()
    #: An HPA's owning ScaledObject (KEDA creates one HPA per ScaledObject).
    owner_scaled_object: str | None = None

    def describe(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True)
class PlaceholderSpec:
    """Everything that defines a scaler's placeholder Deployment except its size."""

    scaler_name: str
    namespace: str
    owner_uid: str
    gpus_per_pod: int
    priority_class: str = manifests.PLACEHOLDER_PRIORITY_CLASS
    image: str = manifests.PLACEHOLDER_IMAGE
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()

    def manifest(self, replicas: int) -> dict[str, Any]:
        return manifests.placeholder_deployment(
            self.scaler_name,
            self.namespace,
            self.owner_uid,
            replicas,
            self.gpus_per_pod,
            self.priority_class,
            self.image,
            self.node_selector,
            self.tolerations,
        )


@dataclass(frozen=True)
class PlaceholderInfo:
    name: str
    namespace: str
    replicas: int
    ready_replicas: int
    gpus_per_pod: int
    template_hash: str | None
    owner_uid: str | None
    resource_version: str

    @property
    def gpus(self) -> int:
        """GPUs the placeholder asks for (desired replicas × GPUs per pod)."""
        return self.replicas * self.gpus_per_pod


# ---------------------------------------------------------------- adapter ---

_BUILTIN_SCALABLE = {
    ("apps", "Deployment"): "deployments",
    ("apps", "StatefulSet"): "statefulsets",
    ("apps", "ReplicaSet"): "replicasets",
    ("", "ReplicationController"): "replicationcontrollers",
}
#: HorizontalPodAutoscaler versions the conflict check can read, preferred first.
HPA_VERSIONS = ("v2", "v2beta2")
_MERGE_PATCH = "application/merge-patch+json"
_JSON = "application/json"
#: Seconds a PriorityClass value is trusted before it is read again (it rarely changes).
PRIORITY_CLASS_TTL = 300.0
#: Items per page of a paginated list (``limit``; the API server's own default cap is 500).
LIST_PAGE_SIZE = 500
#: Pods that hold resources: neither Succeeded nor Failed (a field selector, server-side).
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


class KubeCluster:
    """Typed, small facade over the Kubernetes API for one controller process.

    ``dry_run`` sends every write with ``dryRun=All``: the API server validates
    and admits it but persists nothing (the controller's ``--dry-run``).
    """

    def __init__(
        self,
        api_client: ApiClient,
        *,
        retry: RetryPolicy | None = None,
        clock: Clock | None = None,
        sleep: Callable[[float], object] = time.sleep,
        rng: random.Random | None = None,
        request_timeout: float = 10.0,
        dry_run: bool = False,
        gpu_resource: str = manifests.GPU_RESOURCE,
    ) -> None:
        self._api = api_client
        self._retry = retry or RetryPolicy()
        self._clock = clock or SystemClock()
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._timeout = request_timeout
        self._dry_run = dry_run
        self._gpu_resource = gpu_resource
        self._plurals: dict[tuple[str, str, str], str] = {}
        self._hpa_version: str | None = None
        self._priorities: dict[str, tuple[int | None, float]] = {}
        _own_the_retries(api_client)

    # -- plumbing ----------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = _JSON,
        write: bool = False,
        timeout: float | None = None,
    ) -> Any:
        params = list((query or {}).items())
        if write and self._dry_run:
            params.append(("dryRun", "All"))
        headers = {"Accept": _JSON}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            _, url, headers, body, _ = self._api.param_serialize(
                method=method,
                resource_path=path,
                query_params=params or None,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(
                method, url, header_params=headers, body=body,
                _request_timeout=self._timeout if timeout is None else timeout,
            )
            data = response.read()
        except ApiException as exc:
            raise ClusterError(
                f"{what}: {exc.reason or 'request failed'}; check the API server address "
                "and credentials",
                status=exc.status or None,
                retryable=not exc.status,
            ) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClusterError(
                f"{what}: cannot reach the API server ({type(exc).__name__}: {exc}); it will "
                "be retried — check network policy and the API server if it persists",
                retryable=True,
            ) from exc
        if 200 <= response.status < 300:
            if not data:
                return {}
            try:
                return json.loads(data)
            except ValueError as exc:
                raise ClusterError(
                    f"{what}: the API server answered {response.status} with a body that is "
                    "not JSON; is the configured host really a Kubernetes API server?",
                    status=response.status,
                ) from exc
        raise _error_from_response(response.status, data, response.headers, what)

    def _retrying(
        self, operation: Callable[[], T], what: str, *, retry_conflicts: bool = False
    ) -> T:
        return call_with_retry(
            operation,
            policy=self._retry,
            sleep=self._sleep,
            clock=self._clock,
            rng=self._rng,
            retry_conflicts=retry_conflicts,
            what=what,
        )

    # -- paginated lists and watch streams (used by kube/cache.py) ----------

    def list_paginated(
        self, path: str, query: Mapping[str, str] | None = None, *, what: str, page_size: int = LIST_PAGE_SIZE
    ) -> tuple[list[dict[str, Any]], str]:
        """Every item of a collection, ``page_size`` at a time (``limit``/``continue``), and the
        list's resourceVersion (where a watch starts). A 410 on a continue token (expired while
        paging) restarts the list from the top, once."""
        for _attempt in range(2):
            items: list[dict[str, Any]] = []
            token: str | None = None
            try:
                while True:
                    params = {**(query or {}), "limit": str(page_size)}
                    if token:
                        params["continue"] = token
                    answer: dict[str, Any] = self._retrying(
                        functools.partial(self._request, "GET", path, what=what, query=params), what)
                    items.extend(_items(answer, what))
                    meta = answer.get("metadata") or {}
                    token = meta.get("continue") or None
                    if not token:
                        return items, str(meta.get("resourceVersion") or "")
            except ClusterError as exc:
                if exc.status != 410 or token is None:
                    raise
        raise ClusterError(f"{what}: the list kept expiring while paging (HTTP 410); it is retried")

    def watch_stream(
        self, path: str, resource_version: str, *, what: str, timeout_seconds: int = 300,
        query: Mapping[str, str] | None = None, opened: Callable[[], None] | None = None,
    ) -> Iterable[dict[str, Any]]:
        """Watch events (``{"type", "object"}``) after ``resource_version``, as the server sends them,
        until it closes the stream (``timeoutSeconds``). An ``ERROR`` event becomes a ClusterError
        carrying its code (410 Gone: the resourceVersion is too old — re-list)."""
        params = {**(query or {}), "watch": "true", "resourceVersion": resource_version,
                  "timeoutSeconds": str(timeout_seconds), "allowWatchBookmarks": "true"}
        try:
            _, url, headers, _, _ = self._api.param_serialize(
                method="GET", resource_path=path, query_params=list(params.items()),
                header_params={"Accept": _JSON}, auth_settings=["BearerToken"])
            response = self._api.call_api("GET", url, header_params=headers,
                                          _request_timeout=(self._timeout, timeout_seconds + 30))
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClusterError(f"{what}: cannot open the watch ({type(exc).__name__}: {exc})",
                               status=getattr(exc, "status", None) or None, retryable=True) from exc
        if not 200 <= response.status < 300:
            raise _error_from_response(response.status, response.read(), response.headers, what)
        if opened is not None:
            opened()
        raw: Any = getattr(response, "response", response)
        buffer = b""
        try:
            for chunk in raw.stream(65536, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    try:
                        event = json.loads(line)
                    except ValueError as exc:
                        raise ClusterError(f"{what}: a watch event is not JSON") from exc
                    if event.get("type") == "ERROR":
                        status = (event.get("object") or {}).get("code")
                        raise ClusterError(f"{what}: the watch ended with an error "
                                           f"({(event.get('object') or {}).get('message', '')})",
                                           status=int(status) if isinstance(status, int) else None,
                                           retryable=True)
                    yield event
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClusterError(f"{what}: the watch broke ({type(exc).__name__}: {exc})", retryable=True) from exc
        finally:
            if hasattr(raw, "release_conn"):
                raw.release_conn()

    def ping(self, timeout: float) -> str | None:
        """None when the API server answers ``/version`` within ``timeout`` s, else why not. No retries."""
        try:
            self._request("GET", "/version", what="check the API server", timeout=timeout)
        except ClusterError as exc:
            if exc.status is not None and exc.status < 500 and exc.status not in (401, 403):
                return None  # it answered: reachable, whatever it thinks of /version
            return str(exc)
        return None

    # -- target /scale -----------------------------------------------------

    def resolve_scale_path(self, target: WorkloadRef) -> str:
        """The ``/scale`` URL of ``target``; ConfigError when its kind has none."""
        plural = target.plural or _BUILTIN_SCALABLE.get((target.group, target.kind))
        if plural is None:
            plural = self._discover_scalable_plural(target)
        prefix = f"/apis/{target.group}/{target.version}" if target.group else "/api/v1"
        return (
            f"{prefix}/namespaces/{_seg(target.namespace)}/{_seg(plural)}/{_seg(target.name)}/scale"
        )

    def _discover_scalable_plural(self, target: WorkloadRef) -> str:
        key = (target.group, target.version, target.kind)
        if key in self._plurals:
            return self._plurals[key]
        path = (
            f"/apis/{target.group}/{target.version}" if target.group else f"/api/{target.version}"
        )
        what = f"discover {target.api_version}"
        try:
            listing = self._retrying(lambda: self._request("GET", path, what=what), what)
        except ClusterError as exc:
            if exc.status == 404:
                raise ConfigError(
                    f"the API server does not serve {target.api_version}: check "
                    "spec.target.apiVersion, or install the CRD that defines "
                    f"{target.kind}",
                    field="spec.target.apiVersion",
                ) from exc
            raise
        resources = listing.get("resources") or []
        names = {r.get("name") for r in resources}
        for resource in resources:
            name = resource.get("name", "")
            if resource.get("kind") == target.kind and "/" not in name:
                if f"{name}/scale" not in names:
                    raise ConfigError(
                        f"{target.kind} ({target.api_version}) has no /scale subresource, so "
                        "predictive-scaler cannot scale it; target a Deployment, StatefulSet "
                        "or a custom resource whose CRD enables subresources.scale",
                        field="spec.target.kind",
                    )
                self._plurals[key] = name
                return name
        raise ConfigError(
            f"{target.api_version} serves no kind {target.kind!r}: check the spelling of "
            "spec.target.kind (it is case-sensitive, e.g. Deployment)",
            field="spec.target.kind",
        )

    def get_scale(self, target: WorkloadRef) -> ScaleInfo:
        path = self.resolve_scale_path(target)
        what = f"read the scale of {target.describe()}"
        try:
            scale = self._retrying(lambda: self._request("GET", path, what=what), what)
        except ClusterError as exc:
            if exc.status == 404:
                raise _target_not_found(target) from exc
            raise
        return _scale_info(scale, what)

    def patch_scale(
        self, target: WorkloadRef, replicas: int, *, current: ScaleInfo | None = None
    ) -> ScaleInfo:
        """Set the target's desired replicas; a no-op when already there.

        Sends a merge patch with the resourceVersion last read (``current`` saves
        one GET); on 409 it re-reads and tries again.
        """
        path = self.resolve_scale_path(target)
        what = f"scale {target.describe()} to {replicas}"
        known = [current]

        def attempt() -> ScaleInfo:
            info = known[0]
            known[0] = None  # a retry always re-reads
            if info is None:
                info = _scale_info(self._request("GET", path, what=what), what)
            if info.replicas == replicas:
                return info
            body = manifests.scale_patch(replicas, info.resource_version)
            answer = self._request(
                "PATCH", path, what=what, body=body, content_type=_MERGE_PATCH, write=True
            )
            return _scale_info(answer, what)

        try:
            return self._retrying(attempt, what, retry_conflicts=True)
        except ClusterError as exc:
            if exc.status == 404:
                raise _target_not_found(target) from exc
            raise

    # -- pods and nodes ----------------------------------------------------

    def list_pods(self, namespace: str, selector: str) -> PodCounts:
        """Ready/starting pods matching a label selector (from ``ScaleInfo.selector``)."""
        if not selector:
            raise ClusterError(
                f"no pod selector to count the target's pods in {namespace}: its /scale "
                "reports no status.selector (set subresources.scale.labelSelectorPath in "
                "the CRD)"
            )
        what = f"list pods {selector!r} in {namespace}"
        items, _ = self.list_paginated(
            f"/api/v1/namespaces/{_seg(namespace)}/pods", {"labelSelector": selector}, what=what
        )
        return count_pods(items)

    def list_gpu_nodes(self, selector: str | None = None) -> NodeCapacity:
        """Allocatable, requested and free GPUs over ready, schedulable GPU nodes."""
        what = "list GPU nodes"
        query = {"labelSelector": selector} if selector else None
        nodes, _ = self.list_paginated("/api/v1/nodes", query, what=what)
        allocatable = {}
        for node in nodes:
            gpus = _quantity_int(
                (node.get("status") or {}).get("allocatable", {}).get(self._gpu_resource)
            )
            if gpus > 0 and _node_usable(node):
                allocatable[node["metadata"]["name"]] = gpus
        if not allocatable:
            return NodeCapacity(0, 0, 0, 0, 0)
        what = "list pods on GPU nodes"
        pods, _ = self.list_paginated("/api/v1/pods", {"fieldSelector": LIVE_PODS}, what=what)
        requested = dict.fromkeys(allocatable, 0)
        placeholder = 0
        for pod in pods:
            node_name = (pod.get("spec") or {}).get("nodeName")
            if node_name not in requested:
                continue
            gpus = pod_gpu_request(pod, self._gpu_resource)
            requested[node_name] += gpus
            labels = (pod.get("metadata") or {}).get("labels") or {}
            if labels.get(manifests.ROLE_LABEL) == manifests.PLACEHOLDER_ROLE:
                placeholder += gpus
        return NodeCapacity(
            nodes=len(allocatable),
            allocatable_gpus=sum(allocatable.values()),
            requested_gpus=sum(requested.values()),
            placeholder_gpus=placeholder,
            free_gpus=sum(max(0, allocatable[n] - requested[n]) for n in allocatable),
        )

    # -- placeholder -------------------------------------------------------

    def priority_class_value(self, name: str) -> int | None:
        """The ``value`` of PriorityClass ``name`` (None: it does not exist), cached for
        ``PRIORITY_CLASS_TTL`` seconds. ConfigError when the controller may not read it."""
        now = self._clock.now().timestamp()
        cached = self._priorities.get(name)
        if cached is not None and now - cached[1] < PRIORITY_CLASS_TTL:
            return cached[0]
        what = f"read PriorityClass {name}"

        def attempt() -> int | None:
            try:
                found = self._request("GET", f"/apis/scheduling.k8s.io/v1/priorityclasses/{_seg(name)}", what=what)
            except ClusterError as exc:
                if exc.status == 404:
                    return None
                if exc.status == 403:
                    raise ConfigError(
                        f"cannot read PriorityClass {name!r} (403 Forbidden): the controller checks that "
                        "placeholder pods run at a negative priority; grant it get on priorityclasses "
                        "(deploy/base/rbac-controller.yaml)",
                        field="spec.prewarm.priorityClassName",
                    ) from exc
                raise
            value = found.get("value") if isinstance(found, dict) else None
            if isinstance(value, bool) or not isinstance(value, int):
                raise ClusterError(f"{what}: the answer has no integer value ({value!r})")
            return value

        value = self._retrying(attempt, what)
        self._priorities[name] = (value, now)
        return value

    def get_placeholder(self, scaler_name: str, namespace: str) -> PlaceholderInfo | None:
        what = f"read placeholder {namespace}/{manifests.placeholder_name(scaler_name)}"
        found = self._retrying(lambda: self._read_placeholder(scaler_name, namespace), what)
        return None if found is None else _placeholder_info(found)

    def _read_placeholder(self, scaler_name: str, namespace: str) -> dict[str, Any] | None:
        name = manifests.placeholder_name(scaler_name)
        what = f"read placeholder {namespace}/{name}"
        try:
            deployment = self._request("GET", _deployment_path(namespace, name), what=what)
        except ClusterError as exc:
            if exc.status == 404:
                return None
            raise
        labels = (deployment.get("metadata") or {}).get("labels") or {}
        if (
            labels.get(manifests.MANAGED_BY_LABEL) != manifests.COMPONENT
            or labels.get(manifests.SCALER_LABEL) != scaler_name
        ):
            raise ClusterError(
                f"Deployment {namespace}/{name} exists but is not the placeholder of "
                f"PredictiveScaler {scaler_name} (labels {manifests.MANAGED_BY_LABEL}="
                f"{manifests.COMPONENT}, {manifests.SCALER_LABEL}={scaler_name} missing); "
                "predictive-scaler will not touch it — rename that Deployment or the scaler"
            )
        return deployment

    def ensure_placeholder(self, spec: PlaceholderSpec, replicas: int) -> PlaceholderInfo:
        """Create, resize or re-template the placeholder so it holds ``replicas`` pods.

        Replicas alone → merge patch; template or owner changed → replace (PUT)
        with the read resourceVersion; missing → create. Re-reads on 409.
        ``replicas`` may be 0 (kept, cheaper than delete/create churn); call
        ``delete_placeholder`` to remove it.
        """
        desired = spec.manifest(replicas)
        name = desired["metadata"]["name"]
        what = f"ensure placeholder {spec.namespace}/{name} at {replicas} pod(s)"
        want_hash = desired["metadata"]["annotations"][manifests.TEMPLATE_HASH_ANNOTATION]

        def attempt() -> PlaceholderInfo:
            existing = self._read_placeholder(spec.scaler_name, spec.namespace)
            if existing is None:
                created = self._request(
                    "POST",
                    f"/apis/apps/v1/namespaces/{_seg(spec.namespace)}/deployments",
                    what=what,
                    body=desired,
                    write=True,
                )
                return _placeholder_info(created)
            info = _placeholder_info(existing)
            if info.template_hash != want_hash or info.owner_uid != spec.owner_uid:
                body = dict(desired)
                body["metadata"] = {
                    **desired["metadata"],
                    "resourceVersion": info.resource_version,
                }
                replaced = self._request(
                    "PUT", _deployment_path(spec.namespace, name), what=what, body=body, write=True
                )
                return _placeholder_info(replaced)
            if info.replicas == replicas:
                return info
            patched = self._request(
                "PATCH",
                _deployment_path(spec.namespace, name),
                what=what,
                body={
                    "metadata": {"resourceVersion": info.resource_version},
                    "spec": {"replicas": replicas},
                },
                content_type=_MERGE_PATCH,
                write=True,
            )
            return _placeholder_info(patched)

        return self._retrying(attempt, what, retry_conflicts=True)

    def delete_placeholder(self, scaler_name: str, namespace: str) -> bool:
        """Remove the placeholder and its pods; False when there was none."""
        name = manifests.placeholder_name(scaler_name)
        what = f"delete placeholder {namespace}/{name}"

        def attempt() -> bool:
            existing = self._read_placeholder(scaler_name, namespace)
            if existing is None:
                return False
            # The uid precondition makes sure the object checked above is the one deleted.
            body = {
                "kind": "DeleteOptions",
                "apiVersion": "v1",
                "propagationPolicy": "Background",
                "preconditions": {"uid": existing["metadata"]["uid"]},
            }
            try:
                self._request(
                    "DELETE", _deployment_path(namespace, name), what=what, body=body, write=True
                )
            except ClusterError as exc:
                if exc.status == 404:
                    return False
                raise
            return True

        return self._retrying(attempt, what, retry_conflicts=True)

    # -- other autoscalers ---------------------------------------------------

    def hpa_version(self, *, refresh: bool = False) -> str:
        """The HorizontalPodAutoscaler version this server serves (``HPA_VERSIONS`` order), discovered
        once and remembered; MissingApiError when it serves none of them."""
        if self._hpa_version is not None and not refresh:
            return self._hpa_version
        what = "discover the autoscaling API versions"
        try:
            group = self._retrying(lambda: self._request("GET", "/apis/autoscaling", what=what), what)
        except ClusterError as exc:
            if exc.status != 404:
                raise
            group = {}
        served = [str(v.get("version")) for v in (group or {}).get("versions") or [] if isinstance(v, dict)]
        for version in HPA_VERSIONS:
            if version in served:
                self._hpa_version = version
                return version
        wanted = " or ".join(f"autoscaling/{v}" for v in HPA_VERSIONS)
        has = ", ".join(f"autoscaling/{v}" for v in served) or "no autoscaling API"
        raise MissingApiError(
            f"the API server serves neither {wanted.replace(' or ', ' nor ')} (it serves {has}), so the "
            "check for a HorizontalPodAutoscaler on the same target cannot run and nothing is scaled; "
            "Kubernetes 1.23+ serves autoscaling/v2, 1.12–1.25 autoscaling/v2beta2",
            api=wanted,
        )

    def list_conflicting_autoscalers(
        self, target: WorkloadRef
    ) -> tuple[ConflictingAutoscaler, ...]:
        """HPAs and KEDA ScaledObjects in the target's namespace that scale it too."""
        namespace = _seg(target.namespace)
        what = f"list HPAs in {target.namespace}"

        def list_hpas(version: str) -> list[dict[str, Any]]:
            return self.list_paginated(
                f"/apis/autoscaling/{version}/namespaces/{namespace}/horizontalpodautoscalers", what=what
            )[0]

        try:
            answer = list_hpas(self.hpa_version())
        except ClusterError as exc:
            if exc.status != 404 or isinstance(exc, MissingApiError):
                raise
            # The server changed (an upgrade dropped the version we found): discover again.
            answer = list_hpas(self.hpa_version(refresh=True))
        found = list(hpa_conflicts(answer, target))
        what = f"list KEDA ScaledObjects in {target.namespace}"
        try:
            scaled_objects, _ = self.list_paginated(
                f"/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects", what=what
            )
        except ClusterError as exc:
            if exc.status != 404:
                raise
            scaled_objects = []  # the CRD is not installed: KEDA is absent
        found.extend(scaled_object_conflicts(scaled_objects, target))
        return tuple(found)

    # -- events and the custom resource ---------------------------------------

    def create_event(
        self,
        involved_object: Mapping[str, Any],
        reason: str,
        message: str,
        type: str,
        now: datetime,
        *,
        instance: str | None = None,
    ) -> None:
        """Record a core/v1 Event (see ``manifests.event``)."""
        body = manifests.event(involved_object, reason, message, type, now, instance=instance)
        namespace = body["metadata"]["namespace"]
        what = f"record event {reason} on {involved_object.get('kind')} {namespace}/{involved_object.get('name')}"
        self._retrying(
            lambda: self._request(
                "POST",
                f"/api/v1/namespaces/{_seg(namespace)}/events",
                what=what,
                body=body,
                write=True,
            ),
            what,
        )

    def get_scaler(self, name: str, namespace: str) -> dict[str, Any]:
        what = f"read PredictiveScaler {namespace}/{name}"
        return self._retrying(
            lambda: self._request("GET", _scaler_path(namespace, name), what=what), what
        )

    def list_scalers(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """PredictiveScalers of one namespace, or of all namespaces when None."""
        path = (
            f"{_CR_PREFIX}/namespaces/{_seg(namespace)}/{manifests.PLURAL}"
            if namespace
            else f"{_CR_PREFIX}/{manifests.PLURAL}"
        )
        what = f"list PredictiveScalers in {namespace or 'all namespaces'}"
        return self.list_paginated(path, what=what)[0]

    # -- shard Leases (controller/shards.py) ------------------------------------

    def list_leases(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        what = f"list shard Leases in {namespace}"
        return self.list_paginated(
            f"/apis/coordination.k8s.io/v1/namespaces/{_seg(namespace)}/leases", {"labelSelector": selector},
            what=what,
        )[0]

    def write_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create the Lease (no resourceVersion in ``body``) or replace it (with one: 409 when it changed
        since it was read — someone else renewed it). No retry on 409: the caller re-reads."""
        name = body["metadata"]["name"]
        what = f"write Lease {namespace}/{name}"
        base = f"/apis/coordination.k8s.io/v1/namespaces/{_seg(namespace)}/leases"
        if (body.get("metadata") or {}).get("resourceVersion"):
            return self._retrying(
                lambda: self._request("PUT", f"{base}/{_seg(name)}", what=what, body=body, write=True), what)
        return self._retrying(lambda: self._request("POST", base, what=what, body=body, write=True), what)

    def patch_status(
        self, scaler_name: str, namespace: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch the scaler's status subresource; returns the updated object.

        No resourceVersion: a merge patch is applied by the server to the
        latest object, so retrying it after a 409 is safe.
        """
        body = manifests.status_patch(status)
        what = f"write the status of PredictiveScaler {namespace}/{scaler_name}"
        return self._retrying(
            lambda: self._request(
                "PATCH",
                _scaler_path(namespace, scaler_name) + "/status",
                what=what,
                body=body,
                content_type=_MERGE_PATCH,
                write=True,
            ),
            what,
            retry_conflicts=True,
        )


# urllib3 by default re-sends a GET answered 429/503 with Retry-After, sleeping in
# real time outside our bounded, clock-injected policy. Keep only quick
# connection retries (nothing reached the server) at the transport level.
_TRANSPORT_RETRIES = urllib3.Retry(
    total=2,
    connect=2,
    read=0,
    status=0,
    other=0,
    redirect=0,
    respect_retry_after_header=False,
    raise_on_status=False,
    backoff_factor=0,
)


def _own_the_retries(api_client: ApiClient) -> None:
    pool = getattr(getattr(api_client, "rest_client", None), "pool_manager", None)
    if pool is not None and hasattr(pool, "connection_pool_kw"):
        pool.connection_pool_kw["retries"] = _TRANSPORT_RETRIES
        pool.clear()  # pools created earlier would keep the old setting


def api_client_from_environment(
    kubeconfig: str | None = None, context: str | None = None
) -> ApiClient:
    """An ApiClient for the controller: in-cluster config when running in a pod
    (and no ``kubeconfig`` given), else the kubeconfig (``$KUBECONFIG`` or
    ``~/.kube/config``). Raises ConfigError when neither is usable."""
    from kubernetes import config as kube_config
    from kubernetes.client import Configuration

    configuration = Configuration()
    default_host = configuration.host
    in_cluster = kubeconfig is None and _in_cluster()
    where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    if not in_cluster:
        check_kubeconfig(kubeconfig, context)
    try:
        if in_cluster:
            kube_config.load_incluster_config(client_configuration=configuration)
        else:
            kube_config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
    except (kube_config.ConfigException, OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        # ValueError: bad base64 certificate data; Type/Key/AttributeError: a malformed entry
        raise ConfigError(
            f"cannot load Kubernetes credentials from {'the ServiceAccount' if in_cluster else where} "
            f"({type(exc).__name__}: {exc}); fix that file (`kubectl config view` shows what it holds), "
            "run in a pod with a ServiceAccount, or pass another --kubeconfig",
            field="kubeconfig",
        ) from exc
    if not in_cluster and (not configuration.host or configuration.host == default_host):
        raise ConfigError(
            f"kubeconfig {where}: the cluster of the current context has no server address; set "
            "clusters[].cluster.server (e.g. https://10.0.0.1:6443) or pass another --kubeconfig",
            field="kubeconfig",
        )
    configuration.retries = _TRANSPORT_RETRIES
    return ApiClient(configuration)


def check_kubeconfig(path: str | None, context: str | None = None) -> None:
    """Refuse, with what is wrong and what to do, a kubeconfig the kubernetes library would crash on
    (not a file, not UTF-8, not YAML, not a mapping) or one whose exec plugin is not installed."""
    import shutil

    import yaml

    from predictive_scaler.yaml_input import check_size

    files = [path] if path else [f for f in os.environ.get("KUBECONFIG", "").split(os.pathsep) if f]
    if not files:
        files = [os.path.expanduser("~/.kube/config")]
        if not os.path.exists(files[0]):
            return  # the library says "no configuration found"
    for f in files:
        if not os.path.exists(f):
            if path:
                raise ConfigError(f"--kubeconfig {f}: no such file; give your kubeconfig (`kubectl config view "
                                  "--raw` prints it)", field="kubeconfig")
            continue
        if os.path.isdir(f):
            raise ConfigError(f"kubeconfig {f}: is a directory; give the kubeconfig file inside it (usually "
                              "~/.kube/config)", field="kubeconfig")
        try:
            with open(f, "rb") as fh:
                text = fh.read(10 * 1024 * 1024).decode("utf-8")
            doc = check_size(yaml.safe_load(text), f"kubeconfig {f}", field="kubeconfig")
        except RecursionError as exc:
            raise ConfigError(f"kubeconfig {f}: nested too deeply to read; give your kubeconfig file",
                              field="kubeconfig") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"kubeconfig {f}: not text (not UTF-8 at byte {exc.start}); give a kubeconfig "
                              "YAML file (`kubectl config view --raw` prints one)", field="kubeconfig") from exc
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"kubeconfig {f}: not valid YAML{at} ({getattr(exc, 'problem', None) or exc}); fix "
                              "the file or export it again with `kubectl config view --raw`",
                              field="kubeconfig") from exc
        except OSError as exc:
            raise ConfigError(f"kubeconfig {f}: cannot be read ({exc.strerror or exc}); check its permissions",
                              field="kubeconfig") from exc
        if doc is None:
            continue  # empty: the library's own message names it
        if not isinstance(doc, dict):
            raise ConfigError(f"kubeconfig {f}: a kubeconfig is a YAML mapping (apiVersion, clusters, contexts, "
                              f"users), this is a {type(doc).__name__}; give your kubeconfig file",
                              field="kubeconfig")
        for section in ("clusters", "contexts", "users"):
            entries = doc.get(section)
            if entries is not None and (not isinstance(entries, list)
                                        or not all(isinstance(e, dict) for e in entries)):
                raise ConfigError(f"kubeconfig {f}: {section} must be a list of named entries; fix the file or "
                                  "export it again with `kubectl config view --raw`", field="kubeconfig")
        current = context or doc.get("current-context")
        ctx = next((c.get("context") for c in doc.get("contexts") or [] if c.get("name") == current), None)
        user_name = ctx.get("user") if isinstance(ctx, dict) else None
        user = next((u.get("user") for u in doc.get("users") or [] if u.get("name") == user_name), None)
        plugin = user.get("exec") if isinstance(user, dict) else None
        command = plugin.get("command") if isinstance(plugin, dict) else None
        if isinstance(command, str) and shutil.which(command) is None:
            raise ConfigError(f"kubeconfig {f}: user {user_name!r} logs in through the exec plugin {command!r}, "
                              "which is not installed here (not found on PATH); install it or use a kubeconfig "
                              "with a token or client certificate", field="kubeconfig")


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )


# ------------------------------------------------------------- pure helpers ---


def count_pods(pods: Iterable[Mapping[str, Any]]) -> PodCounts:
    """Classify pods as the HPA does: ready = Running with condition Ready=True."""
    ready = starting = unscheduled = terminating = 0
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            terminating += 1
            continue
        status = pod.get("status") or {}
        phase = status.get("phase")
        if phase in ("Succeeded", "Failed"):
            continue
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        if phase == "Running" and conditions.get("Ready") == "True":
            ready += 1
            continue
        starting += 1
        if conditions.get("PodScheduled") == "False":
            unscheduled += 1
    return PodCounts(ready, starting, unscheduled, terminating)


def pod_gpu_request(pod: Mapping[str, Any], resource: str = manifests.GPU_RESOURCE) -> int:
    """GPUs the scheduler reserves for a pod: max(app containers + sidecars,
    largest plain init container). Extended resources default request = limit."""
    spec = pod.get("spec") or {}

    def request(container: Mapping[str, Any]) -> int:
        resources = container.get("resources") or {}
        value = (resources.get("requests") or {}).get(resource)
        if value is None:
            value = (resources.get("limits") or {}).get(resource)
        return _quantity_int(value)

    inits = spec.get("initContainers") or []
    sidecars = sum(request(c) for c in inits if c.get("restartPolicy") == "Always")
    plain_inits = [request(c) for c in inits if c.get("restartPolicy") != "Always"]
    main = sum(request(c) for c in spec.get("containers") or []) + sidecars
    return max([main, *plain_inits])


def _quantity_int(value: Any) -> int:
    """A GPU count from a Kubernetes quantity (``"8"``, ``"1k"``), read by ``kubernetes.utils.parse_quantity``."""
    if value is None:
        return 0
    try:
        amount = parse_quantity(value)
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise DataError(
            f"GPU quantity {value!r} is not a Kubernetes quantity; GPUs are counted in whole units, e.g. \"8\""
        ) from exc
    if amount != amount.to_integral_value() or amount < 0:
        raise DataError(f"GPU quantity {value!r} is not a whole number ≥ 0; GPUs are counted in units")
    return int(amount)


def hpa_conflicts(
    hpas: Iterable[Mapping[str, Any]], target: WorkloadRef
) -> Iterable[ConflictingAutoscaler]:
    """The HPAs (of the target's namespace) whose scaleTargetRef is ``target``."""
    for hpa in hpas:
        meta = hpa.get("metadata") or {}
        if meta.get("namespace", target.namespace) != target.namespace:
            continue
        if _targets(((hpa.get("spec") or {}).get("scaleTargetRef")) or {}, target, None):
            yield ConflictingAutoscaler("HorizontalPodAutoscaler", meta["name"], target.namespace,
                                        owner_scaled_object=_owner(hpa, "ScaledObject"))


def scaled_object_conflicts(
    scaled_objects: Iterable[Mapping[str, Any]], target: WorkloadRef
) -> Iterable[ConflictingAutoscaler]:
    """The KEDA ScaledObjects (of the target's namespace) whose scaleTargetRef is ``target``."""
    for so in scaled_objects:
        meta = so.get("metadata") or {}
        if meta.get("namespace", target.namespace) != target.namespace:
            continue
        # KEDA defaults an omitted kind/apiVersion to an apps/v1 Deployment.
        if _targets(((so.get("spec") or {}).get("scaleTargetRef")) or {}, target, "apps/v1"):
            yield ConflictingAutoscaler("ScaledObject", meta["name"], target.namespace,
                                        external_scalers=external_scaler_names(so))


def node_gpus(node: Mapping[str, Any], resource: str = manifests.GPU_RESOURCE) -> int:
    """Allocatable GPUs of a ready, schedulable node (0 otherwise)."""
    gpus = _quantity_int(((node.get("status") or {}).get("allocatable") or {}).get(resource))
    return gpus if gpus > 0 and _node_usable(node) else 0


def _node_usable(node: Mapping[str, Any]) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def _targets(ref: Mapping[str, Any], target: WorkloadRef, default_api_version: str | None) -> bool:
    kind = ref.get("kind") or ("Deployment" if default_api_version else None)
    if kind != target.kind or ref.get("name") != target.name:
        return False
    api_version = ref.get("apiVersion") or default_api_version
    if api_version is None:
        return True  # an HPA may omit apiVersion; kind and name decide
    # Old manifests still name Deployments under extensions/v1beta1: same objects.
    group = api_version.rpartition("/")[0]
    return _LEGACY_GROUPS.get(group, group) == _LEGACY_GROUPS.get(target.group, target.group)


_LEGACY_GROUPS = {"extensions": "apps"}


def _items(answer: Any, what: str) -> list[dict[str, Any]]:
    items = answer.get("items") if isinstance(answer, dict) else None
    if not isinstance(items, list):
        raise ClusterError(f"{what}: the API server answered without an items list")
    return items


def _scale_info(scale: Any, what: str) -> ScaleInfo:
    try:
        return ScaleInfo(
            replicas=int((scale.get("spec") or {}).get("replicas") or 0),
            status_replicas=int((scale.get("status") or {}).get("replicas") or 0),
            selector=(scale.get("status") or {}).get("selector") or None,
            resource_version=str(scale["metadata"]["resourceVersion"]),
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ClusterError(f"{what}: the API server answered with a malformed Scale") from exc


def _placeholder_info(deployment: Mapping[str, Any]) -> PlaceholderInfo:
    metadata = deployment.get("metadata") or {}
    spec = deployment.get("spec") or {}
    pod_spec = ((spec.get("template") or {}).get("spec")) or {}
    owners = [o for o in metadata.get("ownerReferences") or [] if o.get("controller")]
    return PlaceholderInfo(
        name=metadata.get("name", ""),
        namespace=metadata.get("namespace", ""),
        replicas=int(spec.get("replicas") or 0),
        ready_replicas=int((deployment.get("status") or {}).get("readyReplicas") or 0),
        gpus_per_pod=pod_gpu_request({"spec": pod_spec}),
        template_hash=(metadata.get("annotations") or {}).get(manifests.TEMPLATE_HASH_ANNOTATION),
        owner_uid=owners[0].get("uid") if owners else None,
        resource_version=str(metadata.get("resourceVersion", "")),
    )


def _target_not_found(target: WorkloadRef) -> ClusterError:
    return ClusterError(
        f"target not found: {target.describe()} does not exist; create it or fix "
        "spec.target (apiVersion, kind, name) of the PredictiveScaler",
        status=404,
    )


def _error_from_response(
    status: int, data: bytes | None, headers: Mapping[str, str], what: str
) -> ClusterError:
    message = ""
    try:
        parsed = json.loads(data or b"{}")
        if isinstance(parsed, dict):
            message = str(parsed.get("message") or "")
    except ValueError:
        message = (data or b"")[:200].decode("utf-8", "replace")
    detail = f"{what}: HTTP {status}" + (f": {message}" if message else "")
    if status == 409:
        return ConflictError(f"{detail} (the object changed since it was read; re-read and retry)")
    if status == 429:
        retry_after = _retry_after_seconds(headers)
        return ThrottledError(
            f"{detail} (throttled by the API server; backing off)", retry_after=retry_after
        )
    if status >= 500:
        return ClusterError(
            f"{detail} (API server error; retried with backoff)", status=status, retryable=True
        )
    if status in (401, 403):
        return ClusterError(
            f"{detail} (the controller's ServiceAccount lacks this permission; compare the "
            "RBAC rules with docs/kube-api-calls.md)",
            status=status,
        )
    return ClusterError(detail, status=status)


def _retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After") if headers else None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


def _seg(value: str) -> str:
    return quote(str(value), safe="")


def _deployment_path(namespace: str, name: str) -> str:
    return f"/apis/apps/v1/namespaces/{_seg(namespace)}/deployments/{_seg(name)}"


def _scaler_path(namespace: str, name: str) -> str:
    return f"{_CR_PREFIX}/namespaces/{_seg(namespace)}/{manifests.PLURAL}/{_seg(name)}"


if __name__ == "__main__":
    print(api_calls_markdown(), end="")


#: KEDA ScaledObject trigger types that call an external scaler (mode keda serves them).
EXTERNAL_TRIGGERS = ("external", "external-push")


def _owner(obj: Mapping[str, Any], kind: str) -> str | None:
    """Name of the ``kind`` that owns ``obj`` (its ownerReferences), if any."""
    for ref in ((obj.get("metadata") or {}).get("ownerReferences")) or ():
        if isinstance(ref, Mapping) and ref.get("kind") == kind and isinstance(ref.get("name"), str):
            return str(ref["name"])
    return None


def external_scaler_names(scaled_object: Mapping[str, Any]) -> tuple[str, ...]:
    """The ``scalerName`` of each external / external-push trigger of a KEDA ScaledObject."""
    names = []
    for trigger in ((scaled_object.get("spec") or {}).get("triggers")) or ():
        if not isinstance(trigger, Mapping) or trigger.get("type") not in EXTERNAL_TRIGGERS:
            continue
        name = (trigger.get("metadata") or {}).get("scalerName")
        if isinstance(name, str):
            names.append(name)
    return tuple(names)

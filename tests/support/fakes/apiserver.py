"""A stateful stand-in for the Kubernetes API server, on pytest-httpserver.

No real kube-apiserver can run on these machines, so this serves the real
request/response shapes of every call ``predictive_scaler.kube.client`` makes
(and a little more): discovery, list with label/field selectors, create, get,
update, merge/strategic/JSON patch, delete with preconditions and garbage
collection of owned objects, ``/scale`` and ``/status`` subresources. It keeps
objects in memory, bumps ``resourceVersion`` on every write, answers 409 to a
stale ``resourceVersion``, refuses malformed bodies and wrong content types
like the real server (built-in kinds are validated with
``kubernetes_validate --strict``), honours ``dryRun=All``, and injects faults.
Every request is recorded (method, path, query, content type, body, status):
the RBAC check and the fault matrix read that log.

Use it from any test directory::

    @pytest.fixture
    def fake_api(httpserver):
        with FakeApiServer(httpserver) as server:
            yield server          # server.api_client talks to it
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kubernetes_validate
from kubernetes.client import ApiClient, Configuration
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

KUBERNETES_VERSION = "1.33"
_MERGE = "application/merge-patch+json"
_STRATEGIC = "application/strategic-merge-patch+json"
_JSON_PATCH = "application/json-patch+json"


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True
    scale: bool = False
    status: bool = False
    builtin: bool = True  # validated against the Kubernetes schemas; custom kinds are not
    verbs: tuple[str, ...] = ("create", "delete", "get", "list", "patch", "update", "watch")

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


BUILTIN_TYPES = (
    ResourceType("", "v1", "Pod", "pods", status=True),
    ResourceType("", "v1", "Node", "nodes", namespaced=False, status=True),
    ResourceType("", "v1", "Event", "events"),
    ResourceType("", "v1", "Namespace", "namespaces", namespaced=False, status=True),
    ResourceType(
        "", "v1", "ReplicationController", "replicationcontrollers", scale=True, status=True
    ),
    ResourceType("apps", "v1", "Deployment", "deployments", scale=True, status=True),
    ResourceType("apps", "v1", "StatefulSet", "statefulsets", scale=True, status=True),
    ResourceType("apps", "v1", "ReplicaSet", "replicasets", scale=True, status=True),
    ResourceType(
        "autoscaling", "v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", status=True
    ),
    ResourceType("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", namespaced=False),
)
PREDICTIVE_SCALER_TYPE = ResourceType(
    "autoscaling.predictive-scaler.io",
    "v1alpha1",
    "PredictiveScaler",
    "predictivescalers",
    status=True,
    builtin=False,
)
SCALED_OBJECT_TYPE = ResourceType(
    "keda.sh", "v1alpha1", "ScaledObject", "scaledobjects", status=True, builtin=False
)


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    body: Any
    status: int


@dataclass
class _Fault:
    status: int
    remaining: int
    pattern: re.Pattern[str] | None = None
    method: str | None = None
    retry_after: float | None = None

    def applies(self, method: str, path: str) -> bool:
        if self.remaining <= 0:
            return False
        if self.method is not None and self.method != method:
            return False
        return self.pattern is None or self.pattern.search(path) is not None


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def body(self) -> dict[str, Any]:
        return status_body(self.code, self.reason, self.message, self.details)


def status_body(
    code: int, reason: str, message: str, details: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": dict(details or {}),
        "code": code,
    }


_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    502: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class FakeApiServer:
    """In-memory Kubernetes API on a pytest-httpserver ``HTTPServer``."""

    def __init__(self, httpserver: HTTPServer, *, keda_installed: bool = False) -> None:
        self.httpserver = httpserver
        self.requests: list[RecordedRequest] = []
        self._lock = threading.RLock()
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._objects: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {}
        self._resource_version = 1000
        self._faults: list[_Fault] = []
        self._patch_count = 0
        self._every_nth_patch: tuple[int, int] | None = None
        for rtype in (*BUILTIN_TYPES, PREDICTIVE_SCALER_TYPE):
            self.register_type(rtype)
        if keda_installed:
            self.install_keda()
        # deploy/base is applied: the placeholder PriorityClass exists (value -10).
        self.add_priority_class("predictive-scaler-placeholder", -10)
        httpserver.expect_request(re.compile(".*")).respond_with_handler(self._handle)
        configuration = Configuration(host=httpserver.url_for("/").rstrip("/"))
        # Callers see exactly what the server answered: no hidden urllib3 retries
        # (which would sleep for real on a 429/503 with Retry-After).
        configuration.retries = False
        self.api_client = ApiClient(configuration)

    def __enter__(self) -> FakeApiServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.api_client.close()

    # ------------------------------------------------------------ set-up ---

    def register_type(self, rtype: ResourceType) -> None:
        """Serve a resource type (a CRD being installed)."""
        with self._lock:
            self._types[(rtype.group, rtype.version, rtype.plural)] = rtype
            self._objects.setdefault((rtype.group, rtype.plural), {})

    def unregister_type(self, group: str, version: str, plural: str) -> None:
        """Stop serving one version of a type (an older or newer server); its objects stay stored."""
        with self._lock:
            self._types.pop((group, version, plural), None)

    def install_keda(self) -> None:
        self.register_type(SCALED_OBJECT_TYPE)

    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Store an object as if another client created it; returns the stored copy."""
        with self._lock:
            rtype = self._type_of(obj)
            stored = copy.deepcopy(dict(obj))
            metadata = stored.setdefault("metadata", {})
            if not rtype.namespaced:
                metadata.pop("namespace", None)
            else:
                metadata.setdefault("namespace", "default")
            self._stamp_new(stored)
            self._bucket(rtype)[(metadata.get("namespace", ""), metadata["name"])] = stored
            return copy.deepcopy(stored)

    def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        with self._lock:
            rtype = self._type_of({"apiVersion": api_version, "kind": kind})
            found = self._bucket(rtype).get((namespace or "", name))
            return copy.deepcopy(found) if found else None

    def objects(
        self, api_version: str, kind: str, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        with self._lock:
            rtype = self._type_of({"apiVersion": api_version, "kind": kind})
            return [
                copy.deepcopy(o)
                for (ns, _), o in sorted(self._bucket(rtype).items())
                if namespace is None or ns == namespace
            ]

    def touch(self, api_version: str, kind: str, namespace: str | None, name: str) -> str:
        """Another writer changed the object: bump its resourceVersion; returns it."""
        with self._lock:
            rtype = self._type_of({"apiVersion": api_version, "kind": kind})
            obj = self._bucket(rtype)[(namespace or "", name)]
            obj["metadata"]["resourceVersion"] = self._next_rv()
            return str(obj["metadata"]["resourceVersion"])

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> None:
        """Delete an object as another client would, garbage-collecting what it owns
        (the ownerReferences of a placeholder to its PredictiveScaler)."""
        with self._lock:
            rtype = self._type_of({"apiVersion": api_version, "kind": kind})
            self._delete(rtype, namespace, name, None, dry_run=False)

    def delete_all_placeholders(self) -> None:
        """Forget every predictive-scaler placeholder Deployment (test reset)."""
        with self._lock:
            bucket = self._bucket(self._type_of({"apiVersion": "apps/v1", "kind": "Deployment"}))
            for key, obj in list(bucket.items()):
                labels = obj["metadata"].get("labels") or {}
                if labels.get("predictive-scaler.io/role") == "placeholder":
                    del bucket[key]

    def add_deployment(
        self,
        namespace: str,
        name: str,
        replicas: int = 1,
        labels: Mapping[str, str] | None = None,
        ready: int | None = None,
    ) -> dict[str, Any]:
        labels = dict(labels or {"app": name})
        return self.put(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "namespace": namespace, "labels": labels},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "containers": [{"name": "server", "image": "vllm/vllm-openai:v0.6"}]
                        },
                    },
                },
                "status": {
                    "replicas": replicas,
                    "readyReplicas": replicas if ready is None else ready,
                },
            }
        )

    def add_pod(
        self,
        namespace: str,
        name: str,
        labels: Mapping[str, str],
        *,
        phase: str = "Running",
        ready: bool = True,
        node: str | None = None,
        gpus: int = 0,
        scheduled: bool = True,
        terminating: bool = False,
    ) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "main", "image": "example/app:1"}
        if gpus:
            container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
        conditions = [{"type": "PodScheduled", "status": "True" if scheduled else "False"}]
        if scheduled:
            conditions.append({"type": "Ready", "status": "True" if ready else "False"})
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "spec": {"containers": [container]},
            "status": {"phase": phase, "conditions": conditions},
        }
        if node and scheduled:
            pod["spec"]["nodeName"] = node
        if terminating:
            pod["metadata"]["deletionTimestamp"] = _now()
        return self.put(pod)

    def add_priority_class(self, name: str, value: int) -> dict[str, Any]:
        return self.put({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                         "metadata": {"name": name}, "value": value, "preemptionPolicy": "Never"})

    def add_gpu_node(
        self,
        name: str,
        gpus: int,
        labels: Mapping[str, str] | None = None,
        *,
        ready: bool = True,
        unschedulable: bool = False,
    ) -> dict[str, Any]:
        node: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {"unschedulable": True} if unschedulable else {},
            "status": {
                "capacity": {"cpu": "32", "nvidia.com/gpu": str(gpus)},
                "allocatable": {"cpu": "31", "nvidia.com/gpu": str(gpus)},
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }
        return self.put(node)

    def add_hpa(
        self,
        namespace: str,
        name: str,
        target_kind: str,
        target_name: str,
        target_api_version: str | None = "apps/v1",
    ) -> dict[str, Any]:
        return self._put_autoscaler("autoscaling/v2", "HorizontalPodAutoscaler", namespace, name,
                                    _target_ref(target_kind, target_name, target_api_version),
                                    minReplicas=1, maxReplicas=10)

    def add_scaled_object(
        self,
        namespace: str,
        name: str,
        target_name: str,
        target_kind: str | None = None,
        target_api_version: str | None = None,
    ) -> dict[str, Any]:
        return self._put_autoscaler("keda.sh/v1alpha1", "ScaledObject", namespace, name,
                                    _target_ref(target_kind, target_name, target_api_version), triggers=[])

    def _put_autoscaler(self, api_version: str, kind: str, namespace: str, name: str,
                        ref: dict[str, str], **spec: Any) -> dict[str, Any]:
        return self.put({"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": namespace},
                         "spec": {"scaleTargetRef": ref, **spec}})

    def add_scaler(
        self, namespace: str, name: str, spec: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        return self.put(
            {
                "apiVersion": PREDICTIVE_SCALER_TYPE.api_version,
                "kind": PREDICTIVE_SCALER_TYPE.kind,
                "metadata": {"name": name, "namespace": namespace},
                "spec": dict(spec or {"mode": "forecast-only"}),
            }
        )

    # ------------------------------------------------------------ faults ---

    def fail_next(
        self,
        path_regex: str,
        status: int,
        times: int = 1,
        *,
        method: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        """The next ``times`` requests whose path matches answer ``status``."""
        with self._lock:
            self._faults.append(
                _Fault(
                    status,
                    times,
                    re.compile(path_regex),
                    method.upper() if method else None,
                    retry_after,
                )
            )

    def fail_every_nth_patch(self, n: int = 2, status: int = 409) -> None:
        """Every n-th PATCH (counting from now) answers ``status``."""
        with self._lock:
            self._patch_count = 0
            self._every_nth_patch = (n, status)

    def throttle(self, status: int = 429, retry_after: float | None = 1.0, times: int = 1) -> None:
        """The next ``times`` requests are throttled, with a Retry-After header."""
        with self._lock:
            self._faults.append(_Fault(status, times, retry_after=retry_after))

    def outage(self, status: int = 503, requests: int = 10) -> None:
        """The next ``requests`` requests fail with ``status``."""
        with self._lock:
            self._faults.append(_Fault(status, requests))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._every_nth_patch = None

    # --------------------------------------------------------------- log ---

    def calls(self) -> list[tuple[str, str]]:
        return [(r.method, r.path) for r in self.requests]

    def writes(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.method in ("POST", "PUT", "PATCH", "DELETE")]

    # ----------------------------------------------------------- serving ---

    #: Longest a watch stream stays open (a real server holds it for timeoutSeconds, ~minutes).
    watch_hold_seconds = 2.0

    def _handle(self, request: Request) -> Response:
        if request.method.upper() == "GET" and request.args.get("watch") in ("true", "1"):
            return self._watch(request.path, request.args.to_dict())
        with self._lock:
            method = request.method.upper()
            path = request.path
            query = request.args.to_dict()
            content_type = request.headers.get("Content-Type")
            raw = request.get_data()
            headers: dict[str, str] = {}
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
                status, payload = 400, status_body(400, "BadRequest", "the body is not JSON")
            else:
                status, payload, headers = self._respond(method, path, query, content_type, body)
            self.requests.append(RecordedRequest(method, path, query, content_type, body, status))
            return Response(
                json.dumps(payload), status=status, headers=headers, content_type="application/json"
            )

    def _watch(self, path: str, query: dict[str, str]) -> Response:
        """A watch stream: objects changed after ``resourceVersion`` as JSON lines, held open briefly.

        Enough for kopf (list, then watch from the list's resourceVersion, re-watch when the
        stream ends); deletions are not streamed.
        """
        parts = [p for p in path.split("/") if p]
        namespace: str | None = None
        if len(parts) >= 2 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            rest, group, version = [], "", ""
        if len(rest) == 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        with self._lock:
            rtype = self._types.get((group, version, rest[0])) if len(rest) == 1 else None
            self.requests.append(RecordedRequest("GET", path, query, None, None, 200 if rtype else 404))
        if rtype is None:
            return Response(json.dumps(_not_served().body()), status=404, content_type="application/json")
        seen = int(query.get("resourceVersion") or 0)
        hold = min(float(query.get("timeoutSeconds") or self.watch_hold_seconds), self.watch_hold_seconds)

        def stream() -> Iterable[bytes]:
            nonlocal seen
            deadline = time.monotonic() + hold
            while True:
                with self._lock:
                    changed = sorted(
                        (copy.deepcopy(obj) for (ns, _), obj in self._bucket(rtype).items()
                         if (namespace is None or ns == namespace)
                         and int(obj["metadata"]["resourceVersion"]) > seen),
                        key=lambda o: int(o["metadata"]["resourceVersion"]))
                for obj in changed:
                    seen = max(seen, int(obj["metadata"]["resourceVersion"]))
                    yield (json.dumps({"type": "MODIFIED", "object": obj}) + "\n").encode()
                if time.monotonic() >= deadline:
                    return
                time.sleep(0.1)

        return Response(stream(), status=200, content_type="application/json", direct_passthrough=True)

    def _respond(
        self, method: str, path: str, query: dict[str, str], content_type: str | None, body: Any
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        fault = self._take_fault(method, path)
        if fault is not None:
            headers = {}
            if fault.retry_after is not None:
                headers["Retry-After"] = f"{fault.retry_after:g}"
            message = {
                409: "Operation cannot be fulfilled: the object has been modified; please "
                "apply your changes to the latest version and try again",
                429: "Too many requests, please try again later.",
            }.get(fault.status, f"injected failure {fault.status}")
            reason = _REASONS.get(fault.status, "InternalError")
            return fault.status, status_body(fault.status, reason, message), headers
        try:
            status, payload = self._route(method, path, query, content_type, body)
        except ApiError as exc:
            return exc.code, exc.body(), {}
        return status, payload, {}

    def _take_fault(self, method: str, path: str) -> _Fault | None:
        if method == "PATCH" and self._every_nth_patch is not None:
            self._patch_count += 1
            n, status = self._every_nth_patch
            if self._patch_count % n == 0:
                return _Fault(status, 1)
        for fault in self._faults:
            if fault.applies(method, path):
                fault.remaining -= 1
                return fault
        self._faults = [f for f in self._faults if f.remaining > 0]
        return None

    def _route(  # noqa: C901
        self, method: str, path: str, query: dict[str, str], content_type: str | None, body: Any
    ) -> tuple[int, dict[str, Any]]:
        parts = [p for p in path.split("/") if p]
        if parts == ["version"] and method == "GET":
            major, minor = KUBERNETES_VERSION.split(".")
            return 200, {"major": major, "minor": minor, "gitVersion": f"v{KUBERNETES_VERSION}.0"}
        if parts == ["api"] and method == "GET":
            return 200, {"kind": "APIVersions", "versions": ["v1"]}
        if parts == ["apis"] and method == "GET":
            return 200, self._group_list()
        if len(parts) == 2 and parts[0] == "apis":
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on discovery")
            return 200, self._group_discovery(parts[1])
        if len(parts) >= 2 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise _not_served()
        if not rest:
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on discovery")
            return 200, self._discovery(group, version)
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise _not_served()
        rtype = self._types.get((group, version, rest[0]))
        if rtype is None:
            raise _not_served()
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if namespace is not None and not rtype.namespaced:
            raise _not_served()
        if rtype.namespaced and namespace is None and name is not None:
            raise _not_served()
        dry_run = query.get("dryRun") == "All"
        if "dryRun" in query and not dry_run:
            raise ApiError(400, "BadRequest", f"invalid dryRun value {query['dryRun']!r}; use All")
        if name is None:
            if method == "GET":
                return 200, self._list(rtype, namespace, query)
            if method == "POST":
                if rtype.namespaced and namespace is None:
                    raise ApiError(405, "MethodNotAllowed", "create needs a namespace in the path")
                return 201, self._create(rtype, namespace, body, dry_run)
            raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on a collection")
        if sub is None:
            handlers: dict[str, Callable[[], dict[str, Any]]] = {
                "GET": lambda: self._existing(rtype, namespace, name),
                "PUT": lambda: self._update(rtype, namespace, name, body, dry_run),
                "PATCH": lambda: self._patch(
                    rtype, namespace, name, content_type, body, dry_run, part="main"
                ),
                "DELETE": lambda: self._delete(rtype, namespace, name, body, dry_run),
            }
        elif sub == "scale" and rtype.scale:
            handlers = {
                "GET": lambda: self._scale_of(rtype, self._existing(rtype, namespace, name)),
                "PATCH": lambda: self._patch(
                    rtype, namespace, name, content_type, body, dry_run, part="scale"
                ),
                "PUT": lambda: self._patch(rtype, namespace, name, _MERGE, body, dry_run, part="scale"),
            }
        elif sub == "status" and rtype.status:
            handlers = {
                "GET": lambda: self._existing(rtype, namespace, name),
                "PATCH": lambda: self._patch(
                    rtype, namespace, name, content_type, body, dry_run, part="status"
                ),
            }
        else:
            raise _not_served()
        if method not in handlers:
            raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed here")
        return 200, handlers[method]()

    # ----------------------------------------------------------- verbs ---

    def _group_list(self) -> dict[str, Any]:
        """``GET /apis``: every served group (kopf's resource observer reads it)."""
        groups: dict[str, list[str]] = {}
        for t in self._types.values():
            if t.group and t.version not in groups.setdefault(t.group, []):
                groups[t.group].append(t.version)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
             "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
            for g, vs in sorted(groups.items())]}
    def _group_discovery(self, group: str) -> dict[str, Any]:
        """``GET /apis/{group}``: the APIGroup with the versions some served type has."""
        versions = sorted({t.version for t in self._types.values() if t.group == group and group})
        if not versions:
            raise _not_served()
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": entries,
                "preferredVersion": entries[0]}

    def _discovery(self, group: str, version: str) -> dict[str, Any]:
        types = [t for t in self._types.values() if t.group == group and t.version == version]
        if not types:
            raise _not_served()
        resources = []
        for t in sorted(types, key=lambda t: t.plural):
            resources.append(
                {
                    "name": t.plural,
                    "singularName": t.kind.lower(),
                    "namespaced": t.namespaced,
                    "kind": t.kind,
                    "verbs": list(t.verbs),
                }
            )
            if t.scale:
                resources.append(
                    {
                        "name": f"{t.plural}/scale",
                        "singularName": "",
                        "namespaced": t.namespaced,
                        "group": "autoscaling",
                        "version": "v1",
                        "kind": "Scale",
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if t.status:
                resources.append(
                    {
                        "name": f"{t.plural}/status",
                        "singularName": "",
                        "namespaced": t.namespaced,
                        "kind": t.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": types[0].api_version,
            "resources": resources,
        }

    def _list(
        self, rtype: ResourceType, namespace: str | None, query: Mapping[str, str]
    ) -> dict[str, Any]:
        labels = _parse_label_selector(query.get("labelSelector", ""))
        fields = _parse_field_selector(rtype, query.get("fieldSelector", ""))
        items = []
        for (ns, _), obj in sorted(self._bucket(rtype).items()):
            if namespace is not None and ns != namespace:
                continue
            if not all(p(obj["metadata"].get("labels") or {}) for p in labels):
                continue
            if not all(p(obj) for p in fields):
                continue
            item = copy.deepcopy(obj)
            if rtype.builtin:  # typed lists omit kind/apiVersion on items; CR lists keep them
                item.pop("kind", None)
                item.pop("apiVersion", None)
            items.append(item)
        return {
            "kind": f"{rtype.kind}List",
            "apiVersion": rtype.api_version,
            "metadata": {"resourceVersion": str(self._resource_version)},
            "items": items,
        }

    def _existing(self, rtype: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        found = self._bucket(rtype).get((namespace or "", name))
        if found is None:
            raise ApiError(
                404,
                "NotFound",
                f'{rtype.plural}.{rtype.group or "core"} "{name}" not found',
                name=name,
                group=rtype.group,
                kind=rtype.plural,
            )
        return found

    def _create(
        self, rtype: ResourceType, namespace: str | None, body: Any, dry_run: bool
    ) -> dict[str, Any]:
        obj = self._check_body(rtype, body)
        metadata = obj.setdefault("metadata", {})
        if not metadata.get("name"):
            if metadata.get("generateName"):
                metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]
            else:
                raise ApiError(
                    422,
                    "Invalid",
                    "metadata.name: Required value: name or generateName is required",
                )
        if rtype.namespaced:
            if metadata.get("namespace", namespace) != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does "
                    "not match the namespace sent on the request",
                )
            metadata["namespace"] = namespace
        key = (namespace or "", metadata["name"])
        if key in self._bucket(rtype):
            raise ApiError(
                409,
                "AlreadyExists",
                f'{rtype.plural}.{rtype.group or "core"} "{metadata["name"]}" already exists',
                name=metadata["name"],
                kind=rtype.plural,
            )
        for field in ("uid", "resourceVersion", "creationTimestamp"):
            if metadata.get(field) and field == "resourceVersion":
                raise ApiError(
                    400, "BadRequest", "resourceVersion should not be set on objects to be created"
                )
        self._validate(rtype, obj)
        self._stamp_new(obj)
        if not dry_run:
            self._bucket(rtype)[key] = obj
        return copy.deepcopy(obj)

    def _update(
        self, rtype: ResourceType, namespace: str | None, name: str, body: Any, dry_run: bool
    ) -> dict[str, Any]:
        current = self._existing(rtype, namespace, name)
        obj = self._check_body(rtype, body)
        metadata = obj.setdefault("metadata", {})
        if metadata.get("name") != name:
            raise ApiError(
                400, "BadRequest", "the name of the object does not match the name on the URL"
            )
        self._check_precondition(current, metadata.get("resourceVersion"), rtype, name)
        metadata["namespace"] = current["metadata"].get("namespace")
        if not rtype.namespaced:
            metadata.pop("namespace", None)
        for field in ("uid", "creationTimestamp"):
            metadata[field] = current["metadata"][field]
        if rtype.status:  # the main resource ignores status; the subresource owns it
            obj.pop("status", None)
            if "status" in current:
                obj["status"] = copy.deepcopy(current["status"])
        self._validate(rtype, obj)
        return self._commit(rtype, current, obj, dry_run)

    def _patch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        content_type: str | None,
        body: Any,
        dry_run: bool,
        part: str,
    ) -> dict[str, Any]:
        current = self._existing(rtype, namespace, name)
        if part == "scale":
            return self._patch_scale(rtype, current, name, content_type, body, dry_run)
        patched = self._apply_patch(rtype, current, content_type, body, name)
        if part == "status":
            result = copy.deepcopy(current)
            if "status" in patched:
                result["status"] = patched["status"]
            else:
                result.pop("status", None)
        else:
            result = patched
            if rtype.status:
                result.pop("status", None)
                if "status" in current:
                    result["status"] = copy.deepcopy(current["status"])
        for field in ("name", "namespace", "uid", "creationTimestamp"):
            if result["metadata"].get(field) != current["metadata"].get(field):
                raise ApiError(
                    422, "Invalid", f"metadata.{field}: Invalid value: field is immutable"
                )
        self._validate(rtype, result)
        return self._commit(rtype, current, result, dry_run)

    def _apply_patch(
        self,
        rtype: ResourceType,
        current: Mapping[str, Any],
        content_type: str | None,
        body: Any,
        name: str,
    ) -> dict[str, Any]:
        media = (content_type or "").split(";")[0].strip()
        if media == _JSON_PATCH:
            if not isinstance(body, list):
                raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
            return _json_patch(current, body)
        if media == _STRATEGIC and not rtype.builtin:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media "
                f"types include: {_JSON_PATCH}, {_MERGE}, application/apply-patch+yaml",
            )
        if media not in (_MERGE, _STRATEGIC):
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format ({media or 'none'})"
                f" - accepted media types include: {_JSON_PATCH}, {_MERGE}, "
                f"{_STRATEGIC}",
            )
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
        wanted_rv = (body.get("metadata") or {}).get("resourceVersion")
        self._check_precondition(current, wanted_rv, rtype, name)
        # Strategic merge is approximated by a merge patch: enough for the
        # scalar and map fields predictive-scaler touches.
        patched = _merge_patch(copy.deepcopy(current), body)
        patched["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return patched

    def _delete(
        self, rtype: ResourceType, namespace: str | None, name: str, body: Any, dry_run: bool
    ) -> dict[str, Any]:
        current = self._existing(rtype, namespace, name)
        options = body if isinstance(body, dict) else {}
        preconditions = options.get("preconditions") or {}
        if preconditions.get("uid") and preconditions["uid"] != current["metadata"]["uid"]:
            raise ApiError(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: "
                f"{preconditions['uid']}, UID in object meta: "
                f"{current['metadata']['uid']}",
            )
        self._check_precondition(current, preconditions.get("resourceVersion"), rtype, name)
        policy = options.get("propagationPolicy", "Background")
        if policy not in ("Background", "Foreground", "Orphan"):
            raise ApiError(400, "BadRequest", f"unknown propagationPolicy {policy!r}")
        if not dry_run:
            del self._bucket(rtype)[(namespace or "", name)]
            if policy != "Orphan":
                self._collect_garbage(current["metadata"]["uid"])
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": name,
                "group": rtype.group,
                "kind": rtype.plural,
                "uid": current["metadata"]["uid"],
            },
        }

    def _patch_scale(
        self, rtype: ResourceType, current: dict[str, Any], name: str, content_type: str | None, body: Any,
        dry_run: bool,
    ) -> dict[str, Any]:
        """A patch of the ``/scale`` subresource (a PUT of it is applied as a merge patch)."""
        scale = self._scale_of(rtype, current)
        media = (content_type or "").split(";")[0].strip()
        if media == _JSON_PATCH:
            if not isinstance(body, list):
                raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
            new_scale = _json_patch(scale, body)
        elif media in (_MERGE, _STRATEGIC):
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
            self._check_precondition(
                current, (body.get("metadata") or {}).get("resourceVersion"), rtype, name
            )
            new_scale = _merge_patch(copy.deepcopy(scale), body)
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format ({media or 'none'})",
            )
        replicas = (new_scale.get("spec") or {}).get("replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ApiError(
                422,
                "Invalid",
                f"spec.replicas: Invalid value: {replicas!r}: must be greater than or equal to 0",
            )
        updated = copy.deepcopy(current)
        updated.setdefault("spec", {})["replicas"] = replicas
        committed = self._commit(rtype, current, updated, dry_run)
        return self._scale_of(rtype, committed)

    # --------------------------------------------------------- internals ---

    def _scale_of(self, rtype: ResourceType, obj: Mapping[str, Any]) -> dict[str, Any]:
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        if rtype.builtin:
            if rtype.kind == "ReplicationController":
                selector = ",".join(
                    f"{k}={v}" for k, v in sorted((spec.get("selector") or {}).items())
                )
            else:
                selector = _selector_string(spec.get("selector") or {})
        else:
            selector = status.get("selector", "")
        meta = obj["metadata"]
        scale_status: dict[str, Any] = {"replicas": int(status.get("replicas") or 0)}
        if selector:
            scale_status["selector"] = selector
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: meta[k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in meta
            },
            "spec": {"replicas": int(spec.get("replicas", 1))},
            "status": scale_status,
        }

    def _check_body(self, rtype: ResourceType, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        if body.get("kind") != rtype.kind or body.get("apiVersion") != rtype.api_version:
            raise ApiError(
                400,
                "BadRequest",
                f"the body is kind {body.get('kind')!r} apiVersion "
                f"{body.get('apiVersion')!r}, expected {rtype.kind} "
                f"{rtype.api_version}",
            )
        return copy.deepcopy(body)

    def _validate(self, rtype: ResourceType, obj: dict[str, Any]) -> None:
        for ref in obj.get("metadata", {}).get("ownerReferences") or []:
            missing = [k for k in ("apiVersion", "kind", "name", "uid") if not ref.get(k)]
            if missing:
                raise ApiError(
                    422,
                    "Invalid",
                    f"metadata.ownerReferences: Required value: {', '.join(missing)}",
                )
        if rtype.kind == "Deployment":
            spec = obj.get("spec") or {}
            selector = (spec.get("selector") or {}).get("matchLabels") or {}
            template_labels = ((spec.get("template") or {}).get("metadata") or {}).get(
                "labels"
            ) or {}
            if not selector or any(template_labels.get(k) != v for k, v in selector.items()):
                raise ApiError(
                    422,
                    "Invalid",
                    "spec.template.metadata.labels: Invalid value: "
                    "`selector` does not match template `labels`",
                )
        if rtype.kind == "Event":
            involved = obj.get("involvedObject") or {}
            if involved.get("namespace") != obj["metadata"].get("namespace"):
                raise ApiError(
                    422,
                    "Invalid",
                    "involvedObject.namespace: Invalid value: does not match event.namespace",
                )
            if obj.get("type") not in ("Normal", "Warning"):
                raise ApiError(422, "Invalid", "type: Invalid value: must be Normal or Warning")
        if rtype.builtin:
            try:
                kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise ApiError(
                    422,
                    "Invalid",
                    f"{rtype.kind} is invalid: {exc.message} at "
                    f"{'.'.join(str(p) for p in exc.path)}",
                ) from exc

    def _check_precondition(
        self, current: Mapping[str, Any], wanted: Any, rtype: ResourceType, name: str
    ) -> None:
        if wanted is not None and str(wanted) != str(current["metadata"]["resourceVersion"]):
            raise ApiError(
                409,
                "Conflict",
                f"Operation cannot be fulfilled on {rtype.plural}.{rtype.group or 'core'} "
                f'"{name}": the object has been modified; please apply your changes to the '
                "latest version and try again",
                name=name,
                kind=rtype.plural,
            )

    def _commit(
        self, rtype: ResourceType, current: Mapping[str, Any], new: dict[str, Any], dry_run: bool
    ) -> dict[str, Any]:
        if new.get("spec") != current.get("spec") and "generation" in current["metadata"]:
            new["metadata"]["generation"] = int(current["metadata"]["generation"]) + 1
        if not dry_run:
            new["metadata"]["resourceVersion"] = self._next_rv()
            meta = new["metadata"]
            self._bucket(rtype)[(meta.get("namespace", ""), meta["name"])] = new
        return copy.deepcopy(new)

    def _collect_garbage(self, owner_uid: str) -> None:
        for bucket in self._objects.values():
            for key, obj in list(bucket.items()):
                owners = obj["metadata"].get("ownerReferences") or []
                if any(o.get("uid") == owner_uid for o in owners):
                    del bucket[key]
                    self._collect_garbage(obj["metadata"]["uid"])

    def _stamp_new(self, obj: dict[str, Any]) -> None:
        metadata = obj["metadata"]
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("creationTimestamp", _now())
        metadata["resourceVersion"] = self._next_rv()
        if obj.get("kind") not in ("Event", "Pod", "Node"):
            metadata.setdefault("generation", 1)

    def _next_rv(self) -> str:
        self._resource_version += 1
        return str(self._resource_version)

    def _type_of(self, obj: Mapping[str, Any]) -> ResourceType:
        for rtype in self._types.values():
            if rtype.api_version == obj.get("apiVersion") and rtype.kind == obj.get("kind"):
                return rtype
        raise KeyError(
            f"the fake API server does not serve {obj.get('apiVersion')} "
            f"{obj.get('kind')}; register_type() it first"
        )

    def _bucket(self, rtype: ResourceType) -> dict[tuple[str, str], dict[str, Any]]:
        return self._objects.setdefault((rtype.group, rtype.plural), {})


# ------------------------------------------------------------- helpers ---


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _not_served() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = _merge_patch(target.get(key), value)
    return target


def _json_patch(document: Mapping[str, Any], operations: Iterable[Any]) -> dict[str, Any]:
    """RFC 6902 subset: add, replace, remove, test."""
    result = copy.deepcopy(dict(document))
    for op in operations:
        if not isinstance(op, dict) or "path" not in op or "op" not in op:
            raise ApiError(400, "BadRequest", f"malformed JSON patch operation {op!r}")
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
        if not tokens:
            raise ApiError(422, "Invalid", "a JSON patch may not replace the whole object")
        parent: Any = result
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent.get(token)
            if parent is None:
                raise ApiError(422, "Invalid", f"JSON patch path {op['path']} does not exist")
        last = tokens[-1]
        kind = op["op"]
        if kind == "test":
            value = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if value != op.get("value"):
                raise ApiError(422, "Invalid", f"JSON patch test failed at {op['path']}")
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if kind == "add":
                    parent.insert(index, op.get("value"))
                else:
                    parent[index] = op.get("value")
            else:
                if kind == "replace" and last not in parent:
                    raise ApiError(422, "Invalid", f"JSON patch replace of missing {op['path']}")
                parent[last] = op.get("value")
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            elif last in parent:
                del parent[last]
            else:
                raise ApiError(422, "Invalid", f"JSON patch remove of missing {op['path']}")
        else:
            raise ApiError(400, "BadRequest", f"unsupported JSON patch op {kind!r}")
    return result


def _selector_string(selector: Mapping[str, Any]) -> str:
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        op = expr.get("operator")
        values = ",".join(sorted(expr.get("values") or []))
        if op == "In":
            terms.append(f"{expr['key']} in ({values})")
        elif op == "NotIn":
            terms.append(f"{expr['key']} notin ({values})")
        elif op == "Exists":
            terms.append(expr["key"])
        elif op == "DoesNotExist":
            terms.append(f"!{expr['key']}")
    return ",".join(terms)


_SET_TERM = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_TERM = re.compile(r"^\s*([^\s!=]+)\s*(==|=|!=)\s*([^\s]*)\s*$")
_KEY = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*$")


def _split_terms(selector: str) -> list[str]:
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(selector):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            terms.append(selector[start:i])
            start = i + 1
    terms.append(selector[start:])
    return [t for t in terms if t.strip()]


def _parse_label_selector(selector: str) -> list[Callable[[Mapping[str, str]], bool]]:
    predicates: list[Callable[[Mapping[str, str]], bool]] = []
    for term in _split_terms(selector):
        if m := _SET_TERM.match(term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if op == "in":
                predicates.append(lambda lab, k=key, vs=values: lab.get(k) in vs)
            else:
                predicates.append(lambda lab, k=key, vs=values: lab.get(k) not in vs)
        elif m := _EQ_TERM.match(term):
            key, op, value = m.groups()
            if op == "!=":
                predicates.append(lambda lab, k=key, v=value: lab.get(k) != v)
            else:
                predicates.append(lambda lab, k=key, v=value: lab.get(k) == v)
        elif m := _KEY.match(term):
            negate, key = m.group(1) == "!", m.group(2)
            predicates.append(lambda lab, k=key, n=negate: (k in lab) != n)
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")
    return predicates


_FIELDS = {
    "Pod": ("metadata.name", "metadata.namespace", "spec.nodeName", "status.phase"),
    "Event": (
        "metadata.name",
        "metadata.namespace",
        "involvedObject.name",
        "involvedObject.kind",
        "involvedObject.uid",
        "reason",
        "type",
    ),
}


def _parse_field_selector(
    rtype: ResourceType, selector: str
) -> list[Callable[[Mapping[str, Any]], bool]]:
    supported = _FIELDS.get(rtype.kind, ("metadata.name", "metadata.namespace"))
    predicates: list[Callable[[Mapping[str, Any]], bool]] = []
    for term in _split_terms(selector):
        m = _EQ_TERM.match(term)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid field selector term {term!r}")
        path, op, value = m.groups()
        if path not in supported:
            raise ApiError(400, "BadRequest", f"field label not supported: {path}")

        def lookup(obj: Mapping[str, Any], p: str = path) -> str:
            node: Any = obj
            for part in p.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            return "" if node is None else str(node)

        if op == "!=":
            predicates.append(lambda obj, f=lookup, v=value: f(obj) != v)
        else:
            predicates.append(lambda obj, f=lookup, v=value: f(obj) == v)
    return predicates


def _target_ref(kind: str | None, name: str, api_version: str | None) -> dict[str, str]:
    """A scaleTargetRef; an omitted kind or apiVersion is left out (KEDA and the HPA default them)."""
    return {key: value for key, value in (("kind", kind), ("name", name), ("apiVersion", api_version)) if value}

"""Every request the Kubernetes adapter can make — ``API_CALLS`` — as an exact, reviewable list.

The RBAC rules (deploy/base/rbac-controller.yaml) and docs/kube-api-calls.md are derived from it;
the adapter's tests check that every request it makes matches one of these rows
(``api_call_for``). Regenerate the document with
``python -m predictive_scaler.kube.api_calls > docs/kube-api-calls.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from predictive_scaler.kube import manifests
from predictive_scaler.kube.scalers import CR_PREFIX


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
        "/api/v1/namespaces/{name}",
        "get",
        "",
        "namespaces",
        "FinOps: the scaler's namespace label named by --team-label, the metrics' team (only with that "
        "setting; cached 10 minutes per namespace)",
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
        "PATCH",
        "/api/v1/namespaces/{namespace}/events/{name}",
        "patch",
        "",
        "events",
        "record a repeat of an Event within the dedup window (its count and lastTimestamp)",
    ),
    ApiCall(
        "GET",
        CR_PREFIX + "/namespaces/{namespace}/" + manifests.PLURAL + "/{name}",
        "get",
        manifests.GROUP,
        manifests.PLURAL,
        "read one PredictiveScaler",
    ),
    ApiCall(
        "GET",
        CR_PREFIX + "/namespaces/{namespace}/" + manifests.PLURAL,
        "list",
        manifests.GROUP,
        manifests.PLURAL,
        "list the PredictiveScalers of a namespace",
    ),
    ApiCall(
        "GET",
        CR_PREFIX + "/" + manifests.PLURAL,
        "list",
        manifests.GROUP,
        manifests.PLURAL,
        "list PredictiveScalers in all namespaces",
    ),
    ApiCall(
        "PATCH",
        CR_PREFIX + "/namespaces/{namespace}/" + manifests.PLURAL + "/{name}/status",
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
        "Generated from `predictive_scaler.kube.api_calls.API_CALLS` — do not edit by hand;",
        "regenerate with `python -m predictive_scaler.kube.api_calls > docs/kube-api-calls.md`.",
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


if __name__ == "__main__":
    print(api_calls_markdown(), end="")

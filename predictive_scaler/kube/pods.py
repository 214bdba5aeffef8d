"""Pods and nodes: counting a target's pods and the GPUs free on ready, schedulable GPU nodes.

The classification is pure (``count_pods``, ``pod_gpu_request``, ``node_gpus``) and shared with the
cluster cache (:mod:`predictive_scaler.kube.cache`), which counts from its watched copies instead
of listing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Unpack

from kubernetes.client import ApiClient
from kubernetes.utils import parse_quantity

from predictive_scaler.errors import ClusterError, DataError
from predictive_scaler.kube import manifests
from predictive_scaler.kube.transport import Transport, TransportOptions, path_segment

#: Pods that hold resources: neither Succeeded nor Failed (a field selector, server-side).
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


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


class PodCalls(Transport):
    """List a target's pods and the cluster's GPU nodes (with the pods placed on them).

    ``gpu_resource`` is the extended resource counted as GPUs on nodes and pods; the other options
    are the transport's.
    """

    def __init__(self, api_client: ApiClient, *, gpu_resource: str = manifests.GPU_RESOURCE,
                 **transport: Unpack[TransportOptions]) -> None:
        super().__init__(api_client, **transport)
        self._gpu_resource = gpu_resource

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
            f"/api/v1/namespaces/{path_segment(namespace)}/pods", {"labelSelector": selector}, what=what
        )
        return count_pods(items)

    def list_gpu_nodes(self, selector: str | None = None) -> NodeCapacity:
        """Allocatable, requested and free GPUs over ready, schedulable GPU nodes."""
        what = "list GPU nodes"
        query = {"labelSelector": selector} if selector else None
        nodes, _ = self.list_paginated("/api/v1/nodes", query, what=what)
        allocatable = {}
        for node in nodes:
            gpus = quantity_int(
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
        return quantity_int(value)

    inits = spec.get("initContainers") or []
    sidecars = sum(request(c) for c in inits if c.get("restartPolicy") == "Always")
    plain_inits = [request(c) for c in inits if c.get("restartPolicy") != "Always"]
    main = sum(request(c) for c in spec.get("containers") or []) + sidecars
    return max([main, *plain_inits])


def quantity_int(value: Any) -> int:
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


def node_gpus(node: Mapping[str, Any], resource: str = manifests.GPU_RESOURCE) -> int:
    """Allocatable GPUs of a ready, schedulable node (0 otherwise)."""
    gpus = quantity_int(((node.get("status") or {}).get("allocatable") or {}).get(resource))
    return gpus if gpus > 0 and _node_usable(node) else 0


def _node_usable(node: Mapping[str, Any]) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False

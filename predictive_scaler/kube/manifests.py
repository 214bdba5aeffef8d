"""Pure builders for the Kubernetes objects predictive-scaler writes.

Every function takes plain values and returns a dict in the real API shape
(what ``kubectl get -o json`` shows), so the same objects are used by the
adapter, the install manifests and the tests. Nothing here does I/O or
imports ``kubernetes``.

Events are core/v1 ``Event`` objects rather than ``events.k8s.io/v1``: kopf
itself records its handler events through core/v1, so one RBAC rule
(``""/events create``) covers both, ``kubectl describe`` shows them the same
way (both APIs are views of one storage), and core/v1 does not demand the
``action``/``reportingInstance`` pair the newer API validates strictly.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from predictive_scaler.errors import ConfigError, DataError

# The custom resource: its group, version and names, defined once.
GROUP = "autoscaling.predictive-scaler.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PredictiveScaler"
PLURAL = "predictivescalers"
SHORT_NAME = "pscaler"

COMPONENT = "predictive-scaler"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
SCALER_LABEL = "predictive-scaler.io/scaler"
ROLE_LABEL = "predictive-scaler.io/role"
PLACEHOLDER_ROLE = "placeholder"
TEMPLATE_HASH_ANNOTATION = "predictive-scaler.io/template-hash"

GPU_RESOURCE = "nvidia.com/gpu"
PLACEHOLDER_IMAGE = "registry.k8s.io/pause:3.10"
PLACEHOLDER_PRIORITY_CLASS = "predictive-scaler-placeholder"
# -10 is exactly Cluster Autoscaler's default --expendable-pods-priority-cutoff:
# pods *below* the cutoff are ignored for scale-up, so anything lower would
# silently stop prewarming on clusters that use Cluster Autoscaler.
PLACEHOLDER_PRIORITY_VALUE = -10
PLACEHOLDER_SUFFIX = "-prewarm"
# The uid/gid the pause image runs as; set explicitly so that an inference
# image built to run as root still satisfies runAsNonRoot.
PLACEHOLDER_UID = 65535
# Karpenter labels each node it launches with the NodePool that launched it, and does not
# voluntarily disrupt (consolidate, drift-replace) a node running a pod annotated do-not-disrupt.
KARPENTER_NODEPOOL_LABEL = "karpenter.sh/nodepool"
KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
_AFFINITY_KEYS = ("requiredDuringSchedulingIgnoredDuringExecution", "preferredDuringSchedulingIgnoredDuringExecution")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_REASON = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_EVENT_MESSAGE_LIMIT = 1024  # events.k8s.io caps the note at 1 kB; keep both APIs happy


def placeholder_name(scaler_name: str) -> str:
    """Name of the placeholder Deployment of a scaler."""
    return f"{scaler_name}{PLACEHOLDER_SUFFIX}"


def placeholder_labels(scaler_name: str) -> dict[str, str]:
    """Labels on the placeholder Deployment and its pods (also its selector)."""
    return {
        MANAGED_BY_LABEL: COMPONENT,
        SCALER_LABEL: scaler_name,
        ROLE_LABEL: PLACEHOLDER_ROLE,
    }


def owner_reference(scaler_name: str, owner_uid: str) -> dict[str, Any]:
    """ownerReference to a PredictiveScaler: garbage collection removes what it owns."""
    _check_dns_subdomain(scaler_name, "metadata.name")
    if not owner_uid:
        raise ConfigError(
            "owner uid is empty: pass the PredictiveScaler's metadata.uid so deleting "
            "the scaler garbage-collects its placeholder",
            field="metadata.uid",
        )
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": scaler_name,
        "uid": owner_uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def placeholder_deployment(
    scaler_name: str,
    namespace: str,
    owner_uid: str,
    replicas: int,
    gpus_per_pod: int,
    priority_class: str = PLACEHOLDER_PRIORITY_CLASS,
    image: str = PLACEHOLDER_IMAGE,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] | None = None,
    *,
    gpu_resource: str = GPU_RESOURCE,
    affinity: Mapping[str, Any] | None = None,
    node_pool: str | None = None,
    do_not_disrupt: bool = False,
) -> dict[str, Any]:
    """apps/v1 Deployment of placeholder ("balloon") pods that hold GPUs.

    ``affinity`` is a core/v1 NodeAffinity (camelCase dict); ``node_pool`` adds the requirement
    ``karpenter.sh/nodepool In [node_pool]`` to it (see :func:`placeholder_node_affinity`);
    ``do_not_disrupt`` annotates the pods ``karpenter.sh/do-not-disrupt: "true"``.

    Each pod requests ``gpus_per_pod`` GPUs under a negative-priority class, so
    a node autoscaler adds nodes for them and any real pod preempts them.
    ``image`` may be the inference image to pull it ahead; then the container
    just sleeps. The pod template's hash is stored as an annotation so the
    adapter can tell drift without comparing server-defaulted fields.
    """
    _check_dns_label(namespace, "metadata.namespace")
    if len(scaler_name) > 63:
        raise ConfigError(
            f"scaler name {scaler_name!r} is longer than 63 characters, so it cannot be a "
            "label value; use a shorter PredictiveScaler name",
            field="metadata.name",
        )
    name = placeholder_name(scaler_name)
    _check_dns_label(name, "metadata.name")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ConfigError(
            f"placeholder replicas must be a non-negative integer, got {replicas!r}",
            field="spec.prewarm",
        )
    if isinstance(gpus_per_pod, bool) or not isinstance(gpus_per_pod, int) or gpus_per_pod < 1:
        raise ConfigError(
            f"GPUs per placeholder pod must be a positive integer, got {gpus_per_pod!r}; "
            "set spec.prewarm.gpusPerNode",
            field="spec.prewarm.gpusPerNode",
        )
    _check_dns_subdomain(priority_class, "spec.prewarm.priorityClassName")
    if not image or any(ch.isspace() for ch in image):
        raise ConfigError(
            f"placeholder image {image!r} is not an image reference; leave it empty for "
            f"{PLACEHOLDER_IMAGE}",
            field="spec.prewarm.image",
        )
    labels = placeholder_labels(scaler_name)
    template = _placeholder_pod_template(
        labels, gpus_per_pod, priority_class, image, node_selector, tolerations, gpu_resource
    )
    node_affinity = placeholder_node_affinity(affinity, node_pool)
    if node_affinity:
        template["spec"]["affinity"] = {"nodeAffinity": node_affinity}
    if not isinstance(do_not_disrupt, bool):
        raise ConfigError(
            f"doNotDisrupt must be true or false, got {do_not_disrupt!r}",
            field="spec.prewarm.doNotDisrupt",
        )
    if do_not_disrupt:
        template["metadata"]["annotations"] = {KARPENTER_DO_NOT_DISRUPT: "true"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels),
            "annotations": {TEMPLATE_HASH_ANNOTATION: template_hash(template)},
            "ownerReferences": [owner_reference(scaler_name, owner_uid)],
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(labels)},
            # Recreate, not RollingUpdate: a surge would hold more GPUs than the
            # prewarm budget allows while a template change rolls out.
            "strategy": {"type": "Recreate"},
            "revisionHistoryLimit": 1,
            "template": template,
        },
    }


def _placeholder_pod_template(
    labels: Mapping[str, str],
    gpus_per_pod: int,
    priority_class: str,
    image: str,
    node_selector: Mapping[str, str] | None,
    tolerations: Sequence[Mapping[str, Any]] | None,
    gpu_resource: str,
) -> dict[str, Any]:
    gpus = str(gpus_per_pod)
    container: dict[str, Any] = {
        "name": "placeholder",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        # Extended resources must have request == limit. Tiny cpu/memory so the
        # placeholder never competes for anything but the GPU.
        "resources": {
            "requests": {gpu_resource: gpus, "cpu": "1m", "memory": "8Mi"},
            "limits": {gpu_resource: gpus, "memory": "32Mi"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if image != PLACEHOLDER_IMAGE:
        # An inference image would start its server; only its layers are wanted.
        container["command"] = ["sleep", "infinity"]
    spec: dict[str, Any] = {
        "priorityClassName": priority_class,
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": PLACEHOLDER_UID,
            "runAsGroup": PLACEHOLDER_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
    }
    if node_selector:
        spec["nodeSelector"] = {str(k): str(v) for k, v in node_selector.items()}
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    return {"metadata": {"labels": dict(labels)}, "spec": spec}


def placeholder_node_affinity(
    affinity: Mapping[str, Any] | None, node_pool: str | None = None
) -> dict[str, Any] | None:
    """The placeholder pods' core/v1 NodeAffinity: ``affinity`` (checked for its shape) with
    ``karpenter.sh/nodepool In [node_pool]`` ANDed into every required term (terms are ORed, so
    the NodePool must be in each), or as the only required term when there is none. None: no
    affinity at all. Empty lists are left out, so equal affinities hash equal."""
    field = "spec.prewarm.affinity"
    if affinity is None:
        affinity = {}
    if not isinstance(affinity, Mapping):
        raise ConfigError(f"{field} must be a NodeAffinity object, got {type(affinity).__name__}", field=field)
    unknown = sorted(set(affinity) - set(_AFFINITY_KEYS))
    if unknown:
        raise ConfigError(
            f"{field}.{unknown[0]} is not a field of a NodeAffinity; use {' or '.join(_AFFINITY_KEYS)}",
            field=f"{field}.{unknown[0]}",
        )
    out: dict[str, Any] = {}
    required = affinity.get(_AFFINITY_KEYS[0])
    terms: list[dict[str, Any]] | None = None
    if required is not None:
        where = f"{field}.{_AFFINITY_KEYS[0]}.nodeSelectorTerms"
        raw = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
        if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
            raise ConfigError(
                f"{where} must be a non-empty list of terms (a node must match one of them)", field=where
            )
        terms = [_node_selector_term(term, f"{where}[{i}]") for i, term in enumerate(raw)]
    if node_pool is not None:
        _check_node_pool(node_pool)
        requirement = {"key": KARPENTER_NODEPOOL_LABEL, "operator": "In", "values": [node_pool]}
        if terms is None:
            terms = [{"matchExpressions": [requirement]}]
        else:
            for i, term in enumerate(terms):
                if any(e.get("key") == KARPENTER_NODEPOOL_LABEL for e in term["matchExpressions"]):
                    raise ConfigError(
                        f"spec.prewarm.nodePool is set and {field} term {i} also requires "
                        f"{KARPENTER_NODEPOOL_LABEL}; give the NodePool in one place",
                        field="spec.prewarm.nodePool",
                    )
                term["matchExpressions"].append(dict(requirement))
    if terms is not None:
        out[_AFFINITY_KEYS[0]] = {"nodeSelectorTerms": terms}
    preferred = affinity.get(_AFFINITY_KEYS[1]) or []
    where = f"{field}.{_AFFINITY_KEYS[1]}"
    if not isinstance(preferred, Sequence) or isinstance(preferred, str):
        raise ConfigError(f"{where} must be a list of weighted terms", field=where)
    weighted = []
    for i, item in enumerate(preferred):
        weight = item.get("weight") if isinstance(item, Mapping) else None
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 100:
            raise ConfigError(f"{where}[{i}].weight must be a whole number from 1 to 100, got {weight!r}",
                              field=f"{where}[{i}].weight")
        assert isinstance(item, Mapping)
        weighted.append({"weight": weight,
                         "preference": _node_selector_term(item.get("preference"), f"{where}[{i}].preference")})
    if weighted:
        out[_AFFINITY_KEYS[1]] = weighted
    return out or None


def _node_selector_term(term: Any, where: str) -> dict[str, Any]:
    """A copy of one NodeSelectorTerm, its expressions checked for shape (the spec checks the rest)."""
    expressions = term.get("matchExpressions") if isinstance(term, Mapping) else None
    if not isinstance(expressions, Sequence) or isinstance(expressions, str) or not expressions:
        raise ConfigError(
            f"{where}.matchExpressions must be a non-empty list (a term without expressions matches "
            "no node); matchFields is not supported",
            field=f"{where}.matchExpressions",
        )
    out = []
    for j, expression in enumerate(expressions):
        if not (isinstance(expression, Mapping) and isinstance(expression.get("key"), str)
                and isinstance(expression.get("operator"), str)):
            raise ConfigError(
                f"{where}.matchExpressions[{j}] must be an object with a key, an operator and values",
                field=f"{where}.matchExpressions[{j}]",
            )
        copy: dict[str, Any] = {"key": expression["key"], "operator": expression["operator"]}
        if expression.get("values"):
            copy["values"] = [str(v) for v in expression["values"]]
        out.append(copy)
    return {"matchExpressions": out}


def _check_node_pool(node_pool: str) -> None:
    if not isinstance(node_pool, str) or len(node_pool) > 63 or not _DNS_SUBDOMAIN.match(node_pool):
        raise ConfigError(
            f"{node_pool!r} is not a NodePool name: use at most 63 lower-case letters, digits, '-' "
            "and '.', starting and ending with a letter or digit",
            field="spec.prewarm.nodePool",
        )


def template_hash(template: Mapping[str, Any]) -> str:
    """Stable short hash of a pod template (canonical JSON)."""
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def placeholder_priority_class(
    name: str = PLACEHOLDER_PRIORITY_CLASS, value: int = PLACEHOLDER_PRIORITY_VALUE
) -> dict[str, Any]:
    """scheduling.k8s.io/v1 PriorityClass for placeholder pods.

    Negative so every ordinary pod preempts a placeholder; ``preemptionPolicy:
    Never`` so a placeholder never evicts anything itself.
    """
    _check_dns_subdomain(name, "metadata.name")
    if isinstance(value, bool) or not isinstance(value, int) or value >= 0:
        raise ConfigError(
            f"placeholder priority must be a negative integer, got {value!r}; real pods "
            "(priority 0) must be able to preempt placeholders",
            field="spec.prewarm.priorityValue",
        )
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: COMPONENT}},
        "value": value,
        "preemptionPolicy": "Never",
        "globalDefault": False,
        "description": (
            "predictive-scaler placeholder pods that prewarm GPU nodes; any real "
            "workload preempts them."
        ),
    }


def scale_patch(replicas: int, resource_version: str | None = None) -> dict[str, Any]:
    """JSON merge patch for a ``/scale`` subresource.

    With ``resource_version`` the API server applies it only if the object is
    unchanged since it was read (a conflict otherwise).
    """
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ConfigError(
            f"replicas must be a non-negative integer, got {replicas!r}", field="replicas"
        )
    patch: dict[str, Any] = {"spec": {"replicas": replicas}}
    if resource_version is not None:
        patch["metadata"] = {"resourceVersion": resource_version}
    return patch


def status_patch(status: Mapping[str, Any]) -> dict[str, Any]:
    """JSON merge patch for the ``/status`` subresource of a PredictiveScaler.

    JSON has no NaN or infinity and the API server rejects them with a bare
    Bad Request, so they are refused here with the path of the offending field.
    """
    if not isinstance(status, Mapping):
        raise DataError(f"status must be a mapping, got {type(status).__name__}")
    _check_json_value(status, "status")
    return {"status": dict(status)}


def _check_json_value(value: Any, path: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise DataError(
            f"{path} is {value}, which JSON cannot carry; report it as null or leave it out"
        )
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise DataError(f"{path} has a non-string key {key!r}; JSON keys are strings")
            _check_json_value(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_json_value(item, f"{path}[{index}]")
    elif not isinstance(value, str | int | float | bool | type(None)):
        raise DataError(
            f"{path} is a {type(value).__name__}, not a JSON value; convert it (datetimes "
            "to RFC 3339 strings) before writing the status"
        )


def event(
    involved_object: Mapping[str, Any],
    reason: str,
    message: str,
    type: str,
    now: datetime,
    component: str = COMPONENT,
    *,
    instance: str | None = None,
) -> dict[str, Any]:
    """A core/v1 Event about ``involved_object`` (an ObjectReference: apiVersion,
    kind, name, namespace and, ideally, uid).

    The name is ``<object>.<unix-nanoseconds hex>`` as client-go's recorder
    makes it, so it is unique per call time and the function stays pure.
    """
    if type not in ("Normal", "Warning"):
        raise ConfigError(f"event type must be Normal or Warning, got {type!r}", field="type")
    if not _REASON.match(reason) or len(reason) > 128:
        raise ConfigError(
            f"event reason {reason!r} must be UpperCamelCase (e.g. ScaledUp), at most 128 "
            "characters",
            field="reason",
        )
    for key in ("apiVersion", "kind", "name", "namespace"):
        if not involved_object.get(key):
            raise ConfigError(
                f"involved object has no {key}; pass an ObjectReference of the PredictiveScaler",
                field=f"involvedObject.{key}",
            )
    if now.tzinfo is None:
        raise ConfigError("event time must be timezone-aware (UTC)", field="now")
    namespace = str(involved_object["namespace"])
    when = now.astimezone(UTC)
    nanos = int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000
    stamp = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    if len(message) > _EVENT_MESSAGE_LIMIT:
        message = message[: _EVENT_MESSAGE_LIMIT - 3] + "..."
    reference = {
        key: involved_object[key]
        for key in ("apiVersion", "kind", "name", "namespace", "uid", "resourceVersion")
        if involved_object.get(key)
    }
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{involved_object['name']}.{nanos:x}",
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: COMPONENT},
        },
        "involvedObject": reference,
        "reason": reason,
        "message": message,
        "type": type,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance or component,
    }
    return body


def event_repeat(count: int, now: datetime) -> dict[str, Any]:
    """The merge patch that records a repeat of an Event already posted: its ``count`` and
    ``lastTimestamp``, as client-go's recorder patches an Event it has seen within its window."""
    if count < 2:
        raise ConfigError(f"a repeated event has a count of at least 2, got {count}", field="count")
    if now.tzinfo is None:
        raise ConfigError("event time must be timezone-aware (UTC)", field="now")
    return {"count": count, "lastTimestamp": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}


def _check_dns_label(value: str, field: str) -> None:
    _check_name(value, field, _DNS_LABEL, 63,
                "use at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit")


def _check_dns_subdomain(value: str, field: str) -> None:
    _check_name(value, field, _DNS_SUBDOMAIN, 253,
                "use lower-case letters, digits, '-' and '.', at most 253 characters")


def _check_name(value: str, field: str, pattern: re.Pattern[str], longest: int, rule: str) -> None:
    if not isinstance(value, str) or len(value) > longest or not pattern.match(value):
        raise ConfigError(f"{value!r} is not a valid name: {rule}", field=field)

"""The placeholder Deployment ``<scaler>-prewarm``: negative-priority pods that hold GPU nodes warm
(any real pod preempts them), and the PriorityClass check that keeps them preemptible."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from predictive_scaler.errors import (
    ClusterError,
    ConfigError,
    ForbiddenError,
    NotFoundError,
    UnauthorizedError,
)
from predictive_scaler.kube import manifests
from predictive_scaler.kube.pods import pod_gpu_request
from predictive_scaler.kube.transport import MERGE_PATCH, Transport, path_segment

#: Seconds a PriorityClass value is trusted before it is read again (it rarely changes).
PRIORITY_CLASS_TTL = 300.0


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
    #: core/v1 NodeAffinity (camelCase), ``karpenter.sh/nodepool In [node_pool]`` added to it.
    affinity: Mapping[str, Any] | None = None
    node_pool: str | None = None
    do_not_disrupt: bool = False

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
            affinity=self.affinity,
            node_pool=self.node_pool,
            do_not_disrupt=self.do_not_disrupt,
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


class PlaceholderCalls(Transport):
    """Read, create, resize, re-template and delete a scaler's placeholder."""

    @functools.cached_property
    def _priorities(self) -> dict[str, tuple[int | None, float]]:
        """PriorityClass name → (value, when it was read)."""
        return {}

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
                path = f"/apis/scheduling.k8s.io/v1/priorityclasses/{path_segment(name)}"
                found = self._request("GET", path, what=what)
            except NotFoundError:
                return None
            except UnauthorizedError:
                raise  # the credentials, not a missing grant: no spec change would help
            except ForbiddenError as exc:
                raise ConfigError(
                    f"cannot read PriorityClass {name!r} (403 Forbidden): the controller checks that "
                    "placeholder pods run at a negative priority; grant it get on priorityclasses "
                    "(deploy/base/rbac-controller.yaml)",
                    field="spec.prewarm.priorityClassName",
                ) from exc
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
        except NotFoundError:
            return None
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
        with the read resourceVersion; missing → create. Re-reads on a conflict.
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
                    f"/apis/apps/v1/namespaces/{path_segment(spec.namespace)}/deployments",
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
                content_type=MERGE_PATCH,
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
            except NotFoundError:
                return False
            return True

        return self._retrying(attempt, what, retry_conflicts=True)


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


def _deployment_path(namespace: str, name: str) -> str:
    return f"/apis/apps/v1/namespaces/{path_segment(namespace)}/deployments/{path_segment(name)}"

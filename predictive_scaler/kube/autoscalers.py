"""Other autoscalers on the same target: HorizontalPodAutoscalers and KEDA ScaledObjects.

predictive-scaler refuses to act on a workload another autoscaler scales (except the KEDA
external scaler it serves itself, :mod:`predictive_scaler.keda`). The matching is pure and shared
with the cluster cache; the ScaledObject list answering Not Found means KEDA is not installed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from predictive_scaler.errors import MissingApiError, NotFoundError
from predictive_scaler.kube.discovery import Discovery
from predictive_scaler.kube.transport import path_segment
from predictive_scaler.kube.workloads import WorkloadRef

#: KEDA ScaledObject trigger types that call an external scaler (mode keda serves them).
EXTERNAL_TRIGGERS = ("external", "external-push")


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


class AutoscalerCalls(Discovery):
    """List the HPAs and ScaledObjects that target a workload."""

    def list_conflicting_autoscalers(
        self, target: WorkloadRef
    ) -> tuple[ConflictingAutoscaler, ...]:
        """HPAs and KEDA ScaledObjects in the target's namespace that scale it too."""
        namespace = path_segment(target.namespace)
        what = f"list HPAs in {target.namespace}"

        def list_hpas(version: str) -> list[dict[str, Any]]:
            return self.list_paginated(
                f"/apis/autoscaling/{version}/namespaces/{namespace}/horizontalpodautoscalers", what=what
            )[0]

        try:
            answer = list_hpas(self.hpa_version())
        except MissingApiError:
            raise
        except NotFoundError:
            # The server changed (an upgrade dropped the version we found): discover again.
            answer = list_hpas(self.hpa_version(refresh=True))
        found = list(hpa_conflicts(answer, target))
        what = f"list KEDA ScaledObjects in {target.namespace}"
        try:
            scaled_objects, _ = self.list_paginated(
                f"/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects", what=what
            )
        except NotFoundError:
            scaled_objects = []  # the CRD is not installed: KEDA is absent
        found.extend(scaled_object_conflicts(scaled_objects, target))
        return tuple(found)


def hpa_conflicts(
    hpas: Iterable[Mapping[str, Any]], target: WorkloadRef
) -> Iterable[ConflictingAutoscaler]:
    """The HPAs (of the target's namespace) whose scaleTargetRef is ``target``."""
    for name, hpa in _scaling(hpas, target, None):
        yield ConflictingAutoscaler("HorizontalPodAutoscaler", name, target.namespace,
                                    owner_scaled_object=_owner(hpa, "ScaledObject"))


def scaled_object_conflicts(
    scaled_objects: Iterable[Mapping[str, Any]], target: WorkloadRef
) -> Iterable[ConflictingAutoscaler]:
    """The KEDA ScaledObjects (of the target's namespace) whose scaleTargetRef is ``target``."""
    # KEDA defaults an omitted kind/apiVersion to an apps/v1 Deployment.
    for name, so in _scaling(scaled_objects, target, "apps/v1"):
        yield ConflictingAutoscaler("ScaledObject", name, target.namespace,
                                    external_scalers=external_scaler_names(so))


def _scaling(
    autoscalers: Iterable[Mapping[str, Any]], target: WorkloadRef, default_api_version: str | None
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(name, object) of the autoscalers in the target's namespace whose scaleTargetRef is ``target``."""
    for obj in autoscalers:
        meta = obj.get("metadata") or {}
        if meta.get("namespace", target.namespace) != target.namespace:
            continue
        if _targets(((obj.get("spec") or {}).get("scaleTargetRef")) or {}, target, default_api_version):
            yield meta["name"], obj


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

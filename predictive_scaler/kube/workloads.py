"""The target workload and its ``/scale`` subresource: one code path for Deployments,
StatefulSets and any custom resource whose CRD enables ``subresources.scale``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from predictive_scaler.errors import ClusterError, NotFoundError
from predictive_scaler.kube import manifests
from predictive_scaler.kube.discovery import Discovery
from predictive_scaler.kube.transport import MERGE_PATCH, path_segment


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


class ScaleCalls(Discovery):
    """Read and set a target's replicas through its ``/scale``."""

    def resolve_scale_path(self, target: WorkloadRef) -> str:
        """The ``/scale`` URL of ``target``; ConfigError when its kind has none."""
        plural = target.plural or self.scalable_plural(target.api_version, target.kind)
        prefix = f"/apis/{target.group}/{target.version}" if target.group else "/api/v1"
        namespace, name = path_segment(target.namespace), path_segment(target.name)
        return f"{prefix}/namespaces/{namespace}/{path_segment(plural)}/{name}/scale"

    def get_scale(self, target: WorkloadRef) -> ScaleInfo:
        path = self.resolve_scale_path(target)
        what = f"read the scale of {target.describe()}"
        try:
            scale = self._retrying(lambda: self._request("GET", path, what=what), what)
        except NotFoundError as exc:
            raise _target_not_found(target, exc) from exc
        return _scale_info(scale, what)

    def patch_scale(
        self, target: WorkloadRef, replicas: int, *, current: ScaleInfo | None = None
    ) -> ScaleInfo:
        """Set the target's desired replicas; a no-op when already there.

        Sends a merge patch with the resourceVersion last read (``current`` saves
        one GET); on a conflict it re-reads and tries again.
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
                "PATCH", path, what=what, body=body, content_type=MERGE_PATCH, write=True
            )
            return _scale_info(answer, what)

        try:
            return self._retrying(attempt, what, retry_conflicts=True)
        except NotFoundError as exc:
            raise _target_not_found(target, exc) from exc


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


def _target_not_found(target: WorkloadRef, cause: NotFoundError) -> NotFoundError:
    return NotFoundError(
        f"target not found: {target.describe()} does not exist; create it or fix "
        "spec.target (apiVersion, kind, name) of the PredictiveScaler",
        status=cause.status,
    )

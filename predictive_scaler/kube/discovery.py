"""Discovery: which API groups, versions and kinds the API server serves.

Read once and remembered per process: the plural (and ``/scale`` subresource) of a target kind
outside the built-in table, and the HorizontalPodAutoscaler version the conflict check lists
(autoscaling/v2, else v2beta2). KEDA's presence is not discovered ahead: its ScaledObject list
answering Not Found means KEDA is absent (:mod:`predictive_scaler.kube.autoscalers`).
"""

from __future__ import annotations

import functools

from predictive_scaler.errors import ConfigError, MissingApiError, NotFoundError
from predictive_scaler.kube.transport import Transport

#: Built-in kinds with a ``/scale`` subresource: (group, kind) → plural. Other kinds are discovered.
BUILTIN_SCALABLE = {
    ("apps", "Deployment"): "deployments",
    ("apps", "StatefulSet"): "statefulsets",
    ("apps", "ReplicaSet"): "replicasets",
    ("", "ReplicationController"): "replicationcontrollers",
}
#: HorizontalPodAutoscaler versions the conflict check can read, preferred first.
HPA_VERSIONS = ("v2", "v2beta2")


class Discovery(Transport):
    """The discovery reads of :class:`~predictive_scaler.kube.client.KubeCluster`, remembered."""

    #: The autoscaling version found (None: not asked yet).
    _hpa_version: str | None = None

    @functools.cached_property
    def _plurals(self) -> dict[tuple[str, str, str], str]:
        return {}

    def scalable_plural(self, api_version: str, kind: str) -> str:
        """The plural (resource name) of ``kind`` in ``api_version``, checked to have a ``/scale``
        subresource: the built-in table, else the server's discovery document (remembered).
        ConfigError when the server does not serve the kind or the kind has no ``/scale``."""
        group, _, version = api_version.rpartition("/")
        builtin = BUILTIN_SCALABLE.get((group, kind))
        if builtin is not None:
            return builtin
        key = (group, version, kind)
        if key in self._plurals:
            return self._plurals[key]
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        what = f"discover {api_version}"
        try:
            listing = self._retrying(lambda: self._request("GET", path, what=what), what)
        except NotFoundError as exc:
            raise ConfigError(
                f"the API server does not serve {api_version}: check "
                "spec.target.apiVersion, or install the CRD that defines "
                f"{kind}",
                field="spec.target.apiVersion",
            ) from exc
        resources = listing.get("resources") or []
        names = {r.get("name") for r in resources}
        for resource in resources:
            name = resource.get("name", "")
            if resource.get("kind") == kind and "/" not in name:
                if f"{name}/scale" not in names:
                    raise ConfigError(
                        f"{kind} ({api_version}) has no /scale subresource, so "
                        "predictive-scaler cannot scale it; target a Deployment, StatefulSet "
                        "or a custom resource whose CRD enables subresources.scale",
                        field="spec.target.kind",
                    )
                self._plurals[key] = name
                return name
        raise ConfigError(
            f"{api_version} serves no kind {kind!r}: check the spelling of "
            "spec.target.kind (it is case-sensitive, e.g. Deployment)",
            field="spec.target.kind",
        )

    def hpa_version(self, *, refresh: bool = False) -> str:
        """The HorizontalPodAutoscaler version this server serves (``HPA_VERSIONS`` order), discovered
        once and remembered; MissingApiError when it serves none of them."""
        if self._hpa_version is not None and not refresh:
            return self._hpa_version
        what = "discover the autoscaling API versions"
        try:
            group = self._retrying(lambda: self._request("GET", "/apis/autoscaling", what=what), what)
        except NotFoundError:
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

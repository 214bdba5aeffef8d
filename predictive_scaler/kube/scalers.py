"""The PredictiveScaler custom resource (read, list, status) and the Events recorded on it."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from predictive_scaler.kube import manifests
from predictive_scaler.kube.transport import MERGE_PATCH, Transport, path_segment

#: Where the PredictiveScaler API lives.
CR_PREFIX = f"/apis/{manifests.GROUP}/{manifests.VERSION}"


class ScalerCalls(Transport):
    """PredictiveScalers and their Events."""

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
                f"/api/v1/namespaces/{path_segment(namespace)}/events",
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
            f"{CR_PREFIX}/namespaces/{path_segment(namespace)}/{manifests.PLURAL}"
            if namespace
            else f"{CR_PREFIX}/{manifests.PLURAL}"
        )
        what = f"list PredictiveScalers in {namespace or 'all namespaces'}"
        return self.list_paginated(path, what=what)[0]

    def patch_status(
        self, scaler_name: str, namespace: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch the scaler's status subresource; returns the updated object.

        No resourceVersion: a merge patch is applied by the server to the
        latest object, so retrying it after a conflict is safe.
        """
        body = manifests.status_patch(status)
        what = f"write the status of PredictiveScaler {namespace}/{scaler_name}"
        return self._retrying(
            lambda: self._request(
                "PATCH",
                _scaler_path(namespace, scaler_name) + "/status",
                what=what,
                body=body,
                content_type=MERGE_PATCH,
                write=True,
            ),
            what,
            retry_conflicts=True,
        )


def _scaler_path(namespace: str, name: str) -> str:
    return f"{CR_PREFIX}/namespaces/{path_segment(namespace)}/{manifests.PLURAL}/{path_segment(name)}"

"""The PredictiveScaler custom resource (read, list, status) and the Events recorded on it."""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from predictive_scaler.errors import NotFoundError
from predictive_scaler.kube import manifests
from predictive_scaler.kube.transport import MERGE_PATCH, Transport, path_segment

#: Where the PredictiveScaler API lives.
CR_PREFIX = f"/apis/{manifests.GROUP}/{manifests.VERSION}"
#: Seconds a namespace's labels are trusted before they are read again (the FinOps team label).
NAMESPACE_LABELS_TTL = 600.0


class ScalerCalls(Transport):
    """PredictiveScalers, their Events and their namespace's labels."""

    @functools.cached_property
    def _namespace_labels(self) -> tuple[threading.Lock, dict[str, tuple[dict[str, str], float]]]:
        """Namespace → (its labels, when they were read)."""
        return threading.Lock(), {}

    def namespace_labels(self, namespace: str) -> dict[str, str]:
        """The labels of ``namespace`` ({} when it is gone), read at most once per ``NAMESPACE_LABELS_TTL``
        seconds. A failed read raises (ForbiddenError without ``get`` on namespaces) and is not cached."""
        lock, cache = self._namespace_labels
        now = self._clock.now().timestamp()
        with lock:
            cached = cache.get(namespace)
        if cached is not None and now - cached[1] < NAMESPACE_LABELS_TTL:
            return dict(cached[0])
        what = f"read namespace {namespace}"

        def attempt() -> Any:
            try:
                return self._request("GET", f"/api/v1/namespaces/{path_segment(namespace)}", what=what)
            except NotFoundError:
                return None

        found = self._retrying(attempt, what)
        meta = found.get("metadata") if isinstance(found, dict) else None
        raw = (meta or {}).get("labels") if isinstance(meta, dict) else None
        labels = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
        with lock:
            cache[namespace] = (labels, now)
        return dict(labels)

    @functools.cached_property
    def _event_names(self) -> tuple[threading.Lock, dict[tuple[str, str], datetime]]:
        """When each object's last Event was named (names are made of that time; see ``create_event``)."""
        return threading.Lock(), {}

    def create_event(
        self,
        involved_object: Mapping[str, Any],
        reason: str,
        message: str,
        type: str,
        now: datetime,
        *,
        instance: str | None = None,
    ) -> str:
        """Record a core/v1 Event (see ``manifests.event``); returns its name.

        The name is made of the time to the microsecond, so two Events on one object in one
        microsecond (one reconcile's, on a frozen test clock or a coarse one) would share it: each
        is named at least a microsecond after the last one this client named for that object.
        """
        namespace = str(involved_object.get("namespace"))
        what = f"record event {reason} on {involved_object.get('kind')} {namespace}/{involved_object.get('name')}"
        key = (namespace, str(involved_object.get("name")))
        lock, named = self._event_names
        with lock:
            last = named.get(key)
            at = now if last is None or now > last else last + timedelta(microseconds=1)
            named[key] = at
        body = manifests.event(involved_object, reason, message, type, at, instance=instance)
        self._retrying(
            lambda: self._request(
                "POST", f"/api/v1/namespaces/{path_segment(namespace)}/events", what=what, body=body, write=True
            ),
            what,
        )
        return str(body["metadata"]["name"])

    def repeat_event(self, namespace: str, name: str, count: int, now: datetime) -> None:
        """Record a repeat of the Event ``name``: raise its count to ``count`` and its lastTimestamp
        to ``now`` (see ``manifests.event_repeat``). Raises NotFoundError when it has expired."""
        body = manifests.event_repeat(count, now)
        what = f"record a repeat of event {namespace}/{name}"
        self._retrying(
            lambda: self._request(
                "PATCH",
                f"/api/v1/namespaces/{path_segment(namespace)}/events/{path_segment(name)}",
                what=what,
                body=body,
                content_type=MERGE_PATCH,
                write=True,
            ),
            what,
            # No resourceVersion: the patch sets the count, so applying it again after a conflict is safe.
            retry_conflicts=True,
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

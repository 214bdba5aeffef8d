"""Shard Leases (coordination.k8s.io/v1), read and written by :mod:`predictive_scaler.controller.shards`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from predictive_scaler.kube.transport import Transport, path_segment


class LeaseCalls(Transport):
    """List the shards' Leases and write this replica's."""

    def list_leases(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        what = f"list shard Leases in {namespace}"
        return self.list_paginated(
            f"/apis/coordination.k8s.io/v1/namespaces/{path_segment(namespace)}/leases", {"labelSelector": selector},
            what=what,
        )[0]

    def write_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create the Lease (no resourceVersion in ``body``) or replace it (with one: a conflict when it
        changed since it was read — someone else renewed it). No retry on a conflict: the caller re-reads."""
        name = body["metadata"]["name"]
        what = f"write Lease {namespace}/{name}"
        base = f"/apis/coordination.k8s.io/v1/namespaces/{path_segment(namespace)}/leases"
        if (body.get("metadata") or {}).get("resourceVersion"):
            return self._retrying(
                lambda: self._request("PUT", f"{base}/{path_segment(name)}", what=what, body=body, write=True), what)
        return self._retrying(lambda: self._request("POST", base, what=what, body=body, write=True), what)

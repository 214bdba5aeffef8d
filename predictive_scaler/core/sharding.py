"""The stable hash that splits scalers into shards: the same for the retraining job's Indexed
Job pods and the controller's replicas, so a scaler lands on the same index in both."""

from __future__ import annotations

import hashlib

from predictive_scaler.errors import ConfigError


def shard_of(key: str, count: int) -> int:
    """Stable shard of ``namespace/name`` (same in every pod and Python run, unlike ``hash``)."""
    if count < 1:
        raise ConfigError(f"shard count must be at least 1, got {count}", field="shard_count")
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % count

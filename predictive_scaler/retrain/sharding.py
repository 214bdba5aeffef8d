"""Work split across the pods of a Kubernetes Indexed Job by a stable hash of ``namespace/name``."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from predictive_scaler.core.sharding import shard_of
from predictive_scaler.errors import ConfigError
from predictive_scaler.retrain.settings import ScalerTarget

#: Environment of a Kubernetes Indexed Job pod (the index is set by Kubernetes; the count by our Job).
SHARD_INDEX_ENV = "JOB_COMPLETION_INDEX"
SHARD_COUNT_ENV = "JOB_COMPLETIONS"


def select_shard(targets: Iterable[ScalerTarget], index: int, count: int) -> list[ScalerTarget]:
    if not 0 <= index < count:
        raise ConfigError(f"shard index {index} is outside 0..{count - 1}", field="shard_index")
    return [t for t in targets if shard_of(t.key, count) == index]


def shard_from_environment(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(index, count) of an Indexed Job pod; (0, 1) outside one."""
    env = os.environ if environ is None else environ
    try:
        index = int(env.get(SHARD_INDEX_ENV, "0"))
        count = int(env.get(SHARD_COUNT_ENV, "1"))
    except ValueError as exc:
        raise ConfigError(f"{SHARD_INDEX_ENV}/{SHARD_COUNT_ENV} must be whole numbers ({exc})",
                          field="shard_index") from exc
    if count < 1 or not 0 <= index < count:
        raise ConfigError(f"shard {index} of {count} is invalid; set {SHARD_COUNT_ENV} to the Job's completions",
                          field="shard_index")
    return index, count


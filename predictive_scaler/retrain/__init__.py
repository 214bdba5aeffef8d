"""The weekly retraining job, as a package: settings, sharding, the history port and its
Prometheus adapter, and the job itself (see :mod:`predictive_scaler.retrain.job`).

Everything public is re-exported here, so ``from predictive_scaler.retrain import …``
(and ``retrain.shard_of``) keep working.
"""

from predictive_scaler.retrain.history import (
    GpuUsage,
    HistoryPort,
    PrometheusHistory,
    demand_query,
    history_for_scaler,
)
from predictive_scaler.retrain.job import (
    DONE,
    RETRAIN_DIR,
    SINGLE_THREAD_ENV,
    Result,
    RetrainReport,
    ScalerOutcome,
    default_run_id,
    horizons_for,
    read_record,
    record_path,
    retrain_scaler,
    run_retrain,
    score_window,
    write_record,
)
from predictive_scaler.retrain.settings import (
    RetrainSettings,
    ScalerTarget,
    load_scalers_file,
    scaler_from_manifest,
)
from predictive_scaler.retrain.sharding import (
    SHARD_COUNT_ENV,
    SHARD_INDEX_ENV,
    select_shard,
    shard_from_environment,
    shard_of,
)

__all__ = [
    "DONE", "RETRAIN_DIR", "SHARD_COUNT_ENV", "SHARD_INDEX_ENV", "SINGLE_THREAD_ENV", "GpuUsage", "HistoryPort",
    "PrometheusHistory", "Result", "RetrainReport", "RetrainSettings", "ScalerOutcome", "ScalerTarget",
    "default_run_id", "demand_query", "history_for_scaler", "horizons_for", "load_scalers_file", "read_record",
    "record_path", "retrain_scaler", "run_retrain", "scaler_from_manifest", "score_window", "select_shard",
    "shard_from_environment", "shard_of", "write_record",
]

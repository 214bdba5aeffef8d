"""The weekly retraining job, as a package: settings, sharding, the history port and its
Prometheus adapter (``history``), the store port and its adapters (``stores``), the training
function the CronJob and the backtest share (``training``), the outcome (``outcome``) and the
CronJob's entry point (``job``).

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
    RETRAIN_DIR,
    SINGLE_THREAD_ENV,
    RetrainReport,
    default_run_id,
    read_record,
    record_path,
    retrain_scaler,
    run_retrain,
    write_record,
)
from predictive_scaler.retrain.outcome import DONE, Result, ScalerOutcome
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
from predictive_scaler.retrain.stores import (
    DirectoryStore,
    MemoryStore,
    ModelStorePort,
    ServingModel,
)
from predictive_scaler.retrain.training import horizons_for, score_window, train_and_promote

__all__ = [
    "DONE", "RETRAIN_DIR", "SHARD_COUNT_ENV", "SHARD_INDEX_ENV", "SINGLE_THREAD_ENV", "DirectoryStore", "GpuUsage",
    "HistoryPort", "MemoryStore", "ModelStorePort", "PrometheusHistory", "Result", "RetrainReport",
    "RetrainSettings", "ScalerOutcome", "ScalerTarget", "ServingModel", "default_run_id", "demand_query",
    "history_for_scaler", "horizons_for", "load_scalers_file", "read_record", "record_path", "retrain_scaler",
    "run_retrain", "scaler_from_manifest", "score_window", "select_shard", "shard_from_environment", "shard_of",
    "train_and_promote", "write_record",
]

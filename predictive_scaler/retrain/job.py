"""The weekly retraining job (the CronJob's entry point): for each PredictiveScaler, train and promote
through :func:`~predictive_scaler.retrain.training.train_and_promote` — the function the backtest
retrains through too — over the model store (a directory or an s3:// bucket), resumably.

Per scaler (:func:`retrain_scaler`): the training function pulls 28 days of history, holds
out the latest 2 days, selects and fits a challenger on the rest, and promotes it only if it
is not worse than the serving model on the held-out window (its module says how); the job
records the outcome in ``<store>/<model>/retrain/<run_id>.json``.

Resumable and idempotent: a scaler whose record for ``run_id`` says it is done
is skipped; a version already published by this run (found by the run id in
its manifest) is reused, never duplicated. Store writes are atomic, so a crash
at any point leaves every serving pointer on a complete, verified version.

Work is split across the pods of an Indexed Job by a stable hash of
``namespace/name`` (:func:`shard_of`) and across processes with the ``spawn``
start method (:func:`run_retrain`). Sources and store are injected; the clock
is the ``now`` argument.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from predictive_scaler.errors import ConfigError, ModelError, StoreError
from predictive_scaler.forecasting.store import (
    ModelStorage,
    ModelStore,
    check_model_name,
    open_store,
)
from predictive_scaler.retrain.history import HistoryPort
from predictive_scaler.retrain.outcome import ScalerOutcome, finite_json, iso_time
from predictive_scaler.retrain.settings import RetrainSettings, ScalerTarget
from predictive_scaler.retrain.sharding import select_shard
from predictive_scaler.retrain.stores import DirectoryStore
from predictive_scaler.retrain.training import (
    guarded,
    train_and_promote,
)

# Names the job has always offered (their homes: outcome.py, training.py).
__all__ = [
    "RETRAIN_DIR",
    "RetrainReport",
    "SINGLE_THREAD_ENV",
    "default_run_id",
    "read_record",
    "record_path",
    "retrain_scaler",
    "run_retrain",
    "write_record",
]

log = logging.getLogger(__name__)

RETRAIN_DIR = "retrain"
#: numpy's BLAS spawns a thread per core in every process; with several worker processes on a
#: small machine they fight over the cores (a 5-minute ARIMA fit went from 0.5 s to 7 s here).
SINGLE_THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

def default_run_id(now: datetime) -> str:
    """The ISO week of ``now`` (``2026-W48``): one run per week, re-runs in the same week resume it."""
    year, week, _ = now.astimezone(UTC).isocalendar()
    return f"{year}-W{week:02d}"



# -- the run record ------------------------------------------------------------------------------

def record_path(store: ModelStore, model: str, run_id: str) -> Path:
    """Where a directory store keeps a run's record (an object store keeps it under the same key)."""
    return store.document_path(model, RETRAIN_DIR, run_id)


def _check_record_names(model: str, run_id: str) -> None:
    check_model_name(model)
    check_model_name(run_id, what="run id")  # no traversal, whatever holds the store


def read_record(store: ModelStorage, model: str, run_id: str) -> ScalerOutcome | None:
    _check_record_names(model, run_id)
    try:
        # At most 1 MiB (a record is a few kilobytes); a directory store reads regular files only.
        body = store.read_document(model, RETRAIN_DIR, run_id, limit=1 << 20)
        if body is None:
            return None
        return ScalerOutcome.from_dict(json.loads(body))
    except (ValueError, TypeError, OSError, ModelError, StoreError) as exc:
        log.warning("ignoring unreadable retrain record of %s in run %s (%s); the scaler is retrained",
                    model, run_id, exc)
        return None


def write_record(store: ModelStorage, outcome: ScalerOutcome) -> None:
    body = json.dumps(outcome.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"
    store.write_document(outcome.model, RETRAIN_DIR, outcome.run_id, body.encode("utf-8"))


def _published_by_run(store: ModelStorage, model: str, run_id: str) -> str | None:
    """The version this run already published for ``model`` (crash after publish, before the record)."""
    for info in reversed(store.list(model)):
        meta = (info.manifest.metrics or {}).get("retrain") if info.manifest else None
        if isinstance(meta, Mapping) and meta.get("run_id") == run_id:
            return info.version
    return None


# -- one scaler --------------------------------------------------------------------------------

def retrain_scaler(
    target: ScalerTarget,
    history: HistoryPort,
    store: ModelStorage,
    settings: RetrainSettings,
    now: datetime,
    run_id: str,
) -> ScalerOutcome:
    """Retrain one scaler (see the module doc). Expected problems become a *skipped* outcome, a failing
    source a *failed* one (:func:`~predictive_scaler.retrain.training.guarded`)."""
    try:
        _check_record_names(target.model_name, run_id)  # a name that would leave the store is refused first
    except ConfigError as exc:
        return _failed(target, run_id, str(exc))
    outcome = guarded(target, run_id, DirectoryStore(store),
                      lambda base: _retrain(target, history, store, settings, now, run_id, base))
    if outcome.result != "already-done":
        write_record(store, outcome)
    return outcome


def _retrain(target: ScalerTarget, history: HistoryPort, store: ModelStorage, settings: RetrainSettings,
             now: datetime, run_id: str, base: ScalerOutcome) -> ScalerOutcome:
    if target.spec is None:
        return replace(base, reason=target.problem or "invalid spec")
    model_name = target.model_name
    check_model_name(model_name)  # a name the store refuses is a config problem, said early
    earlier = read_record(store, model_name, run_id)
    if earlier is not None and earlier.done:
        return replace(earlier, result="already-done",
                       reason=f"done earlier in run {run_id}: {earlier.result} ({earlier.reason})")
    reused = _published_by_run(store, model_name, run_id)
    if reused is not None:
        try:
            store.promote(model_name, reused)  # verified; idempotent when it already serves
        except ModelError as exc:
            log.warning("%s: version %s from this run is refused (%s); training again", target.key, reused, exc)
        else:
            return replace(base, result="promoted", version=reused, serving_version=reused,
                           reason=f"version {reused} was published by this run before an interruption; "
                                  "serving it")

    return train_and_promote(target, history, DirectoryStore(store), settings, now, run_id)


# -- the whole run -----------------------------------------------------------------------------

@dataclass(frozen=True)
class RetrainReport:
    run_id: str
    now: datetime
    shard_index: int
    shard_count: int
    processes: int
    outcomes: tuple[ScalerOutcome, ...]
    seconds: float

    @property
    def failed(self) -> int:
        return sum(o.result == "failed" for o in self.outcomes)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.outcomes:
            out[o.result] = out.get(o.result, 0) + 1
        return out

    def idle_summary(self) -> dict[str, Any]:
        rows = [o.idle_gpus for o in self.outcomes if o.idle_gpus]
        costs = [r["cost_per_day"] for r in rows if r.get("cost_per_day") is not None]
        return {"scalers": len(rows), "mean_idle_gpus": sum(r["mean"] for r in rows),
                "idle_gpu_hours_per_day": sum(r["idle_gpu_hours_per_day"] for r in rows),
                "cost_per_day": sum(costs) if costs else None,
                "currencies": sorted({r["currency"] for r in rows})}

    def to_dict(self) -> dict[str, Any]:
        return finite_json({
            "run_id": self.run_id, "now": iso_time(self.now),
            "shard": {"index": self.shard_index, "count": self.shard_count}, "processes": self.processes,
            "seconds": round(self.seconds, 3), "counts": self.counts(), "idle_gpus": self.idle_summary(),
            "scalers": [o.to_dict() for o in self.outcomes],
        })


@dataclass(frozen=True)
class _Work:
    """Everything a worker process needs (picklable)."""

    history: Any
    #: The store's location (a directory or s3:// URL): each worker opens its own client.
    store_root: str
    settings: RetrainSettings
    now: datetime
    run_id: str


def _work(work: _Work, target: ScalerTarget) -> ScalerOutcome:
    store = open_store(work.store_root, keep=work.settings.keep)
    return retrain_scaler(target, work.history, store, work.settings, work.now, work.run_id)


def run_retrain(
    targets: Sequence[ScalerTarget],
    *,
    history: HistoryPort,
    store: ModelStorage,
    settings: RetrainSettings,
    now: datetime,
    run_id: str | None = None,
    processes: int = 1,
    shard_index: int = 0,
    shard_count: int = 1,
    on_outcome: Callable[[ScalerOutcome], None] | None = None,
) -> RetrainReport:
    """Retrain this shard's scalers, in this process or in ``processes`` spawned workers.

    Exceptions that are not :class:`ScalerError`, and a source that cannot be reached or
    answers garbage (:class:`SourceError`), mark that scaler *failed* and the run goes on;
    a worker that dies marks the scalers it had not finished failed.
    ``on_outcome`` is called in this process as each scaler finishes (status, logs).
    """
    if processes < 1:
        raise ConfigError(f"processes must be at least 1, got {processes}", field="processes")
    run = run_id or default_run_id(now)
    mine = select_shard(targets, shard_index, shard_count)
    log.info("retrain run %s: shard %d/%d has %d of %d scalers, %d process(es)",
             run, shard_index, shard_count, len(mine), len(targets), processes)
    work = _Work(history=history, store_root=store.location, settings=settings, now=now, run_id=run)
    t0 = time.perf_counter()
    outcomes: list[ScalerOutcome] = []

    def finished(outcome: ScalerOutcome) -> None:
        outcomes.append(outcome)
        log.info("[%d/%d] %s: %s in %.1fs — %s", len(outcomes), len(mine), outcome.key, outcome.result,
                 outcome.seconds, outcome.reason)
        if on_outcome is not None:
            on_outcome(outcome)

    if processes == 1 or len(mine) <= 1:
        for target in mine:
            try:
                outcome = retrain_scaler(target, history, store, settings, now, run)
            except Exception as exc:  # a bug must not stop the other scalers
                log.exception("retraining %s failed", target.key)
                outcome = _failed(target, run, f"unexpected {type(exc).__name__}: {exc}")
            finished(outcome)
    else:
        _run_in_processes(mine, work, processes, finished)
    return RetrainReport(run_id=run, now=now, shard_index=shard_index, shard_count=shard_count,
                         processes=processes, outcomes=tuple(outcomes), seconds=time.perf_counter() - t0)


def _failed(target: ScalerTarget, run_id: str, reason: str) -> ScalerOutcome:
    return ScalerOutcome(key=target.key, model=target.model_name, result="failed", reason=reason, run_id=run_id)


def _run_in_processes(targets: Sequence[ScalerTarget], work: _Work, processes: int,
                      finished: Callable[[ScalerOutcome], None]) -> None:
    import multiprocessing

    for name in SINGLE_THREAD_ENV:  # inherited by the spawned workers
        os.environ.setdefault(name, "1")
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(processes, len(targets)), mp_context=ctx) as pool:
        pending: dict[Future[ScalerOutcome], ScalerTarget] = {pool.submit(_work, work, t): t for t in targets}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                target = pending.pop(fut)
                try:
                    outcome = fut.result()
                except BrokenProcessPool:
                    outcome = _failed(target, work.run_id, "a worker process died (killed or out of memory) "
                                      "before this scaler finished; re-run the job to resume")
                except Exception as exc:
                    outcome = _failed(target, work.run_id, f"unexpected {type(exc).__name__}: {exc}")
                finished(outcome)

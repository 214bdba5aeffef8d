"""Where the retraining job's models go: the store port and its two adapters.

:func:`~predictive_scaler.retrain.training.train_and_promote` reads the serving model and
publishes a challenger through :class:`ModelStorePort` only, so the same function runs

- in the weekly CronJob over the model store's directory (:class:`DirectoryStore`: atomic
  writes, verified before the serving pointer moves), and
- in the backtest over :class:`MemoryStore` (versions ``v1``, ``v2``, … in memory, nothing
  written), where the model it promotes is the one the replayed reconciler serves next.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pandas as pd

from predictive_scaler.errors import ConfigError, ModelError
from predictive_scaler.forecasting.base import FittedModel
from predictive_scaler.forecasting.store import ModelStorage, TrainingWindow
from predictive_scaler.retrain.ledger import LEDGER_FOLDER, LEDGER_ID, MAX_LEDGER_BYTES


@dataclass(frozen=True)
class ServingModel:
    """The model that serves a name, and the end of the history it was fitted on."""

    version: str
    model: FittedModel
    #: Only data after this is fair to compare it with a challenger on.
    trained_until: pd.Timestamp
    #: The fingerprint of the history (and settings) it was trained on, when the job recorded one:
    #: the same fingerprint this week means nothing new to learn.
    history_sha256: str | None = None


class ModelStorePort(Protocol):
    """What the training function needs of a model store."""

    def serving_version(self, name: str) -> str | None:
        """The version serving ``name``; None when nothing does (or the pointer cannot be read)."""
        ...

    def load_serving(self, name: str) -> ServingModel:
        """The serving model, verified; ModelError/ConfigError when it is refused."""
        ...

    def publish(self, name: str, model: FittedModel, *, window: TrainingWindow, metrics: Mapping[str, Any],
                capacity: Mapping[str, Any] | None) -> str:
        """Store a new version (not serving yet); returns its id."""
        ...

    def promote(self, name: str, version: str) -> None:
        """Serve ``version`` (verified first; ModelError when refused — the old one keeps serving)."""
        ...

    def read_ledger(self, name: str) -> bytes | None:
        """The selection ledger of ``name`` (:mod:`~predictive_scaler.retrain.ledger`), None when there is
        none; ModelError/StoreError when it cannot be read."""
        ...

    def write_ledger(self, name: str, body: bytes) -> None:
        """Replace the selection ledger of ``name`` (atomically; StoreError when it cannot be written)."""
        ...


def history_fingerprint_of(metrics: Mapping[str, Any]) -> str | None:
    """The history fingerprint the job put in a version's metrics (``retrain.history_sha256``)."""
    retrain = metrics.get("retrain") if isinstance(metrics, Mapping) else None
    value = retrain.get("history_sha256") if isinstance(retrain, Mapping) else None
    return value if isinstance(value, str) else None


@dataclass
class DirectoryStore:
    """:class:`ModelStorePort` over the model store the CronJob writes to: a directory
    (:class:`~predictive_scaler.forecasting.store.ModelStore`) or an object store bucket
    (:class:`~predictive_scaler.forecasting.object_store.ObjectModelStore`)."""

    store: ModelStorage

    def serving_version(self, name: str) -> str | None:
        try:
            pointer = self.store.pointer(name)
        except (ModelError, ConfigError):
            return None
        return None if pointer is None else pointer.version

    def load_serving(self, name: str) -> ServingModel:
        pointer = self.store.pointer(name)
        loaded = self.store.serving(name, expected_series=name)
        version = pointer.version if pointer is not None else "?"
        return ServingModel(version=version, model=loaded.model, trained_until=loaded.manifest.window.end,
                            history_sha256=history_fingerprint_of(loaded.manifest.metrics))

    def publish(self, name: str, model: FittedModel, *, window: TrainingWindow, metrics: Mapping[str, Any],
                capacity: Mapping[str, Any] | None) -> str:
        return self.store.publish(name, model, series=name, window=window, metrics=metrics, capacity=capacity,
                                  serve=False)

    def promote(self, name: str, version: str) -> None:
        self.store.promote(name, version)  # verifies the written artifact before the pointer moves

    def read_ledger(self, name: str) -> bytes | None:
        return self.store.read_document(name, LEDGER_FOLDER, LEDGER_ID, limit=MAX_LEDGER_BYTES)

    def write_ledger(self, name: str, body: bytes) -> None:
        self.store.write_document(name, LEDGER_FOLDER, LEDGER_ID, body)


@dataclass
class MemoryStore:
    """:class:`ModelStorePort` in memory: the backtest's store (versions ``v1``, ``v2``, …)."""

    versions: dict[str, dict[str, ServingModel]] = field(default_factory=dict)
    #: What each published version was judged on (the metrics a manifest would hold).
    metrics: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    serving: dict[str, str] = field(default_factory=dict)
    ledgers: dict[str, bytes] = field(default_factory=dict)

    def serving_version(self, name: str) -> str | None:
        return self.serving.get(name)

    def load_serving(self, name: str) -> ServingModel:
        version = self.serving.get(name)
        if version is None:
            raise ModelError(f"model {name!r} has no serving version in the in-memory store")
        return self.versions[name][version]

    def publish(self, name: str, model: FittedModel, *, window: TrainingWindow, metrics: Mapping[str, Any],
                capacity: Mapping[str, Any] | None) -> str:
        mine = self.versions.setdefault(name, {})
        version = f"v{len(mine) + 1}"
        mine[version] = ServingModel(version=version, model=model, trained_until=window.end,
                                     history_sha256=history_fingerprint_of(metrics))
        self.metrics[(name, version)] = metrics
        return version

    def promote(self, name: str, version: str) -> None:
        if version not in self.versions.get(name, {}):
            raise ModelError(f"model {name!r} has no version {version!r} in the in-memory store")
        self.serving[name] = version

    def read_ledger(self, name: str) -> bytes | None:
        return self.ledgers.get(name)

    def write_ledger(self, name: str, body: bytes) -> None:
        self.ledgers[name] = body

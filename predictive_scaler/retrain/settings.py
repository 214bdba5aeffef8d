"""The retraining job's settings and the scalers it retrains (from manifests or the API)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from predictive_scaler.errors import ConfigError
from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting.store import DEFAULT_KEEP
from predictive_scaler.series import DEFAULT_MIN_HISTORY, format_duration
from predictive_scaler.spec import ScalerSpec
from predictive_scaler.yaml_input import excerpt


@dataclass(frozen=True)
class RetrainSettings:
    """How the job trains and judges; defaults are the weekly CronJob's."""

    #: History pulled per scaler (ending at ``now``); at most this much is fitted.
    history: timedelta = timedelta(days=28)
    #: Observed history required; less → skipped (the models need two weekly cycles).
    min_history: timedelta = DEFAULT_MIN_HISTORY
    #: Most recent data held out of the challenger's fit and used to compare it with the serving model.
    holdout: timedelta = timedelta(days=2)
    #: A comparison window shorter than this (serving model fitted too recently) keeps the serving model.
    min_compare: timedelta = timedelta(hours=12)
    #: More missing steps than this share of the observed history → skipped ("too many gaps").
    max_missing_fraction: float = 0.2
    #: Candidate model kinds (the one default list: train, evaluate and the backtest use it too).
    kinds: tuple[str, ...] = registry.DEFAULT_CANDIDATES
    #: Rolling-origin scoring before the holdout: at most this much of the latest data.
    evaluation_window: timedelta = timedelta(days=7)
    #: ... after at least this much to train the candidates on (history shorter than this plus
    #: the holdout and 6 hours to score is skipped).
    min_fit: timedelta = timedelta(days=10)
    #: Window over which idle allocated GPUs are summarised.
    idle_window: timedelta = timedelta(days=7)
    #: Versions kept per model in the store.
    keep: int = DEFAULT_KEEP
    #: Learn from the scaler's earlier weeks (its selection ledger, :mod:`~predictive_scaler.retrain.ledger`):
    #: skip candidates that kept losing by a wide margin and warm-start the slow fits from last week's
    #: parameters. False: every week cold, every candidate scored (``retrain --cold``).
    reuse_earlier_weeks: bool = True

    def __post_init__(self) -> None:
        if self.min_history < timedelta(days=1):
            raise ConfigError("minimum history must be at least 1 day (14 days recommended)", field="min_history")
        if self.history < self.min_history:
            raise ConfigError(f"history {format_duration(self.history)} is shorter than the minimum "
                              f"{format_duration(self.min_history)}; pull more", field="history")
        if not timedelta(hours=1) <= self.holdout <= self.min_history / 2:
            raise ConfigError(f"holdout {format_duration(self.holdout)} must be between 1h and half the "
                              "minimum history", field="holdout")
        if self.min_fit < timedelta(days=1):
            raise ConfigError(f"min_fit {format_duration(self.min_fit)} is too short to fit a model on; give at "
                              "least 1d (10d is the default)", field="min_fit")
        if not timedelta(0) < self.min_compare <= self.holdout:
            raise ConfigError("min_compare must be positive and no longer than the holdout", field="min_compare")
        if not 0.0 <= self.max_missing_fraction < 1.0:
            raise ConfigError(f"max_missing_fraction {self.max_missing_fraction} must be in [0, 1)",
                              field="max_missing_fraction")
        if not self.kinds:
            raise ConfigError("no candidate models; give e.g. arima,persistence", field="kinds")
        for kind in self.kinds:
            if kind not in registry.FORECASTER_KINDS:
                raise ConfigError(f"unknown model {excerpt(kind)}; choose from {', '.join(registry.FORECASTER_KINDS)}",
                                  field="kinds")
        if self.keep < 1:
            raise ConfigError("keep at least 1 version", field="keep")


@dataclass(frozen=True)
class ScalerTarget:
    """One PredictiveScaler to retrain. ``spec`` is None when the manifest's spec is invalid (``problem``)."""

    namespace: str
    name: str
    spec: ScalerSpec | None
    problem: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def model_name(self) -> str:
        """Model name in the store — the controller reads the same (``spec.model.name`` or the scaler's name)."""
        return (self.spec.model.name if self.spec is not None else None) or self.name


def scaler_from_manifest(doc: Mapping[str, Any], *, default_namespace: str = "default") -> ScalerTarget:
    """A PredictiveScaler object (from a YAML file or the API) → target; an invalid spec is kept with its reason."""
    if not isinstance(doc, Mapping):
        raise ConfigError(f"a PredictiveScaler must be a mapping, got {type(doc).__name__}", field="manifest")
    meta = doc.get("metadata") or {}
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ConfigError("a PredictiveScaler has no metadata.name; add one", field="metadata.name")
    namespace = meta.get("namespace") or default_namespace
    try:
        spec = ScalerSpec.from_dict(doc.get("spec") or {})
    except ConfigError as exc:
        return ScalerTarget(str(namespace), name, None, problem=f"invalid spec: {exc}")
    return ScalerTarget(str(namespace), name, spec)


def load_scalers_file(path: str | Path, *, default_namespace: str = "default") -> list[ScalerTarget]:
    """PredictiveScaler manifests from a YAML file (several documents, or a ``kind: List``)."""
    import yaml

    p = Path(path)
    from predictive_scaler.yaml_input import check_size, read_yaml_text

    if p.is_dir():
        raise ConfigError(f"cannot read scalers file {p}: Is a directory; give a YAML file of PredictiveScaler "
                          "manifests", field="config")
    try:
        text = read_yaml_text(p, what="a scalers file", remedy="give a YAML file of PredictiveScaler manifests",
                              field="config")  # a FIFO or a device is refused, never read
        docs = check_size(list(yaml.safe_load_all(text)), str(p), field="config")
    except RecursionError as exc:
        raise ConfigError(f"scalers file {p} is nested too deeply to read; check that it holds PredictiveScaler "
                          "manifests", field="config") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read scalers file {p}: {exc.strerror}", field="config") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"scalers file {p} is not UTF-8 text (byte {exc.start}); give a YAML file of "
                          "PredictiveScaler manifests", field="config") from exc
    except ValueError as exc:  # after UnicodeDecodeError, a ValueError too: Python's limit on digits in an int
        raise ConfigError(f"scalers file {p} holds a number too long to read ({exc}); check the file",
                          field="config") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p} is not valid YAML ({exc}); fix the file", field="config") from exc
    items: list[Any] = []
    for doc in docs:
        if doc is None:
            continue
        if isinstance(doc, Mapping) and isinstance(doc.get("items"), list):
            items.extend(doc["items"])
        else:
            items.append(doc)
    targets = [scaler_from_manifest(d, default_namespace=default_namespace) for d in items
               if isinstance(d, Mapping) and d.get("kind", "PredictiveScaler") == "PredictiveScaler"]
    if not targets:
        raise ConfigError(f"{p} holds no PredictiveScaler manifests (kind: PredictiveScaler)", field="config")
    keys = [t.key for t in targets]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise ConfigError(f"{p} lists {dupes[0]} more than once; keep one", field="config")
    return targets


"""Model kinds by name: the one place that maps a kind string to its classes.

Imports are lazy (Prophet and statsmodels are slow to import), so listing the
kinds or loading one artifact costs only what that kind needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from predictive_scaler.errors import ModelError, did_you_mean
from predictive_scaler.forecasting.defaults import DEFAULT_VARIANT
from predictive_scaler.yaml_input import excerpt

if TYPE_CHECKING:  # annotations only: the command line reads DEFAULT_CANDIDATES without numpy
    from predictive_scaler.forecasting.base import FittedModel, Forecaster

# kind -> (module, forecaster class, fitted model class)
_KINDS: dict[str, tuple[str, str, str]] = {
    "arima": ("predictive_scaler.forecasting.arima", "ArimaForecaster", "ArimaModel"),
    "prophet": ("predictive_scaler.forecasting.prophet", "ProphetForecaster", "ProphetModel"),
    "persistence": ("predictive_scaler.forecasting.baselines", "PersistenceForecaster", "PersistenceModel"),
    "seasonal-naive": ("predictive_scaler.forecasting.baselines", "SeasonalNaiveForecaster", "SeasonalNaiveModel"),
    "holt-winters": ("predictive_scaler.forecasting.baselines", "HoltWintersForecaster", "HoltWintersModel"),
    "ets": ("predictive_scaler.forecasting.smoothing", "EtsForecaster", "EtsModel"),
    "mstl": ("predictive_scaler.forecasting.smoothing", "MstlForecaster", "MstlModel"),
    "seasonal-profile": ("predictive_scaler.forecasting.profile", "SeasonalProfileForecaster",
                         "SeasonalProfileModel"),
    "ensemble": ("predictive_scaler.forecasting.ensemble", "EnsembleForecaster", "EnsembleModel"),
    "quantile-regression": ("predictive_scaler.forecasting.quantreg", "QuantileRegressionForecaster",
                            "QuantileRegressionModel"),
    "calibrated": ("predictive_scaler.forecasting.calibration", "", "CalibratedModel"),
    "combination": ("predictive_scaler.forecasting.combination", "", "CombinationModel"),
}

#: Kinds a user may ask `evaluate --models` / `train` for (calibrated is a wrapper, not a choice).
FORECASTER_KINDS: tuple[str, ...] = (
    "arima", "prophet", "persistence", "seasonal-naive", "holt-winters", "ensemble", "quantile-regression",
    "ets", "mstl", "seasonal-profile",
)

#: The default candidates, defined once: what `train` and `evaluate` score, what the retraining
#: job chooses from, and what the backtest's retraining (the job's own function) chooses from —
#: the default variant's (:mod:`defaults`, chosen held out, backtests/results/heldout.md).
DEFAULT_CANDIDATES: tuple[str, ...] = DEFAULT_VARIANT.candidates


def _load(kind: str, which: int) -> Any:
    try:
        module, *names = _KINDS[kind]
    except KeyError:
        raise ModelError(
            f"unknown model kind {excerpt(kind)}; known kinds: {', '.join(sorted(_KINDS))}"
        ) from None
    name = names[which]
    if not name:
        raise ModelError(f"model kind {excerpt(kind)} cannot be fitted on its own")
    return getattr(importlib.import_module(module), name)


def forecaster(kind: str, **options: Any) -> Forecaster:
    """A new, unfitted forecaster of ``kind``."""
    return _load(kind, 0)(**options)  # type: ignore[no-any-return]


def model_class(kind: str) -> type[FittedModel]:
    """The :class:`FittedModel` class that rebuilds artifacts of ``kind``."""
    return _load(kind, 1)  # type: ignore[no-any-return]


def model_from_params(kind: str, params: dict[str, Any]) -> FittedModel:
    return model_class(kind).from_params(params)


def parse_kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    for k in kinds:
        if k not in FORECASTER_KINDS:
            raise ModelError(f"unknown model {excerpt(k)}; {did_you_mean(k, FORECASTER_KINDS)}choose from "
                             f"{', '.join(FORECASTER_KINDS)}")
    if not kinds:
        raise ModelError(f"no models given; choose from {', '.join(FORECASTER_KINDS)}")
    return kinds

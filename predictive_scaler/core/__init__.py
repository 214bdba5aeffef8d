"""The core: value types every part shares (see :mod:`predictive_scaler.core.values`)."""

from predictive_scaler.core.values import DemandSample, Forecast

__all__ = ["DemandSample", "Forecast"]

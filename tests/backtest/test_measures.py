"""The backtest's accuracy measures agree with the forecasting engine's, and each part names its own retry policy."""

from __future__ import annotations

import numpy as np
import pytest

from predictive_scaler.backtest import measures
from predictive_scaler.forecasting import metrics
from predictive_scaler.sources import prometheus


@pytest.mark.parametrize(("history", "scale"), [
    pytest.param([5.0, 5.0, 5.0, 5.0], None, id="flat"),
    pytest.param([5.0, np.nan, 5.0, 5.0], None, id="flat-with-a-gap"),
    pytest.param([1.0, 2.0, 4.0], 1.5, id="moving"),
])
def test_the_backtest_and_the_engine_agree_on_the_mase_scale(history: list[float], scale: float | None) -> None:
    got = metrics.naive_scale(np.array(history))
    assert got == (pytest.approx(scale) if scale is not None else None)
    # On a flat window the backtest's MASE is undefined, as the engine's is.
    y = np.array([5.0, 6.0])
    acc = measures.horizon_accuracy(y + 1.0, y + 2.0, y, quantile=0.95, naive_mae=got)
    assert (acc.mase is None) == (scale is None)
    assert acc.mase == (metrics.mase(y, y + 1.0, got) if scale is not None else None)


def test_the_retry_policies_are_named_for_their_part() -> None:
    from predictive_scaler.kube.retry import RetryPolicy

    assert not hasattr(prometheus, "RetryPolicy") and hasattr(prometheus, "PrometheusRetry")
    assert RetryPolicy.__module__ == "predictive_scaler.kube.retry"

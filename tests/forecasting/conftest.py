"""Synthetic series with known structure for the forecasting tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.series import Series

START = pd.Timestamp("2024-03-04T00:00:00Z")  # a Monday


def make_daily(
    days: float = 16,
    step_seconds: int = 300,
    level: float = 100.0,
    amplitude: float = 0.5,
    noise: float = 0.1,
    seed: int = 0,
    gaps: tuple[tuple[int, int], ...] = (),
) -> Series:
    """``level · exp(amplitude · sin(daily phase) + AR(1) noise)``: a daily cycle, multiplicative noise."""
    rng = np.random.default_rng(seed)
    n = int(days * 86400 // step_seconds)
    t = np.arange(n) * step_seconds / 86400
    shocks = rng.normal(0.0, noise, n)
    ar = np.empty(n)
    acc = 0.0
    for i in range(n):  # AR(1) so recent values carry information, as in real traffic
        acc = 0.8 * acc + shocks[i]
        ar[i] = acc
    values = level * np.exp(amplitude * np.sin(2 * np.pi * t) + ar)
    for i, j in gaps:
        values[i:j] = np.nan
    return Series(values=values, start=START, step_seconds=step_seconds, name="synthetic")


@pytest.fixture
def daily_series() -> Callable[..., Series]:
    return make_daily

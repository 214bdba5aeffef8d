"""Generated stand-ins for traces the project may not redistribute.

The Alibaba ``cluster-trace-v2026-GenAI`` files carry no licence, so they are
not bundled (backtests/traces/README.md). Tests that need their *shape* — one
day of a GPU inference service: gateway QPS every 10 minutes, and every minute
the mean GPU duty cycle and the number of pods with a busy GPU — use this
deterministic stand-in with the same character: a daily swell, bursts, a low
duty cycle (median a few per cent), tens of busy pods, and the duty cycle
following the load with sampling noise of its own.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from predictive_scaler.series import Series

START = pd.Timestamp("2022-09-11T01:20:00Z")


def gpu_service_day(seed: int = 7) -> tuple[Series, Series, Series]:
    """(QPS at 10 min, mean GPU duty cycle % at 1 min, busy pods at 1 min) over one day."""
    rng = np.random.default_rng(seed)
    minutes = 22 * 60  # the source covers 01:12 → 24:00
    t = np.arange(minutes)
    swell = 0.6 + 0.4 * np.sin(2 * np.pi * (t - 6 * 60) / 1440)
    bursts = np.zeros(minutes)
    for start in rng.choice(minutes - 30, size=6, replace=False):
        bursts[start:start + int(rng.integers(10, 30))] += rng.uniform(1.5, 5.0)
    load = swell * (1 + bursts) * np.exp(0.25 * rng.standard_normal(minutes))  # arbitrary units
    qps_per_minute = 6.0 * load
    util = np.clip(4.5 * load * np.exp(0.15 * rng.standard_normal(minutes)), 0, 100)
    pods = np.round(np.clip(22 * load * np.exp(0.1 * rng.standard_normal(minutes)), 0, None))
    qps = qps_per_minute.reshape(-1, 10).mean(axis=1)
    return (Series(values=qps, start=START, step_seconds=600),
            Series(values=util, start=START, step_seconds=60),
            Series(values=pods, start=START, step_seconds=60))

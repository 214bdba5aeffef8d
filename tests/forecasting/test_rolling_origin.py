"""protocol: the day-resampled intervals on the headline figures (paired origin by origin) and how
the served P95's calibration is described."""

from __future__ import annotations

import numpy as np
import pytest

from predictive_scaler.forecasting.baselines import PersistenceModel
from predictive_scaler.forecasting.calibration import CalibratedModel
from predictive_scaler.forecasting.combination import CombinationModel, Shift
from predictive_scaler.forecasting.rolling_origin import (
    INTERVAL_LEVEL,
    ProtocolReport,
    Scored,
    _Collector,
    describe_calibration,
    headline_intervals,
)

DAY = 48  # origins per day at one every 30 minutes on a 30-minute grid
Q = 0.95


def _collector(origins: np.ndarray, actual: np.ndarray, upper: np.ndarray) -> _Collector:
    c = _Collector([1])
    c.add(origins, actual[:, None], actual[:, None], upper[:, None])
    return c


def _week(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    origins = np.arange(7 * DAY)
    return origins, 100 + 10 * rng.standard_normal(origins.size)


def test_the_ratio_pairs_the_origins_both_sides_scored() -> None:
    origins, actual = _week()
    served = _collector(origins, actual, actual + 5)
    # The peer scored only the first four days, exactly as the served model did there: a tie,
    # however badly the served model did on the days the peer did not score.
    bad = np.where(origins >= 4 * DAY, actual + 500, actual + 5)
    served_bad = _collector(origins, actual, bad)
    peer = _collector(origins[: 4 * DAY], actual[: 4 * DAY], actual[: 4 * DAY] + 5)
    got = headline_intervals(served_bad, None, peer, 1, Q, DAY)
    assert got["ratio_to_best_peer"] == pytest.approx((1.0, 1.0)) and got["regret"] is None
    assert got["days"] == 7
    # Over the whole week against itself, regret is exactly one too.
    assert headline_intervals(served, served, None, 1, Q, DAY)["regret"] == pytest.approx((1.0, 1.0))


def test_missing_actuals_are_not_scored_and_coverage_counts_hits_per_day() -> None:
    origins, actual = _week(1)
    actual[:DAY] = np.nan  # day one unobserved: not a day of the interval
    covered = np.where(origins % 2 == 0, actual + 50, actual - 50)  # half the origins covered
    got = headline_intervals(_collector(origins, actual, covered), None, None, 1, Q, DAY)
    assert got["days"] == 6
    assert got["coverage"] == pytest.approx((0.5, 0.5))


def test_a_clearly_better_side_gets_an_interval_below_one() -> None:
    origins, actual = _week(2)
    served = _collector(origins, actual, actual + 3)
    peer = _collector(origins, actual, actual + 6 + np.abs(np.random.default_rng(3).normal(0, 1, origins.size)))
    lo, hi = headline_intervals(served, None, peer, 1, Q, DAY)["ratio_to_best_peer"]
    assert lo < hi < 1.0


def test_the_report_carries_the_intervals_and_their_level() -> None:
    blank = Scored("x", {"30m": {}})
    report = ProtocolReport("t", Q, 300, {}, 1, {}, blank, {},
                            intervals={"days": 7, "ratio_to_best_peer": (0.9, 1.1), "regret": None, "coverage": None})
    doc = report.to_dict()["intervals"]
    assert doc == {"level": INTERVAL_LEVEL, "days": 7, "ratio_to_best_peer": [0.9, 1.1], "regret": None,
                   "coverage": None}


def _calibrated(additive: bool, tracking: int, rate: float, root: bool = False) -> CalibratedModel:
    base = PersistenceModel(step_seconds=300, log_offset=1.0, spread=((0.0, 0.1),))
    return CalibratedModel(base=base, quantiles=(0.5, 0.95), offsets=((0.0,), (0.1,)), log_offset=1.0,
                           tracking_window=tracking, tracking_steps=((0.01,), (0.02,)) if tracking else (),
                           tracking_rate=rate, additive=additive, centred=root, root=root)


CALIBRATION_CASES = [
    ("additive-tracked", _calibrated(True, 288, 0.15), "additive shifts, tracked at 0.15"),
    ("root-tracked", _calibrated(True, 288, 0.05, root=True), "square-root shifts, tracked at 0.05"),
    ("log-static", _calibrated(False, 0, 0.0), "log-scale shifts, static"),
    ("combination-own-shift", CombinationModel(members=(_calibrated(False, 0, 0.0), _calibrated(True, 0, 0.0)),
                                               weights=(0.5, 0.5), shift=Shift(0.95, "additive", (0.1,))),
     "members calibrated, its own additive shift"),
    ("combination-none", CombinationModel(members=(_calibrated(False, 0, 0.0), _calibrated(False, 0, 0.0)),
                                          weights=(0.5, 0.5)),
     "members calibrated, no shift of its own"),
    ("uncalibrated", PersistenceModel(step_seconds=300, log_offset=1.0, spread=((0.0, 0.1),)), "uncalibrated"),
]


@pytest.mark.parametrize(("model", "words"), [c[1:] for c in CALIBRATION_CASES], ids=[c[0] for c in CALIBRATION_CASES])
def test_describe_calibration_names_scale_and_tracking(model: object, words: str) -> None:
    assert describe_calibration(model) == words

"""Fits shared within a training run (walkforward.memoized_fit): the shared path is the unshared one."""

from __future__ import annotations

import numpy as np
import pytest

from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting.walkforward import FIT_MEMO_SIZE, clear_fit_memo, walk_forward
from predictive_scaler.series import Series

from .conftest import make_daily

DAY = 288


@pytest.fixture(scope="module")
def history():
    return make_daily(days=9, seed=11)


def _forecasts(model, series):
    idx = np.arange(len(series) - 200, len(series), 9)
    return walk_forward(model, series, idx, 6, (0.5, 0.95))


@pytest.mark.parametrize(
    ("kind", "options", "days"),
    [("arima", {}, 9), ("holt-winters", {}, 9), ("holt-winters", {"season": 7 * 86400}, 15)],
    ids=["arima", "holt-winters", "holt-winters-weekly"],
)
def test_a_repeated_fit_is_the_first_one(kind, options, days):
    history = make_daily(days=days, seed=11)
    clear_fit_memo()
    first = registry.forecaster(kind, **options).fit(history)
    assert registry.forecaster(kind, **options).fit(history) is first
    clear_fit_memo()
    cold = registry.forecaster(kind, **options).fit(history)
    assert cold is not first
    assert cold.to_params() == first.to_params()


@pytest.mark.parametrize(
    ("kind", "change"),
    [
        ("arima", lambda s: s.slice(0, len(s) - 1)),  # one step less
        ("arima", lambda s: Series(values=np.where(np.arange(len(s)) == 5, s.values * 2, s.values),
                                   start=s.start, step_seconds=s.step_seconds)),  # one value changed
        ("holt-winters", lambda s: Series(values=s.values, start=s.start + s.step,
                                          step_seconds=s.step_seconds)),  # same values, a step later
    ],
    ids=["shorter", "one-value", "shifted"],
)
def test_another_history_is_fitted_anew(kind, change, history):
    clear_fit_memo()
    first = registry.forecaster(kind).fit(history)
    assert registry.forecaster(kind).fit(change(history)) is not first


def test_other_settings_are_fitted_anew(history):
    clear_fit_memo()
    daily = registry.forecaster("holt-winters").fit(history)
    assert registry.forecaster("holt-winters", window=4 * 86400).fit(history) is not daily
    assert registry.forecaster("arima", order=(2, 1, 1)).fit(history) is not registry.forecaster("arima").fit(history)


def test_the_memo_is_bounded(history):
    clear_fit_memo()
    first = registry.forecaster("persistence").fit(history)  # not memoized: cheap
    models = [registry.forecaster("holt-winters").fit(history.slice(i, len(history))) for i in range(FIT_MEMO_SIZE + 1)]
    assert registry.forecaster("holt-winters").fit(history) is not models[0]  # the oldest was dropped
    assert registry.forecaster("holt-winters").fit(history.slice(FIT_MEMO_SIZE, len(history))) is models[-1]
    assert first is not None


@pytest.mark.parametrize(
    "before",
    [(), ("arima",), ("holt-winters",), ("arima", "holt-winters", "persistence")],
    ids=["cold", "after-arima", "after-holt-winters", "after-candidates"],
)
def test_an_ensemble_sharing_the_candidates_fits_forecasts_as_a_cold_one(before, history):
    """The training run's order (candidates first, then the ensemble refitting the same kinds on
    the same window) gives the same ensemble as fitting it with nothing kept."""
    series = make_daily(days=10, seed=11)
    clear_fit_memo()
    cold = registry.forecaster("ensemble").fit(history)
    clear_fit_memo()
    for kind in before:
        registry.forecaster(kind).fit(history)
    shared = registry.forecaster("ensemble").fit(history)
    assert shared.to_params() == cold.to_params()
    np.testing.assert_array_equal(_forecasts(shared, series), _forecasts(cold, series))


# -- forecasts shared within one combined forecast (walkforward.shared_forecasts) ---------------

def _ensemble_and_its_member(kind, history):
    clear_fit_memo()
    single = registry.forecaster(kind).fit(history)
    ensemble = registry.forecaster("ensemble").fit(history)
    assert any(m == single for m in ensemble.members)  # the ensemble holds the candidate's own fit
    return single, ensemble


def _counted(monkeypatch, kind):
    from predictive_scaler.forecasting.arima import ArimaModel
    from predictive_scaler.forecasting.baselines import HoltWintersModel

    cls, name = {"arima": (ArimaModel, "_log_moments"), "holt-winters": (HoltWintersModel, "_log_point")}[kind]
    calls = []
    real = getattr(cls, name)
    monkeypatch.setattr(cls, name, lambda self, *a: calls.append(1) or real(self, *a))
    return calls


@pytest.mark.parametrize("kind", ["arima", "holt-winters"])
@pytest.mark.parametrize("origins", [np.array([-1]), np.arange(-150, 0, 7)], ids=["serving", "walk-forward"])
def test_a_combination_sharing_a_members_fit_forecasts_as_its_members_do_alone(kind, origins, history, monkeypatch):
    from predictive_scaler.forecasting.calibration import calibrate
    from predictive_scaler.forecasting.combination import CombinationModel, combine_quantiles

    series = make_daily(days=11, seed=11)
    single, ensemble = _ensemble_and_its_member(kind, history)
    members = tuple(calibrate(m, series.slice(0, 10 * DAY), 9 * DAY - 1, horizon_steps=6) for m in (ensemble, single))
    model = CombinationModel(members=members, weights=(0.4, 0.6))
    idx = len(series) + origins
    alone = np.stack([walk_forward(m, series, idx, 6, (0.5, 0.95)) for m in members])
    calls = _counted(monkeypatch, kind)
    got = walk_forward(model, series, idx, 6, (0.5, 0.95))
    np.testing.assert_array_equal(got, combine_quantiles(alone, np.array([0.4, 0.6])))
    assert len(calls) == 1  # the ensemble's fit and the member's: one pass over the window
    walk_forward(members[1], series, idx, 6, (0.5, 0.95))
    assert len(calls) == 2  # outside a combined forecast nothing is kept


@pytest.mark.parametrize(
    "other",
    [lambda s: s.slice(0, len(s)), lambda s: s.slice(0, len(s) - 1)],
    ids=["an-equal-copy-of-the-series", "another-series"],
)
def test_shared_work_is_keyed_on_the_series_object_and_origins(other):
    from predictive_scaler.forecasting.walkforward import shared, shared_forecasts

    series = make_daily(days=3, seed=2)
    runs = []
    with shared_forecasts():
        first = shared("model", series, np.array([5]), 6, lambda: runs.append(1) or "a")
        assert shared("model", series, np.array([5]), 6, lambda: "b") == first  # the same call: reused
        assert shared("model", series, np.array([6]), 6, lambda: "c") == "c"  # other origins
        assert shared("model", series, np.array([5]), 3, lambda: "d") == "d"  # another horizon
        assert shared("model", other(series), np.array([5]), 6, lambda: "e") == "e"
    assert runs == [1]


def test_shared_results_keep_the_latest_within_capacity_and_recompute_what_is_not_valid() -> None:
    from predictive_scaler.forecasting.walkforward import SharedResults

    kept: SharedResults[int] = SharedResults(2)
    calls: list[str] = []

    def make(key: str, value: int):
        return lambda: calls.append(key) or value

    assert kept.get("a", make("a", 1)) == 1
    assert kept.get("b", make("b", 2)) == 2
    assert kept.get("a", make("a", 99)) == 1  # kept, and now the most recent
    assert kept.get("c", make("c", 3)) == 3  # "b", the least recent, is forgotten
    assert kept.get("b", make("b", 20)) == 20
    assert kept.get("c", make("c", 30), valid=lambda v: v != 3) == 30  # refused: computed anew, kept
    assert kept.get("c", make("c", 300)) == 30
    assert calls == ["a", "b", "c", "b", "c"]
    kept.clear()
    assert kept.get("a", make("a", 5)) == 5


def test_a_failed_computation_is_not_kept() -> None:
    from predictive_scaler.forecasting.walkforward import SharedResults

    kept: SharedResults[int] = SharedResults(2)

    def boom() -> int:
        raise ValueError("no")

    with pytest.raises(ValueError):
        kept.get("a", boom)
    assert kept.get("a", lambda: 7) == 7

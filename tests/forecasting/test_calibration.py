from __future__ import annotations

import json

import numpy as np
import pytest

from predictive_scaler.errors import ModelError
from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting.calibration import (
    CalibratedModel,
    calibrate,
    conformal_quantile,
    track_shifts,
)
from predictive_scaler.forecasting.metrics import coverage, pinball
from predictive_scaler.forecasting.walkforward import walk_forward

from .conftest import make_daily

DAY = 288


@pytest.fixture(scope="module")
def series():
    return make_daily(days=12, seed=7)


@pytest.fixture(scope="module")
def base(series):
    return registry.forecaster("persistence").fit(series.slice(0, 4 * DAY))


@pytest.mark.parametrize("q", [0.5, 0.9, 0.95], ids=["p50", "p90", "p95"])
def test_conformal_quantile_covers_q_of_new_scores(q):
    rng = np.random.default_rng(0)
    offset = conformal_quantile(rng.standard_t(3, size=2000), q)
    assert np.mean(rng.standard_t(3, size=50000) <= offset) == pytest.approx(q, abs=0.02)


def test_conformal_quantile_refuses_too_few_scores():
    with pytest.raises(ModelError, match="calibration window"):
        conformal_quantile(np.array([1.0, 2.0, np.nan]), 0.95)


@pytest.mark.parametrize("squeeze", [0.2, 1.0, 3.0], ids=["too-narrow", "as-fitted", "too-wide"])
def test_calibration_fixes_a_mis_sized_spread(series, base, squeeze):
    """Whatever the base's spread, the calibrated P95 covers ~95 % of data after the calibration window."""
    params = base.to_params()
    params["spread"] = [[v * squeeze for v in row] for row in params["spread"]]
    skewed = registry.model_from_params("persistence", params)
    model = calibrate(skewed, series.slice(0, 8 * DAY), 4 * DAY - 1, horizon_steps=6)
    idx = np.arange(8 * DAY, len(series) - 6)
    fc = walk_forward(model, series, idx, 6, (0.5, 0.95))
    for h in (1, 5):
        assert coverage(series.values[idx + h + 1], fc[:, 1, h]) == pytest.approx(0.95, abs=0.03)


def test_calibration_never_reads_past_its_series(series, base):
    a = calibrate(base, series.slice(0, 8 * DAY), 4 * DAY - 1, horizon_steps=6)
    spoiled = series.values.copy()
    spoiled[8 * DAY:] = 1e6
    from predictive_scaler.series import Series

    other = Series(values=spoiled, start=series.start, step_seconds=300)
    b = calibrate(base, other.slice(0, 8 * DAY), 4 * DAY - 1, horizon_steps=6)
    assert a.offsets == b.offsets


def test_round_trip_nests_the_base_and_forecasts_identically(series, base):
    model = calibrate(base, series.slice(0, 8 * DAY), 4 * DAY - 1, horizon_steps=6)
    params = json.loads(json.dumps(model.to_params()))
    assert params["base_kind"] == "persistence"
    rebuilt = registry.model_from_params("calibrated", params)
    assert isinstance(rebuilt, CalibratedModel) and rebuilt.base_kind == "persistence"
    recent = series.slice(0, 9 * DAY)
    np.testing.assert_array_equal(
        model.forecast(recent, 12, (0.5, 0.9, 0.95)).values, rebuilt.forecast(recent, 12, (0.5, 0.9, 0.95)).values
    )
    fc = rebuilt.forecast(recent, 12, (0.5, 0.95))
    assert fc.model == "persistence+calibrated" and np.all(np.diff(fc.values, axis=0) >= 0)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: p.update(offsets=[[float("nan")] * 6] * len(p["quantiles"])),
        lambda p: p.update(base_kind="calibrated"),
        lambda p: p.update(base_kind="no-such-model"),
        lambda p: p.pop("base_params"),
        lambda p: p.update(offsets=p["offsets"][:1]),
    ],
    ids=["nan-offsets", "nested-calibrated", "unknown-base", "missing-base", "offset-count"],
)
def test_bad_calibration_params_are_refused(series, base, mutate):
    params = calibrate(base, series.slice(0, 8 * DAY), 4 * DAY - 1, horizon_steps=6).to_params()
    mutate(params)
    with pytest.raises(ModelError):
        registry.model_from_params("calibrated", params)


def test_adaptive_calibration_widens_in_volatile_hours():
    """Noise that switches between calm and wild every few hours: the adaptive P95 follows it."""
    from predictive_scaler.series import Series

    rng = np.random.default_rng(4)
    n = 12 * DAY
    wild = (np.arange(n) // 36) % 2 == 1  # 3 calm hours, 3 wild hours
    values = 100 * np.exp(rng.normal(0, np.where(wild, 0.4, 0.05)))
    series = Series(values=values, start=make_daily(days=1).start, step_seconds=300)
    base = registry.forecaster("persistence").fit(series.slice(0, 4 * DAY))
    idx = np.arange(9 * DAY, len(series) - 6)
    actual = series.values[idx + 3]
    result = {}
    for adaptive in (False, True):
        model = calibrate(base, series.slice(0, 8 * DAY), 4 * DAY - 1, horizon_steps=6, adaptive=adaptive,
                          tracking_rate=0.0)  # against plain static conformal shifts
        p95 = walk_forward(model, series, idx, 6, (0.5, 0.95))[:, 1, 2]
        deep_in_wild = wild[idx] & wild[idx - 12]
        deep_in_calm = ~wild[idx] & ~wild[idx - 12]
        result[adaptive] = (np.median(p95[deep_in_wild]) / np.median(p95[deep_in_calm]),
                            pinball(actual, p95, 0.95), coverage(actual, p95))
    assert result[True][0] > 1.5 * result[False][0]  # the interval tracks the regime
    assert result[True][1] < result[False][1]  # and pays off in pinball loss
    assert result[True][2] == pytest.approx(0.95, abs=0.03)


@pytest.mark.parametrize(("h_max", "window", "gaps", "median_tracked"), [
    pytest.param(6, 288, 0.0, False, id="serving-p50-p95"),
    pytest.param(6, 288, 0.2, False, id="with-gaps"),
    pytest.param(1, 50, 0.0, True, id="one-step-every-lane-tracked"),
    pytest.param(6, 400, 0.1, True, id="window-longer-than-the-scores-before-the-origin"),
])
def test_serving_tracker_replays_exactly_what_the_batch_tracker_does(h_max, window, gaps, median_tracked):
    """One or two origins (serving) take the plain-Python path, three or more the numpy one:
    the shifts are the same numbers, NaN scores and unobserved targets skipped alike."""
    rng = np.random.default_rng(11)
    scores = rng.normal(0.0, 0.3, (600, 2, h_max))
    scores[rng.random(scores.shape) < gaps] = np.nan
    static = rng.normal(0.0, 0.1, (2, h_max))
    eta = rng.uniform(0.001, 0.05, (2, h_max))
    if not median_tracked:
        eta[0] = 0.0  # the median is not tracked
    quantiles = np.array([0.5, 0.95])
    first = np.array([3, 150, 599])
    batch = track_shifts(scores, first, static, eta, quantiles, window)
    assert not np.allclose(batch[2], static)  # the tracker moved: the comparison is not vacuous
    for i in range(first.size):
        np.testing.assert_array_equal(track_shifts(scores, first[[i]], static, eta, quantiles, window), batch[[i]])
    np.testing.assert_array_equal(track_shifts(scores, first[:2], static, eta, quantiles, window), batch[:2])


@pytest.mark.parametrize("spacing", [1, 3], ids=["consecutive", "every-third"])
@pytest.mark.parametrize("per_origin", [False, True], ids=["one-step-per-lane", "a-step-per-origin"])
@pytest.mark.parametrize(("start", "count", "window"), [
    pytest.param(0, 300, 288, id="origins-before-a-whole-window"),
    pytest.param(350, 250, 288, id="every-origin-has-its-window"),
    pytest.param(10, 50, 4, id="window-shorter-than-the-horizon"),
])
def test_evenly_spaced_origins_replay_exactly_what_each_origin_alone_does(start, count, window, per_origin,
                                                                           spacing):
    """Calibration, scoring and the tracking rate's choice ask for evenly spaced origins, which take
    a path of their own (one strided slice per replayed step): the shifts are the same numbers as
    each origin's own replay."""
    rng = np.random.default_rng(5)
    h_max = 6
    first = start + spacing * np.arange(count)
    scores = rng.normal(0.0, 0.3, (int(first[-1]) + 50, 2, h_max))
    scores[rng.random(scores.shape) < 0.15] = np.nan
    static = rng.normal(0.0, 0.1, (2, h_max))
    quantiles = np.array([0.5, 0.95])
    eta = rng.uniform(0.001, 0.05, (count, 2, h_max) if per_origin else (2, h_max))
    batch = track_shifts(scores, first, static, eta, quantiles, window)
    assert not np.allclose(batch[-1], static)  # the tracker moved
    for i in range(count):
        alone = track_shifts(scores, first[[i]], static, eta[[i]] if per_origin else eta, quantiles, window)
        np.testing.assert_array_equal(alone, batch[[i]])


@pytest.mark.parametrize("shift", [pytest.param(2.5, id="noise-widens"), pytest.param(0.4, id="noise-narrows")])
def test_tracking_holds_coverage_when_the_regime_moves_after_calibration(shift):
    """Noise whose scale changes right after the calibration window: static shifts miss the
    target coverage, the tracked ones come back to it and lose less pinball."""
    from predictive_scaler.series import Series

    rng = np.random.default_rng(7)
    n = 14 * DAY
    sigma = np.where(np.arange(n) < 8 * DAY, 0.1, 0.1 * shift)
    values = 100 * np.exp(rng.normal(0, sigma))
    series = Series(values=values, start=make_daily(days=1).start, step_seconds=300)
    base = registry.forecaster("persistence").fit(series.slice(0, 4 * DAY))
    idx = np.arange(10 * DAY, len(series) - 6)
    actual = series.values[idx + 3]
    got = {}
    for rate in (0.0, 0.15):
        model = calibrate(base, series.slice(0, 8 * DAY), 4 * DAY - 1, horizon_steps=6, tracking_rate=rate)
        assert model.tracking == (rate > 0)
        p95 = walk_forward(model, series, idx, 6, (0.5, 0.95))[:, 1, 2]
        got[rate] = (coverage(actual, p95), pinball(actual, p95, 0.95))
    assert abs(got[0.0][0] - 0.95) > 0.03
    assert got[0.15][0] == pytest.approx(0.95, abs=0.02)
    assert got[0.15][1] < got[0.0][1]
    # Serving computes the same forecast from the recent window alone.
    model = calibrate(base, series.slice(0, 8 * DAY), 4 * DAY - 1, horizon_steps=6, tracking_rate=0.15)
    t = int(idx[100])
    recent = series.slice(t + 1 - model.window_steps, t + 1)
    one = model.forecast(recent, 6, (0.5, 0.95)).values
    many = walk_forward(model, series.slice(t + 1 - model.window_steps, t + 1), np.array([model.window_steps - 1]),
                        6, (0.5, 0.95))[0]
    np.testing.assert_allclose(one, many)


def test_calibrating_one_model_twice_on_one_window_forecasts_once(series, base, monkeypatch):
    """A training run calibrates each candidate on the log scale and in demand units on the same window:
    the base forecasts are computed once and are the same numbers either way; other data is forecast anew."""
    from predictive_scaler.forecasting import calibration
    from predictive_scaler.forecasting.walkforward import SharedResults

    monkeypatch.setattr(calibration, "_BASE_FORECASTS", SharedResults(4))  # what earlier tests kept is not ours
    calls = []
    real = calibration.walk_forward
    monkeypatch.setattr(calibration, "walk_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    window = series.slice(0, 8 * DAY)
    log = calibrate(base, window, 4 * DAY - 1, horizon_steps=6)
    additive = calibrate(base, window, 4 * DAY - 1, horizon_steps=6, additive=True)
    assert len(calls) == 1 and additive.additive and not log.additive
    calibration._BASE_FORECASTS.clear()  # nothing kept: computed again, the same model
    assert calibrate(base, window, 4 * DAY - 1, horizon_steps=6, additive=True).to_params() == additive.to_params()
    calibrate(base, series.slice(0, 9 * DAY), 4 * DAY - 1, horizon_steps=6)  # other data: not shared
    assert len(calls) == 3


@pytest.mark.parametrize("gaps", ["none", "some", "a column of gaps", "infinities", "one number", "two numbers"])
def test_interquartile_ranges_are_column_by_column_nanpercentile(gaps: str) -> None:
    import warnings

    from predictive_scaler.forecasting.calibration import interquartile_ranges

    rng = np.random.default_rng(7)
    scores = rng.standard_normal((301, 6)) * np.arange(1, 7)
    if gaps == "some":
        scores[rng.random(scores.shape) < 0.1] = np.nan
    elif gaps == "a column of gaps":
        scores[:, 2] = np.nan
        scores[::7, 4] = np.nan
    elif gaps == "infinities":
        scores[3, 1] = np.inf
        scores[5, 1] = np.nan
        scores[:, 3] = -np.inf
    elif gaps in ("one number", "two numbers"):
        scores[1 if gaps == "one number" else 2:, 0] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = [float(np.subtract(*np.nanpercentile(scores[:, h], [75, 25]))) for h in range(6)]
    got = interquartile_ranges(scores)
    np.testing.assert_array_equal(got, np.asarray(expected))


def test_a_tracked_model_with_no_observation_in_its_window_gives_no_forecast_not_zero(series):
    """NaN from the tracked walk-forward (a window with no observation) is a refusal, as from any
    walk-forward model: a Forecast would have read it as zero demand."""
    base = registry.forecaster("persistence").fit(series.slice(0, 4 * DAY))
    model = calibrate(base, series.slice(0, 8 * DAY), 4 * DAY - 1, horizon_steps=6)
    assert model.tracking
    outage = np.full(model.window_steps + 1, np.nan)  # longer than all the model reads
    blind = type(series)(np.concatenate([series.values[:8 * DAY], outage]), series.start, series.step_seconds)
    with pytest.raises(ModelError, match="too few observations"):
        model.forecast(blind, 6, (0.5, 0.95))
    assert np.all(model.forecast(series.slice(0, 9 * DAY), 6, (0.5, 0.95)).values > 0)



def _additive_noise_series():
    """A daily cycle from 20 to 380 with noise of the same size at every level: the shape of
    count-like traffic's errors, which a log-scale spread (proportional to the level) is not."""
    from predictive_scaler.series import Series

    rng = np.random.default_rng(11)
    n = 10 * DAY
    level = 200 + 180 * np.sin(2 * np.pi * np.arange(n) / DAY)
    return Series(values=np.maximum(level + rng.normal(0, 15, n), 0.0), start=make_daily(days=1).start,
                  step_seconds=300)


@pytest.mark.parametrize("shape", ["root", "demand"])
def test_additive_shifts_centred_on_the_median_do_not_scale_the_band_with_the_level(monkeypatch, shape):
    from predictive_scaler.forecasting import calibration

    monkeypatch.setattr(calibration, "ADDITIVE_SHAPE", shape)
    series = _additive_noise_series()
    base = registry.forecaster("persistence").fit(series.slice(0, 4 * DAY))
    model = calibrate(base, series.slice(0, 8 * DAY), 4 * DAY - 1, horizon_steps=6, additive=True,
                      tracking_rate=0.0)
    assert model.additive and model.centred and model.root == (shape == "root")
    idx = np.arange(8 * DAY, len(series) - 6)
    fc = walk_forward(model, series, idx, 6, (0.5, 0.95))
    width = fc[:, 1, 0] - fc[:, 0, 0]
    low, high = series.values[idx] < 100, series.values[idx] > 300
    if shape == "demand":  # median + one shift per step: the same width at 20 and at 380 requests
        np.testing.assert_allclose(width, width[0], rtol=1e-9)
    else:  # (√median + shift)²: wider by less than the level's ratio
        assert 1.0 < np.median(width[high]) / np.median(width[low]) < 0.5 * np.median(
            series.values[idx][high]) / np.median(series.values[idx][low])
    monkeypatch.setattr(calibration, "ADDITIVE_SHAPE", "quantile")
    old = calibrate(base, series.slice(0, 8 * DAY), 4 * DAY - 1, horizon_steps=6, additive=True,
                    tracking_rate=0.0)
    assert not (old.centred or old.root)
    old_fc = walk_forward(old, series, idx, 6, (0.5, 0.95))
    old_width = old_fc[:, 1, 0] - old_fc[:, 0, 0]
    assert np.median(old_width[high]) > 2 * np.median(old_width[low])  # it scaled with the level
    actual = series.values[idx + 1]
    assert pinball(actual, fc[:, 1, 0], 0.95) < pinball(actual, old_fc[:, 1, 0], 0.95)


def test_a_tracked_root_model_serves_what_its_batch_path_gives():
    series = _additive_noise_series()
    base = registry.forecaster("persistence").fit(series.slice(0, 4 * DAY))
    model = calibrate(base, series.slice(0, 8 * DAY), 4 * DAY - 1, horizon_steps=6, additive=True,
                      tracking_rate=0.15)
    assert model.tracking and model.root
    t = 9 * DAY
    recent = series.slice(t + 1 - model.window_steps, t + 1)
    one = model.forecast(recent, 6, (0.5, 0.95)).values
    many = walk_forward(model, series, np.array([t]), 6, (0.5, 0.95))[0]
    np.testing.assert_allclose(one, many)
    rebuilt = registry.model_from_params("calibrated", json.loads(json.dumps(model.to_params())))
    np.testing.assert_array_equal(rebuilt.forecast(recent, 6, (0.5, 0.95)).values, one)


def test_an_additive_artifact_written_before_centring_still_shifts_the_base_quantile():
    series = _additive_noise_series()
    base = registry.forecaster("persistence").fit(series.slice(0, 4 * DAY))
    params = calibrate(base, series.slice(0, 8 * DAY), 4 * DAY - 1, horizon_steps=6, additive=True,
                       tracking_rate=0.0).to_params()
    assert params.pop("centred") is True and params.pop("root") is True
    old = registry.model_from_params("calibrated", params)
    assert old.additive and not old.centred and not old.root
    recent = series.slice(0, 9 * DAY)
    raw = base.forecast(recent, 6, (0.5, 0.95)).values
    got = old.forecast(recent, 6, (0.5, 0.95)).values
    np.testing.assert_allclose(got[1], np.maximum(raw[1] + np.asarray(old.offsets[old.quantiles.index(0.95)]), 0))


@pytest.mark.parametrize("mutate", [
    lambda p: p.update(centred="yes"),
    lambda p: p.update(root=1),
    lambda p: p.update(additive=False),
    lambda p: p.pop("centred"),
], ids=["centred-not-bool", "root-not-bool", "root-on-log-scale", "root-not-centred"])
def test_a_centred_or_root_shape_without_its_additive_calibration_is_refused(mutate):
    series = _additive_noise_series()
    base = registry.forecaster("persistence").fit(series.slice(0, 4 * DAY))
    params = calibrate(base, series.slice(0, 8 * DAY), 4 * DAY - 1, horizon_steps=6, additive=True,
                       tracking_rate=0.0).to_params()
    mutate(params)
    with pytest.raises(ModelError, match="centred|root"):
        registry.model_from_params("calibrated", params)

"""Robust selection: the cross-fitted winner serves only when a paired test on the calibration
window tells it from the robust candidate; recency-weighted conformal shifts; the variants grid."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

from predictive_scaler.errors import ModelError
from predictive_scaler.forecasting import defaults, registry
from predictive_scaler.forecasting.baselines import PersistenceModel
from predictive_scaler.forecasting.calibration import (
    conformal_quantile,
    recency_weights,
    weighted_conformal_quantile,
)
from predictive_scaler.forecasting.evaluation import EvaluationSettings
from predictive_scaler.forecasting.logscale import RESIDUAL_GRID
from predictive_scaler.forecasting.selection import (
    TrainedCandidates,
    paired_block_test,
    robust_choice,
    settings_for_history,
    train_candidates,
)

from .conftest import make_daily


def test_a_clear_gain_is_told_apart_and_noise_is_not():
    rng = np.random.default_rng(0)
    other = 1.0 + 0.3 * rng.random(2016)
    assert paired_block_test(other * 0.8, other, 72)[0]  # 20 % less everywhere
    same = other + 0.2 * rng.standard_normal(other.size)  # no gain, only noise
    assert not paired_block_test(same, other, 72)[0]
    # Fewer than three blocks cannot tell anything apart.
    assert not paired_block_test(other[:100] * 0.5, other[:100], 72)[0]


def test_missing_origins_are_dropped_on_both_sides():
    other = np.ones(600)
    winner = np.full(600, 0.5)
    winner[::3] = np.nan
    apart, rel, _ = paired_block_test(winner, other, 50)
    assert apart and rel == pytest.approx(-0.5)


def _trained(losses: dict[str, np.ndarray]) -> TrainedCandidates:
    model = PersistenceModel(step_seconds=300, log_offset=1.0, spread=((0.0,) * len(RESIDUAL_GRID),))
    return TrainedCandidates(models=dict.fromkeys(losses, model), scores={}, fit_seconds={}, selected=None,
                             losses=losses)


def test_the_robust_candidate_serves_unless_the_winner_is_better_beyond_the_test():
    rng = np.random.default_rng(1)
    base = 1.0 + rng.random(2016)
    close = _trained({"ets": base, "arima": base - 0.001 + 0.3 * rng.standard_normal(base.size)})
    assert robust_choice(close, "ets", 300)[0] == "ets"
    clear = _trained({"ets": base, "arima": base * 0.7})
    kind, reason = robust_choice(clear, "ets", 300)
    assert kind == "arima" and "beyond the paired test" in reason
    # The robust candidate could not be fitted: the winner serves.
    assert robust_choice(_trained({"arima": base}), "ets", 300)[0] == "arima"
    # Restricted to some kinds.
    assert robust_choice(clear, "ets", 300, kinds=("ets",))[0] == "ets"


def test_robust_training_fits_each_candidate_once_and_serves_one_model():
    grid = make_daily(days=9, seed=4)
    cfg = settings_for_history(grid.span).with_variant(defaults.variant("robust-ets"))
    trained = train_candidates(grid, ("persistence", "ets", "holt-winters"), cfg)
    assert trained.selected in {"persistence", "ets", "holt-winters"} and trained.reason
    # The combination is scored as one more candidate, but this variant may not serve it.
    assert set(trained.losses or {}) == set(trained.models)
    assert set(trained.models) - {"combination"} == {"persistence", "ets", "holt-winters"}
    sizes = {v.size for v in (trained.losses or {}).values()}
    assert len(sizes) == 1  # the same cross-fitted origins for every candidate


def test_the_combined_variant_may_serve_the_combination_only_beyond_the_test():
    grid = make_daily(days=9, seed=4)
    cfg = settings_for_history(grid.span).with_variant(defaults.variant("robust-ets-combined"))
    assert cfg.robust_combination
    trained = train_candidates(grid, ("persistence", "ets", "holt-winters"), cfg)
    if trained.selected == "combination":
        assert "beyond the paired test" in trained.reason and trained.combination is not None


def test_equal_weights_give_the_plain_conformal_quantile():
    scores = np.random.default_rng(2).standard_normal(500)
    for q in (0.5, 0.9, 0.95):
        assert weighted_conformal_quantile(scores, q, np.ones(scores.size)) == conformal_quantile(scores, q)


def test_recency_weights_follow_a_level_change():
    """Scores that jumped in the last day of the window: the weighted quantile follows them."""
    old = np.zeros(1728)
    new = np.full(288, 1.0)
    scores = np.concatenate([old, new])
    origins = np.arange(scores.size)
    plain = conformal_quantile(scores, 0.95)
    recent = weighted_conformal_quantile(scores, 0.95, recency_weights(origins, 300, 12 * 3600))
    assert plain == 1.0 or plain == 0.0
    assert recent == 1.0
    assert recency_weights(np.array([0, 144, 288]), 300, 12 * 3600) == pytest.approx([0.25, 0.5, 1.0])
    with pytest.raises(ModelError):
        weighted_conformal_quantile(scores[:10], 0.95, np.ones(10))


def test_variants_are_fixed_named_and_hold_known_candidates():
    names = [v.name for v in defaults.VARIANTS]
    assert len(names) == len(set(names)) and defaults.DEFAULT_VARIANT.name in names
    for v in defaults.VARIANTS:
        assert set(v.candidates) <= set(registry.FORECASTER_KINDS)
        assert v.selection in {"combination", "robust"}
        assert v.robust_kind in v.candidates
    assert registry.DEFAULT_CANDIDATES == defaults.DEFAULT_VARIANT.candidates
    with pytest.raises(KeyError):
        defaults.variant("nope")


def test_settings_carry_a_variant():
    v = defaults.variant("robust-ets-recent")
    cfg = EvaluationSettings().with_variant(v)
    assert cfg.selection == "robust" and cfg.robust_kind == "ets"
    assert cfg.recency_half_life == timedelta(hours=24) and cfg.half_life_seconds == 86400
    assert 0.0 not in cfg.tracking_rates


def test_the_protocol_scores_variants_on_the_served_origins_and_keeps_their_records(monkeypatch):
    from predictive_scaler.forecasting.rolling_origin import ProtocolSettings, run_protocol

    cheap = ("persistence", "ets")  # the real grid's variants train all nine candidates: slow here
    monkeypatch.setattr(defaults, "VARIANTS", (
        defaults.Variant("robust-ets", cheap, selection="robust", robust_kind="ets"),
        defaults.Variant("robust-persistence", cheap, selection="robust", robust_kind="persistence",
                         tracking_rates=(0.05,), half_life_hours=24.0)))
    series = make_daily(days=10, seed=6)
    report = run_protocol(series, cheap,
                          ProtocolSettings(peers=(), variants=("robust-ets", "robust-persistence"), keep_origins=True))
    assert set(report.variants) == {"robust-ets", "robust-persistence"}
    for name, scored in report.variants.items():
        assert scored.origins == report.served.origins and len(scored.choices) == report.blocks
        ids, loss, hit, actual = report.origins[f"variant:{name}"]
        assert len(ids) == len(loss) == len(hit) == len(actual) > 0
        assert set(hit) <= {0.0, 1.0}
    assert report.to_dict()["variants"]["robust-ets"]["choices"]
    served_ids = report.origins["served"][0]
    assert report.origins["variant:robust-ets"][0] == served_ids


def test_the_tracker_moves_after_a_flat_calibration_window():
    """A stream idle through fit and calibration, then busy: the calibration scores have no spread,
    so a tracker stepping in their IQR never moves; the floor at the recent volatility lets it."""
    from dataclasses import replace as dc_replace

    from predictive_scaler.forecasting.calibration import TRACKING_FLOOR_SHARE, calibrate
    from predictive_scaler.forecasting.metrics import coverage
    from predictive_scaler.forecasting.walkforward import walk_forward
    from predictive_scaler.series import Series

    day = 288
    busy = make_daily(days=3, seed=9, noise=0.3).values * 300
    values = np.concatenate([np.zeros(7 * day), busy])
    series = Series(values=values, start=make_daily(days=1).start, step_seconds=300, name="idle-then-busy")
    base = registry.forecaster("persistence").fit(series.slice(0, 5 * day))
    model = calibrate(base, series.slice(0, 7 * day), 5 * day - 1, tracking_rate=0.15)
    assert model.tracking and model.tracking_floor == TRACKING_FLOOR_SHARE
    assert all(v == 0 for row in model.tracking_steps for v in row)  # the flat window's IQR
    idx = np.arange(8 * day, 10 * day - 7)
    actual = series.values[idx + 6]
    with_floor = coverage(actual, walk_forward(model, series, idx, 6, (0.95,))[:, 0, 5]) or 0.0
    without = coverage(actual, walk_forward(dc_replace(model, tracking_floor=0.0), series, idx, 6,
                                            (0.95,))[:, 0, 5]) or 0.0
    assert without < 0.7 and with_floor > without + 0.2
    # Serving one origin gives what the batch gives.
    one = model.forecast(series.slice(0, int(idx[10]) + 1), 6, (0.95,)).values[0, 5]
    assert one == pytest.approx(walk_forward(model, series, idx[10:11], 6, (0.95,))[0, 0, 5], rel=1e-9)

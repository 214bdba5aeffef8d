"""Rolling-origin evaluation, model selection, train_model and the promotion rule."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest

from predictive_scaler.errors import ConfigError, InsufficientHistoryError
from predictive_scaler.forecasting import registry, selection
from predictive_scaler.forecasting.combination import ONLINE_RATE, OnlineWeights
from predictive_scaler.forecasting.evaluation import (
    EvaluationSettings,
    ModelEvaluation,
    evaluate,
    horizon_steps,
    model_series,
    plan_blocks,
    select,
    select_on_common_blocks,
)
from predictive_scaler.forecasting.selection import (
    SELECTION_METHOD,
    SHORT_REFIT,
    SHORT_SELECTION_METHOD,
    SHORT_TRACKING_RATES,
    _combination,
    combination_pool,
    planned_training_fits,
    promote,
    settings_for_history,
    train_candidates,
    train_model,
)
from predictive_scaler.series import Series

from .conftest import make_daily

FAST = ("persistence", "seasonal-naive")


@pytest.fixture(scope="module")
def series():
    return make_daily(days=17, seed=11)


@pytest.fixture(scope="module")
def report(series):
    return evaluate(series, FAST, EvaluationSettings())


def test_blocks_fit_before_calibration_before_scoring(series):
    blocks = plan_blocks(series, EvaluationSettings())
    assert blocks[0].start == 14 * 288
    for b in blocks:
        assert b.fit_start < b.fit_end < b.start < b.end <= len(series)
        assert (b.start - b.fit_end) * 300 == 7 * 86400  # the calibration window: a week


def test_too_short_for_evaluation_says_how_much(series):
    with pytest.raises(InsufficientHistoryError, match=r"insufficient history: 10\.0 days < 14 days"):
        evaluate(series.slice(0, 10 * 288), FAST)


def test_report_has_every_model_horizon_and_metric(report):
    doc = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert doc["quantile"] == 0.95 and doc["selected"] in FAST
    for name in FAST:
        assert set(doc["models"][name]["horizons"]) == {"10m", "20m", "30m"}
        row = doc["models"][name]["horizons"]["30m"]
        assert set(row) == {"mae", "wape", "mape", "mase", "pinball", "normalised_pinball", "coverage"}
        assert all(isinstance(v, float) and math.isfinite(v) for v in row.values())
        assert 0.85 < row["coverage"] < 1.0


def test_coarse_trace_keeps_its_step_and_undefined_horizons_are_null():
    coarse = make_daily(days=17, step_seconds=1800, seed=2)
    assert model_series(coarse).step_seconds == 1800
    assert horizon_steps(timedelta(minutes=10), 1800) is None
    rep = evaluate(coarse, ("persistence",), EvaluationSettings(horizons=(timedelta(minutes=10), timedelta(minutes=30))))
    rows = rep.models["persistence"].horizons
    assert all(v is None for v in rows["10m"].values())
    assert rows["30m"]["pinball"] is not None
    assert rep.notes and "10m" in rep.notes[0]


def test_a_failing_model_is_reported_not_fatal(series, monkeypatch):
    real = registry.forecaster

    def fake(kind, **options):
        if kind == "seasonal-naive":
            raise ImportError("No module named 'fake_dependency'")
        return real(kind, **options)

    monkeypatch.setattr(registry, "forecaster", fake)
    rep = evaluate(series, FAST)
    assert rep.selected == "persistence"
    assert "not available" in (rep.models["seasonal-naive"].error or "")
    assert "error" in rep.to_dict()["models"]["seasonal-naive"]


def _scored(pinball: float, coverage: float, error: str | None = None) -> ModelEvaluation:
    row = {"mae": 1.0, "wape": 0.1, "mape": 0.1, "mase": 1.0, "pinball": pinball, "coverage": coverage}
    return ModelEvaluation("x", {"30m": row}, 0.1, 100, error)


@pytest.mark.parametrize(
    ("days", "short"),
    [(7, True), (17, False)],
    ids=["7-day history (2-day calibration): walk-forward choice, static shifts", "17-day history: cross-fitted"],
)
def test_short_history_is_chosen_walk_forward_and_calibrated_statically(days, short):
    history = make_daily(days=days, seed=5)
    cfg = settings_for_history(history.span)
    result = train_model(history, FAST, settings=cfg)
    assert result.metrics["selection"] == (SHORT_SELECTION_METHOD if short else SELECTION_METHOD)
    if short:
        walk = evaluate(history, FAST, replace(cfg, refit_every=SHORT_REFIT, tracked_calibration=False))
        assert walk.blocks > 1  # more than one validation window
        assert all(len(m.block_pinball) == walk.blocks for m in walk.models.values())
        assert result.kind == select_on_common_blocks(walk.models)
        assert result.model.tracking_rate in SHORT_TRACKING_RATES
        # The protocol's call fits every candidate (for the regret), the served one identically.
        every = train_candidates(model_series(history), FAST, cfg)
        assert set(every.models) == set(FAST) and every.selected == result.kind
        recent = history.tail(result.model.window_steps)
        np.testing.assert_allclose(every.models[result.kind].forecast(recent, 6, (0.5, 0.95)).values,
                                   result.model.forecast(recent, 6, (0.5, 0.95)).values)


class _Counter:
    def __init__(self) -> None:
        self.n = 0

    def update(self, n: int = 1) -> None:
        self.n += n


@pytest.mark.parametrize("days", [7, 17], ids=["short history: daily walk-forward blocks", "long history: one per kind"])
def test_train_progress_total_matches_the_updates(days):
    # The `train` bar's total: it undercounted the short-history path's daily refits.
    history = make_daily(days=days, seed=7)
    cfg = settings_for_history(history.span)
    counter = _Counter()
    train_model(history, FAST, settings=cfg, progress=counter)
    assert counter.n == planned_training_fits(history, FAST, cfg)
    assert counter.n > len(FAST) if days == 7 else counter.n == len(FAST)


@pytest.mark.parametrize(
    ("models", "expected"),
    [
        ({"a": _scored(1.0, 0.95), "b": _scored(2.0, 0.95)}, "a"),
        ({"a": _scored(1.0, 0.80), "b": _scored(2.0, 0.95)}, "b"),  # the guard rejects a
        ({"a": _scored(1.0, 0.80), "b": _scored(2.0, 0.90)}, "b"),  # none pass: closest coverage
        ({"a": _scored(1.0, 0.95, error="boom"), "b": _scored(2.0, 0.95)}, "b"),
        ({"a": _scored(1.0, 0.95, error="boom")}, None),
    ],
    ids=["best-pinball", "coverage-guard", "closest-coverage", "skip-failed", "none"],
)
def test_select(models, expected):
    assert select(models, 0.95) == expected


def _blocks(coverage: float, *pinballs: float | None, error: str | None = None) -> ModelEvaluation:
    scored = [p for p in pinballs if p is not None]
    row = {"pinball": float(np.mean(scored)) if scored else None, "coverage": coverage}
    return ModelEvaluation("x", {"30m": row}, 0.1, 100, error, block_pinball=tuple(pinballs))


@pytest.mark.parametrize(
    ("models", "expected", "old"),
    [
        # servegen_m_large's walk-forward: seasonal-naive alone passed the coverage guard and
        # served at 4.8x arima's loss on the following week; pinball alone picks arima.
        ({"arima": _blocks(0.90, 1.0, 1.0), "seasonal-naive": _blocks(0.95, 1.6, 1.5)}, "arima", "seasonal-naive"),
        # Holt-Winters cannot fit the first (shortest) block: compared on the blocks both have,
        # not on persistence's easy first block.
        ({"persistence": _blocks(0.95, 0.2, 1.2, 1.2), "holt-winters": _blocks(0.95, None, 1.0, 1.0)},
         "holt-winters", "persistence"),
        ({"a": _blocks(0.95, 1.0, 1.0), "b": _blocks(0.95, 0.5, 0.5, error="boom")}, "a", "a"),
        ({"a": _blocks(0.95, 1.0, None), "b": _blocks(0.95, None, 0.5)}, "b", "b"),  # nothing in common
        ({"a": _blocks(0.95, None, None)}, None, None),
    ],
    ids=["no-coverage-guard", "common-blocks-only", "skip-failed", "no-common-block", "never-scored"],
)
def test_select_on_common_blocks(models, expected, old):
    assert select_on_common_blocks(models) == expected
    assert select(models, 0.95) == old  # what the walk-forward choice did before


def _seven_days(seed: int, calm: bool) -> Series:
    """7 days of 5-minute demand; unless ``calm``, the noise triples from day 4 on (the scored
    days of the walk-forward: a regime the calibration windows never saw)."""
    quiet = make_daily(days=7, seed=seed, noise=0.1)
    if calm:
        return quiet
    loud = make_daily(days=7, seed=seed + 100, noise=0.3)
    cut = 4 * 288
    values = np.concatenate([quiet.values[:cut], loud.values[cut:]])
    return Series(values=values, start=quiet.start, step_seconds=300, name="synthetic")


@pytest.mark.parametrize(
    ("seed", "calm", "fast"),
    [(0, True, False), (2, True, False), (0, False, True), (2, False, True)],
    ids=["calm-0: slowest tracker", "calm-2: slowest tracker", "volatility-triples-0: faster tracker",
         "volatility-triples-2: faster tracker"],
)
def test_short_history_always_tracks_coverage_faster_where_it_pays_on_the_daily_blocks(seed, calm, fast):
    """Calm blocks would score static shifts best, but three days cannot rule out the regime
    change the tracker is for: the slowest tracker serves there, a faster one where the noise
    triples in the scored days."""
    history = _seven_days(seed, calm)
    cfg = settings_for_history(history.span)
    result = train_model(history, FAST, settings=cfg)
    assert result.kind == "persistence"
    slowest = min(r for r in SHORT_TRACKING_RATES if r > 0)
    assert result.model.tracking and result.model.tracking_rate in SHORT_TRACKING_RATES
    assert (result.model.tracking_rate > slowest) is fast


def test_short_history_beats_the_coverage_guard_on_a_regime_change():
    """The old walk-forward rule served seasonal-naive here: the only candidate whose coverage
    stayed near 0.95 when the noise tripled, at about twice persistence's pinball loss."""
    history = _seven_days(1, calm=False)
    cfg = settings_for_history(history.span)
    walk = evaluate(history, FAST, replace(cfg, refit_every=SHORT_REFIT, tracked_calibration=False))
    assert select(walk.models, cfg.quantile) == "seasonal-naive"  # the old rule
    pins = {k: m.block_pinball for k, m in walk.models.items()}
    assert all(p < s for p, s in zip(pins["persistence"], pins["seasonal-naive"], strict=True))
    assert train_model(history, FAST, settings=cfg).kind == "persistence"


def test_a_calibration_is_not_chosen_on_one_block(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("chose a calibration on a single block")

    monkeypatch.setattr(selection, "evaluate_model", boom)
    one = ModelEvaluation("holt-winters", {}, 0.1, 100, block_pinball=(None, 1.0))
    history = make_daily(days=7, seed=3)
    cfg = replace(settings_for_history(history.span), refit_every=SHORT_REFIT, tracked_calibration=False)
    assert selection._short_calibration(history, "holt-winters", cfg, one, None) == (0.0, False)


@pytest.mark.parametrize(
    ("challenger", "serving", "expected", "why"),
    [
        ({"pinball": 1.0, "coverage": 0.95}, {"pinball": 1.2, "coverage": 0.95}, True, "not worse"),
        ({"pinball": 1.01, "coverage": 0.95}, {"pinball": 1.0, "coverage": 0.95}, True, "not worse"),
        ({"pinball": 1.2, "coverage": 0.95}, {"pinball": 1.0, "coverage": 0.95}, False, "pinball"),
        ({"pinball": 0.9, "coverage": 0.90}, {"pinball": 1.0, "coverage": 0.95}, False, "coverage"),
        ({"pinball": 1.0, "coverage": 0.96}, {"pinball": 1.0, "coverage": 0.88}, True, "not worse"),
        ({"pinball": None, "coverage": 0.95}, {"pinball": 1.0, "coverage": 0.95}, False, "no pinball"),
        ({"pinball": 1.0, "coverage": 0.95}, None, True, "no scores for the serving"),
        ({"horizons": {"30m": {"pinball": 1.0, "coverage": 0.95}}},
         {"horizons": {"30m": {"pinball": 2.0, "coverage": 0.95}}}, True, "not worse"),
    ],
    ids=["better", "within-tolerance", "worse-pinball", "worse-coverage", "fixes-coverage",
         "unscored-challenger", "unscored-serving", "model-entries"],
)
def test_promote(challenger, serving, expected, why):
    decision = promote(challenger, serving, 0.95)
    assert decision.promote is expected
    assert why in decision.reason


def test_train_model_returns_a_calibrated_serialisable_model(series):
    result = train_model(series, FAST)
    assert result.kind == result.metrics["selected"] and result.kind in (*FAST, "combination")
    model = result.model
    members = model.members if result.kind == "combination" else (model,)
    assert all(m.kind == "calibrated" and m.base_kind in FAST for m in members)
    rebuilt = registry.model_from_params(model.kind, json.loads(json.dumps(model.to_params())))
    recent = series.tail(model.window_steps)
    fc = rebuilt.forecast(recent, 6, (0.5, 0.95))
    assert np.all(np.isfinite(fc.values)) and np.all(fc.values[1] >= fc.values[0])
    np.testing.assert_allclose(fc.values, model.forecast(recent, 6, (0.5, 0.95)).values)
    assert result.fit_seconds >= 0
    # Every candidate's cross-fitted scores travel with the model; a single winner's are the
    # lowest of the singles, a combination's members are the best ones.
    pins = {k: np.mean([h["pinball"] for h in m["horizons"].values()])
            for k, m in result.metrics["models"].items() if k != "combination"}
    ranked = sorted(pins, key=lambda k: pins[k])
    if result.kind == "combination":
        assert set(result.model.member_kinds) <= set(ranked[:3])
    else:
        assert result.kind == ranked[0]


def _crossfit_rows(first: float, second: float, n: int = 400) -> dict[int, np.ndarray]:
    """Cross-fitted rows (actual, P50, P95) per horizon step as :func:`crossfit_scores` pools them
    (the later half first): the P95 is ``first`` (``second``) times the right one on the first
    (second) half, whose actuals are ten times the second's."""
    rng = np.random.default_rng(2)
    actual = np.exp(rng.normal(0, 0.01, n)) * np.where(np.arange(n) < n // 2, 10.0, 1.0)
    right = np.quantile(actual[n // 2:], 0.95) * np.where(np.arange(n) < n // 2, 10.0, 1.0)
    upper = right * np.where(np.arange(n) < n // 2, first, second)
    return {h: np.column_stack([actual, upper / 1.1, upper]) for h in (2, 4, 6)}


@pytest.mark.parametrize(
    ("factors", "expected"),
    [
        # The same candidate is right on both halves: it serves alone.
        pytest.param({"persistence": (1.0, 1.0), "seasonal-naive": (3.0, 3.0)}, None, id="halves-agree"),
        # Persistence is right on one half (whose loss dominates the pooled window), seasonal-naive
        # on the other: the pooled choice would be persistence alone; each half's pick counts once.
        pytest.param({"persistence": (1.0, 0.3), "seasonal-naive": (3.0, 1.0)},
                     (("persistence", "seasonal-naive"), (0.5, 0.5)), id="halves-disagree-hedged"),
        # Persistence right everywhere, the ensemble (the default) is not: its one vote of five
        # (four parts and the prior) keeps 0.2 of the weight, which it would not as any other kind.
        pytest.param({"persistence": (1.0, 1.0), "ensemble": (3.0, 3.0)},
                     (("persistence", "ensemble"), (0.8, 0.2)), id="the-default-keeps-its-vote"),
    ],
)
def test_the_combination_hedges_a_choice_only_one_half_supports(series, factors, expected):
    models = {k: registry.forecaster(k).fit(series.slice(0, 7 * 288)) for k in factors}
    rows = {k: _crossfit_rows(*f) for k, f in factors.items()}
    got = _combination(tuple(factors), rows, models, EvaluationSettings(), timedelta(minutes=30))
    if expected is None:
        assert got is None
    else:
        members, weights, model, scores, per_origin = got
        assert per_origin.shape == (400,)  # its pinball per cross-fitted origin
        assert (members, weights) == expected and model.weights == weights
        # Served with online weights over the last day, origins one 30-minute horizon apart.
        assert model.online == OnlineWeights(rate=ONLINE_RATE, steps=6, origins=48, quantile=0.95)
        assert model.mean == "arithmetic"  # new trainings combine their quantiles arithmetically
        assert set(scores) == {"10m", "20m", "30m"} and scores["30m"]["pinball"] is not None


@pytest.mark.parametrize(
    ("pins", "expected"),
    [
        pytest.param({"arima": 1.0, "ensemble": 1.1, "prophet": 1.2, "persistence": 1.3},
                     ["arima", "ensemble", "prophet"], id="ensemble-among-the-best-three"),
        pytest.param({"persistence": 2.0, "arima": 1.0, "prophet": 1.2, "ensemble": 1.5, "holt-winters": 1.1},
                     ["arima", "holt-winters", "prophet", "ensemble"], id="ensemble-fourth-joins-as-the-default"),
        pytest.param({"arima": 1.0, "prophet": 1.2, "persistence": 1.3, "holt-winters": 1.1},
                     ["arima", "holt-winters", "prophet"], id="ensemble-failed-best-three-only"),
        pytest.param({"arima": 1.0}, ["arima"], id="one-candidate"),
    ],
)
def test_the_combination_pool_is_the_best_three_and_the_default(pins, expected):
    assert combination_pool(pins) == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {"quantile": 1.0},
        {"horizons": (timedelta(minutes=2),)},
        {"horizons": (timedelta(minutes=90),)},
        {"horizons": ()},
        {"calibration_window": timedelta(days=20)},
    ],
    ids=["quantile-1", "horizon-too-short", "horizon-too-long", "no-horizons", "calibration-too-long"],
)
def test_settings_are_validated_eagerly(kwargs):
    with pytest.raises(ConfigError):
        EvaluationSettings(**kwargs)


@pytest.mark.parametrize(
    ("losses", "expected"),
    [
        ({}, (0.05, False)),  # every rate ties: the lowest, on log-scale shifts
        ({(0.0, True): (0.9, 0.9)}, (0.05, True)),
        ({(0.0, True): (0.9, 0.9), (0.15, True): (0.8, 0.85), (0.15, False): (0.1, 0.1)}, (0.15, True)),
        ({(0.05, False): (0.5, 0.5), (0.3, False): (0.4, 0.7)}, (0.05, False)),
        ({(0.05, False): (0.1, None)}, (0.15, False)),  # failed in a block the static one has
        # Static shifts score 1.0 on the blocks, every tracked rate worse: still tracked.
        ({(0.05, False): (1.3, 1.3), (0.15, False): (1.2, 1.2), (0.3, False): (1.4, 1.4)}, (0.15, False)),
        ({(r, False): (0.1, None) for r in (0.05, 0.15, 0.3)}, (0.0, False)),  # no tracked one scored
    ],
    ids=["lowest-rate-on-ties", "additive", "additive-then-rate", "lowest-mean-rate", "incomplete-rate",
         "tracked-although-static-scores-better", "static-when-every-rate-fails"],
)
def test_short_calibration_is_chosen_on_the_daily_blocks(monkeypatch, losses, expected):
    def fake(kind, series, settings, **kwargs):
        rate = settings.tracking_rate if settings.tracked_calibration else 0.0
        blocks = losses.get((rate, settings.additive_calibration), (1.1, 1.1))
        return ModelEvaluation(kind, {}, 0.1, 100, block_pinball=(None, *blocks))

    monkeypatch.setattr(selection, "evaluate_model", fake)
    static = ModelEvaluation("arima", {}, 0.1, 100, block_pinball=(None, 1.0, 1.0))
    history = make_daily(days=7, seed=3)
    cfg = replace(settings_for_history(history.span), refit_every=SHORT_REFIT, tracked_calibration=False)
    assert selection._short_calibration(history, "arima", cfg, static, None) == expected

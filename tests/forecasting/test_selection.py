"""Rolling-origin evaluation, model selection, train_model and the promotion rule."""

from __future__ import annotations

import json
import math
from datetime import timedelta

import numpy as np
import pytest

from predictive_scaler.errors import ConfigError, InsufficientHistoryError
from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting.evaluation import (
    EvaluationSettings,
    ModelEvaluation,
    evaluate,
    horizon_steps,
    model_series,
    plan_blocks,
    select,
)
from predictive_scaler.forecasting.selection import (
    SELECTION_METHOD,
    SHORT_SELECTION_METHOD,
    _combination,
    promote,
    settings_for_history,
    train_candidates,
    train_model,
)

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
        assert result.kind == select(evaluate(history, FAST, cfg).models, cfg.quantile)
        assert result.model.tracking_window == 0 and not result.model.additive
        # The protocol's call fits every candidate (for the regret), the served one identically.
        every = train_candidates(model_series(history), FAST, cfg)
        assert set(every.models) == set(FAST) and every.selected == result.kind
        recent = history.tail(result.model.window_steps)
        np.testing.assert_allclose(every.models[result.kind].forecast(recent, 6, (0.5, 0.95)).values,
                                   result.model.forecast(recent, 6, (0.5, 0.95)).values)


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
    ],
)
def test_the_combination_hedges_a_choice_only_one_half_supports(series, factors, expected):
    models = {k: registry.forecaster(k).fit(series.slice(0, 7 * 288)) for k in factors}
    rows = {k: _crossfit_rows(*f) for k, f in factors.items()}
    got = _combination(tuple(factors), rows, models, EvaluationSettings())
    if expected is None:
        assert got is None
    else:
        members, weights, model, scores = got
        assert (members, weights) == expected and model.weights == weights
        assert set(scores) == {"10m", "20m", "30m"} and scores["30m"]["pinball"] is not None


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

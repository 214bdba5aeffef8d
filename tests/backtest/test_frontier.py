"""Frontiers: reference curves by hand, and the --frontier JSON shape on a synthetic trace."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from predictive_scaler.backtest.frontier import (
    HEADLINE_KEYS,
    FrontierResult,
    Point,
    envelope,
    headline,
    reference_cost,
    reference_unmet,
    run_frontier,
)
from predictive_scaler.backtest.records import prepare
from predictive_scaler.backtest.runner import FrontierPoints, planned_runs
from predictive_scaler.backtest.scenario import deep_merge
from predictive_scaler.series import Series
from tests.backtest.test_runner import FAST, daily_trace


def P(gpu_hours: float, served: float, unmet: float = 0.0, default: bool = False) -> Point:  # noqa: N802
    return Point({}, gpu_hours, served, unmet, default)


CURVE = [P(100, 0.90, 50), P(120, 0.95, 20), P(150, 0.99, 5), P(130, 0.94, 40), P(200, 0.99, 4)]


@pytest.mark.parametrize(
    ("share", "expected"),
    [
        (0.80, 100.0),                 # below the lowest point: the cheapest point serving at least it
        (0.90, 100.0),
        (0.925, 110.0),                # halfway between (100, 0.90) and (120, 0.95)
        (0.97, 135.0),                 # halfway between (120, 0.95) and (150, 0.99)
        (0.99, 150.0),                 # (200, 0.99) and (130, 0.94) are not on the envelope
        (0.995, None),                 # beyond the highest point: undefined
    ],
    ids=["below", "lowest", "interpolated-low", "interpolated-high", "highest", "beyond"],
)
def test_reference_cost_is_the_interpolated_lower_envelope(share: float, expected: float | None) -> None:
    assert [p.gpu_hours for p in envelope(CURVE)] == [100, 120, 150]
    got = reference_cost(CURVE, share)
    assert got == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize(("gpu_hours", "expected"), [(90, None), (100, 50.0), (110, 35.0), (175, 4.5), (300, 4.0)],
                         ids=["cheaper-than-all", "at-cheapest", "interpolated", "between-far", "beyond"])
def test_reference_unmet_at_equal_cost(gpu_hours: float, expected: float | None) -> None:
    got = reference_unmet(CURVE, gpu_hours)
    assert got == (None if expected is None else pytest.approx(expected))


def test_headline_by_hand() -> None:
    frontier = {
        "reactive": CURVE,
        "holt-winters": [P(110, 0.90), P(140, 0.99)],
        "predictive": [P(125, 0.97, 10, default=True), P(140, 0.99, 6)],
        "oracle": [P(95, 1.0)],
    }
    head, beaten = headline(frontier)
    assert set(head) == set(HEADLINE_KEYS)
    assert head["cost_ratio_vs_reactive"] == pytest.approx(125 / 135)
    assert head["gap_closed_vs_reactive"] == pytest.approx((135 - 125) / (135 - 95))
    assert head["unmet_ratio_vs_reactive"] == pytest.approx(10 / 17.5)  # reactive at 125 GPU-h: 17.5 unmet min
    hw = 110 + 30 * (0.97 - 0.90) / 0.09
    assert head["cost_ratio_vs_holt_winters"] == pytest.approx(125 / hw)
    assert head["gap_closed_vs_holt_winters"] == pytest.approx((hw - 125) / (hw - 95))
    assert beaten == []
    # A reactive point both cheaper and serving more beats it.
    frontier["reactive"] = [*CURVE, P(120, 0.98)]
    _, beaten = headline(frontier)
    assert [(b["policy"], b["gpu_hours"]) for b in beaten] == [("reactive", 120)]


def test_a_static_fleet_cheaper_and_serving_more_dominates_but_the_oracle_does_not() -> None:
    frontier = {
        "reactive": [P(100, 0.85), P(170, 0.99)],
        "predictive": [P(150, 0.906, 10, default=True)],
        "static": [P(90, 0.80), P(134.7, 0.94), P(160, 0.97)],
        "oracle": [P(95, 0.9975)],
    }
    _, beaten = headline(frontier)
    assert [(b["policy"], b["knob"], b["gpu_hours"]) for b in beaten] == [("static", {}, 134.7)]


def test_frontier_json_shape_and_reuse() -> None:
    result = run_frontier(daily_trace(), FAST, hpa_targets=(0.5, 0.9), predictive_targets=(0.8,))
    doc = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert set(doc["frontier"]) == {"reactive", "holt-winters", "predictive", "static", "oracle"}
    for name, points in doc["frontier"].items():
        for p in points:
            assert set(p) - {"default"} == {"knob", "gpu_hours", "slo_attainment", "unmet_minutes"}, name
            assert 0.0 <= p["slo_attainment"] <= 1.0
    assert [p["knob"]["target_utilization"] for p in doc["frontier"]["reactive"]] == [0.5, 0.8, 0.9]
    assert [p["knob"]["predictive_target_utilization"] for p in doc["frontier"]["predictive"]] == [0.8]
    assert sum(bool(p.get("default")) for p in doc["frontier"]["predictive"]) == 1
    assert set(doc["headline"]) == set(HEADLINE_KEYS)
    assert doc["policies"]["predictive"]["minutes_over_budget"] == 0
    # Cheaper in GPU-hours the higher the reactive target: the knob does what it says.
    costs = [p["gpu_hours"] for p in doc["frontier"]["reactive"]]
    assert costs[0] >= costs[-1]


@pytest.mark.parametrize("target", [0.7, 0.9], ids=["target-0.7", "target-0.9"])
def test_a_predictive_point_sharing_the_default_points_models_is_the_unshared_run(target: float) -> None:
    """Reuse across operating points changes nothing: a point run on the default point's trained
    models and served forecasts (the frontier's cache) equals the same point trained from scratch."""
    from predictive_scaler.backtest.adapters import PredictiveCache, run_predictive
    from predictive_scaler.backtest.records import prepare
    from predictive_scaler.backtest.runner import initial_replicas

    scenario = replace(FAST, forecasters=("persistence", "holt-winters"))
    trace = daily_trace()
    cache = PredictiveCache()
    default = prepare(trace, scenario)
    run_predictive(default, initial_replicas=initial_replicas(default), cache=cache)
    assert cache.filled
    point = prepare(trace, replace(scenario, predictive_target_utilization=target))
    shared, shared_extras = run_predictive(point, initial_replicas=initial_replicas(point), cache=cache)
    alone, alone_extras = run_predictive(point, initial_replicas=initial_replicas(point))
    np.testing.assert_array_equal(shared.billed_gpus, alone.billed_gpus)
    np.testing.assert_array_equal(shared_extras["forecasts"].values, alone_extras["forecasts"].values)
    assert [e.kind for e in shared_extras["model_events"]] == [e.kind for e in alone_extras["model_events"]]


def _bursty_trace() -> Series:
    """daily_trace with 3× bursts of 15 minutes about every two hours, which no forecast sees."""
    trace = daily_trace()
    values = trace.values.copy()
    rng = np.random.default_rng(7)
    at = 0
    while at < values.size:
        values[at:at + 3] *= 3
        at += int(rng.integers(18, 30))  # 90–150 minutes at the 5-minute step
    return Series(values, trace.start, trace.step_seconds, name="synthetic-bursty")


SERVICE_ON = replace(FAST, spec=deep_merge(FAST.spec, {"service": {"enabled": True}}))
KNOBS: dict[str, Any] = {"hpa_targets": (0.5, 0.9), "predictive_targets": (0.8,)}


@pytest.fixture(scope="module")
def service_runs() -> tuple[FrontierResult, FrontierResult]:
    trace = _bursty_trace()
    return run_frontier(trace, FAST, **KNOBS), run_frontier(trace, SERVICE_ON, **KNOBS)


def test_the_service_alternative_is_the_other_setting_s_own_default_point(
        service_runs: tuple[FrontierResult, FrontierResult]) -> None:
    """Switching the tracker inside one frontier gives what a frontier run with it switched gives: the
    same point, headline and dominating peers, both ways round — and on bursts it differs."""
    off, on = service_runs
    assert off.service_alternative is not None and on.service_alternative is not None
    assert off.service_alternative.enabled is True and on.service_alternative.enabled is False
    assert off.service_alternative.point == on.predictive_default
    assert off.service_alternative.headline == on.headline
    assert off.service_alternative.dominated_by == on.dominated_by
    assert on.service_alternative.point == off.predictive_default
    assert on.service_alternative.headline == off.headline
    # The bursts leave demand unserved, so the tracker widens the plan: more served, more GPU-hours.
    assert on.predictive_default.slo_attainment > off.predictive_default.slo_attainment
    assert on.predictive_default.gpu_hours > off.predictive_default.gpu_hours
    # It is no operating point of the frontier: the curves are the run's own.
    assert off.service_alternative.point not in off.frontier["predictive"]


def test_the_service_alternative_is_reported_and_can_be_left_out(
        service_runs: tuple[FrontierResult, FrontierResult]) -> None:
    from predictive_scaler.backtest.report import frontier_table, frontier_text, frontier_verdict

    off, _ = service_runs
    doc = json.loads(json.dumps(off.to_json(), allow_nan=False))
    alt = doc["frontier_checks"]["service_alternative"]
    assert alt["service_enabled"] is True
    assert set(alt) == {"service_enabled", "knob", "gpu_hours", "slo_attainment", "unmet_minutes", "default",
                        "headline", "dominated_by"}
    assert set(alt["headline"]) == set(HEADLINE_KEYS)
    line = frontier_verdict(off)[-1]
    assert line.startswith("with spec.service.enabled true instead (the service tracker on)")
    assert f"{100 * off.service_alternative.point.slo_attainment:.2f} % served against" in line
    assert "the SLO decides" in line
    assert frontier_table(off).splitlines()[-1].startswith("| predictive, spec.service.enabled true |")
    assert "spec.service.enabled true: " in frontier_text(off)
    bare = run_frontier(daily_trace(), FAST, hpa_targets=(0.9,), predictive_targets=(), service_alternative=False)
    assert bare.service_alternative is None
    assert "service_alternative" not in bare.to_json()["frontier_checks"]
    assert not any("spec.service" in line for line in frontier_verdict(bare))


def test_the_work_bound_counts_the_service_alternative_widened_by_the_tracker() -> None:
    setup = prepare(daily_trace(), FAST)
    points = FrontierPoints((0.9,), (0.8,), lambda top: [])
    plain = [r for r in planned_runs(setup, points) if r.policy == "predictive"]
    with_alt = [r for r in planned_runs(setup, replace(points, service_alternative=True)) if r.policy == "predictive"]
    assert len(with_alt) == len(plain) + 1
    assert with_alt[-1].replicas >= max(r.replicas for r in plain)
    assert with_alt[-1].replicas <= setup.max_replicas

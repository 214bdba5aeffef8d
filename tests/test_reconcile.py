"""Scenario tests: the Reconciler over fake ports, minute by minute."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from predictive_scaler.clock import FakeClock
from predictive_scaler.errors import ClusterError, ServerError
from predictive_scaler.policy import reasons as why
from predictive_scaler.policy.budget import ClusterShare
from predictive_scaler.policy.reasons import Limit
from predictive_scaler.policy.state import PlannerState
from predictive_scaler.reconcile import Reconciler, ReconcileResult
from predictive_scaler.series import Series
from predictive_scaler.spec import ScalerSpec
from tests.support.fakes.ports import FakeCluster, FakeMetrics, FakeModel

START = datetime(2024, 3, 4, 8, 0, 30, tzinfo=UTC)  # mid-minute, like a real timer
CAPACITY = 10.0  # req/s per replica


def make_spec(**overrides: object) -> ScalerSpec:
    d: dict[str, object] = {
        "target": {"name": "llm"},
        "demand": {"query": "sum(rate(requests_total[2m]))"},
        "capacity": {"requestsPerReplica": CAPACITY},
        "minReplicas": 1,
        "maxReplicas": 100,
        "mode": "scale",
        "prewarm": {"enabled": True, "gpusPerNode": 4, "budget": {"maxGpus": 8, "pricePerGpuHour": 2.0}},
        # The fake model reads nothing from history; a day keeps the fake metrics cheap.
        "model": {"recentWindowSeconds": 86400},
    }
    d.update(overrides)
    return ScalerSpec.from_dict(d)


class Run:
    """A reconciler over fakes, driven one control period at a time, restoring state from JSON each time."""

    def __init__(self, spec: ScalerSpec, demand: Callable[[datetime], float | None],
                 level: Callable[[datetime], float], *, cv: float = 0.03, replicas: int = 10) -> None:
        self.clock = FakeClock(START)
        self.metrics = FakeMetrics(demand)
        self.model = FakeModel(level, cv=cv)
        self.cluster = FakeCluster(desired=replicas, ready=replicas, free_gpus=0)
        self.reconciler = Reconciler(spec, self.metrics, self.model, self.cluster, self.clock)
        self.state = PlannerState()
        self.results: list[ReconcileResult] = []

    def minutes(self, n: int) -> list[ReconcileResult]:
        out = []
        for _ in range(n):
            result = self.reconciler.step(self.state)
            # What the controller does: persist the state in the status as JSON, read it back.
            self.state = PlannerState.from_dict(json.loads(json.dumps(result.state.to_dict())))
            out.append(result)
            self.clock.advance(60)
        self.results.extend(out)
        return out


def noisy(level: Callable[[datetime], float], cv: float, seed: int) -> Callable[[datetime], float]:
    rng = np.random.default_rng(seed)
    cache: dict[float, float] = {}

    def demand(t: datetime) -> float:
        key = t.timestamp()
        if key not in cache:
            cache[key] = max(0.0, level(t) * (1 + cv * rng.standard_normal()))
        return cache[key]
    return demand


def minutes_since_start(t: datetime) -> float:
    return (t - START).total_seconds() / 60


SHIFT_AT = 60  # minutes


@pytest.mark.parametrize("factor", [1.3, 1.5, 2.0, 0.7, 0.5], ids=["up-30%", "up-50%", "up-100%", "down-30%", "down-50%"])
def test_level_shift_switches_to_reactive_within_three_periods(factor: float) -> None:
    base = 100.0

    def truth(t: datetime) -> float:
        return base * (factor if minutes_since_start(t) >= SHIFT_AT else 1.0)

    run = Run(make_spec(), noisy(truth, 0.02, seed=1), lambda t: base)  # the model never learns the shift
    before = run.minutes(SHIFT_AT)
    assert all(r.decision.strategy == "predictive" for r in before), "a well-forecast series must stay predictive"
    after = run.minutes(10)
    first_reactive = next(i for i, r in enumerate(after) if r.decision.strategy == "reactive")
    assert first_reactive < 3, f"switched after {first_reactive + 1} periods"
    switched = after[first_reactive]
    assert switched.decision.drift == ("under-forecast" if factor > 1 else "over-forecast")
    assert switched.decision.speculative_gpus == 0 and switched.decision.placeholder_gpus == 0
    assert any(e.reason == "StrategyChanged" for e in switched.events)
    drift = {c.type: c for c in switched.conditions}["Drift"]
    assert drift.status == "True" and "forecast drift" in drift.message


def seasonal(t: datetime) -> float:
    minutes = minutes_since_start(t)
    return 200.0 + 120.0 * math.sin(2 * math.pi * minutes / 1440.0)


def test_noisy_but_well_forecast_never_leaves_predictive() -> None:
    cv = 0.10
    run = Run(make_spec(), noisy(seasonal, cv, seed=7), seasonal, cv=cv, replicas=20)
    results = run.minutes(24 * 60)
    strategies = {r.decision.strategy for r in results}
    assert strategies == {"predictive"}
    assert all(r.decision.desired_replicas >= r.decision.reactive_replicas for r in results)
    # The model is asked once per 5-minute step, not once per reconcile.
    assert run.model.forecast_calls == pytest.approx(24 * 60 / 5, abs=1)


@pytest.mark.parametrize("recovery", [600, 900, 1800], ids=["10min", "15min", "30min"])
def test_recovers_to_predictive_after_the_configured_while(recovery: int) -> None:
    learned_at = SHIFT_AT + 20

    def truth(t: datetime) -> float:
        return 130.0 if minutes_since_start(t) >= SHIFT_AT else 100.0

    def model_level(t: datetime) -> float:  # the retrained model knows the new level from `learned_at`
        return 130.0 if minutes_since_start(t) >= learned_at else 100.0

    spec = make_spec(drift={"recoverySeconds": recovery})
    run = Run(spec, noisy(truth, 0.02, seed=3), model_level)
    results = run.minutes(SHIFT_AT + 20 + recovery // 60 + 30)
    strategies = [r.decision.strategy for r in results]
    switches = [(i, a, b) for i, (a, b) in enumerate(zip(strategies, strategies[1:], strict=False)) if a != b]
    assert [(a, b) for _, a, b in switches] == [("predictive", "reactive"), ("reactive", "predictive")], "no flapping"
    back = switches[1][0] + 1
    # Good forecasts resume once the new model is in use (the step after it learned): recovery counts from there.
    assert back >= learned_at + recovery // 60
    assert back <= learned_at + recovery // 60 + 6
    assert results[back].events and results[back].events[0].reason == "StrategyChanged"


def test_prometheus_down_holds_then_falls_back_never_scaling_down() -> None:
    spec = make_spec(missingDataPeriods=3)
    run = Run(spec, noisy(lambda t: 100.0, 0.02, seed=5), lambda t: 100.0)
    healthy = run.minutes(30)
    replicas_before = healthy[-1].decision.desired_replicas
    placeholders_before = healthy[-1].decision.placeholder_gpus
    run.metrics.down = True
    outage = run.minutes(10)
    assert [r.decision.strategy for r in outage] == ["hold"] * 3 + ["reactive"] * 7
    assert all(r.decision.desired_replicas >= replicas_before for r in outage)
    assert all(r.decision.placeholder_gpus <= placeholders_before for r in outage[:3])
    # Placeholders go; replicas the forecast added are kept (never a scale-down on missing data) and
    # still count as speculative against the counterfactual, within the budget.
    assert all(r.decision.placeholder_gpus == 0 and r.decision.speculative_gpus <= 8 for r in outage[3:])
    conds = {c.type: c for c in outage[0].conditions}
    assert conds["MetricsUnavailable"].status == "True"
    assert "connection refused" in conds["MetricsUnavailable"].message
    first = outage[0].decision.reasons[0]
    assert isinstance(first, why.Holding) and first.periods == 1 and first.replicas == replicas_before
    run.metrics.down = False
    back = run.minutes(2)
    assert back[-1].decision.strategy == "predictive"


def test_missing_model_is_reactive_and_says_why() -> None:
    run = Run(make_spec(), lambda t: 100.0, lambda t: 100.0)
    run.model.broken = "artifact sha256 mismatch; re-train or roll back the model"
    result = run.minutes(1)[0]
    assert result.decision.strategy == "reactive"
    conds = {c.type: c for c in result.conditions}
    assert conds["ModelInvalid"].status == "True" and "sha256" in conds["ModelInvalid"].message
    assert conds["Predictive"].status == "False"


def test_forecast_only_changes_nothing_but_reports() -> None:
    spec = make_spec(mode="forecast-only")
    run = Run(spec, lambda t: 150.0, lambda t: 150.0, replicas=5)
    results = run.minutes(3)
    assert run.cluster.applied == [] and run.cluster.desired == 5
    assert results[0].decision.desired_replicas > 5
    assert any(e.reason == "ForecastOnly" and "would scale" in e.message for e in results[0].events)
    assert {c.type: c for c in results[0].conditions}["Ready"].reason == "ForecastOnly"


def test_cluster_fault_propagates_and_changes_no_strategy() -> None:
    run = Run(make_spec(), lambda t: 100.0, lambda t: 100.0)
    run.minutes(5)
    state_before = run.state
    run.cluster.fail_apply = ServerError("503 from the API server; retrying", status=503)
    with pytest.raises(ClusterError):
        run.reconciler.step(run.state)
    run.cluster.fail_apply = None
    result = run.reconciler.step(state_before)  # the controller retries with the state it had
    assert result.decision.strategy == state_before.strategy == "predictive"


# -- HPA's classic cases, through the reconciler with no model (reactive) ----------------------

HPA_CASES = [
    # (id, current, ready, demand, expected) — capacity 10 req/s per replica, tolerance 10 %
    ("within-tolerance-up", 10, 10, 109.0, 10),
    ("beyond-tolerance-up", 10, 10, 111.0, 12),
    ("within-tolerance-down", 10, 10, 91.0, 10),
    ("beyond-tolerance-down", 10, 10, 89.0, 9),
    ("missing-pods-damp-scale-down", 10, 6, 50.0, 10),   # not-ready counted busy: (50+40)/100 = 0.9
    ("missing-pods-scale-down", 10, 6, 30.0, 7),         # (30+40)/100 = 0.7 → 7
    ("missing-pods-flip-no-change", 10, 5, 55.0, 10),    # ready ratio 1.1 up, with idle missing 0.55 down
    ("missing-pods-scale-up", 10, 8, 150.0, 15),         # idle missing: 150/100 → 15
    ("scale-up-rate-percent", 6, 6, 500.0, 12),          # max(100 %, 4 pods) from 6 → 12
    ("scale-up-rate-pods", 2, 2, 500.0, 6),              # max(4, 2+4) → 6
    ("max-clamp", 80, 80, 5000.0, 100),
    ("min-clamp", 3, 3, 0.0, 1),
]


@pytest.mark.parametrize(("current", "ready", "demand", "expected"), [c[1:] for c in HPA_CASES],
                         ids=[c[0] for c in HPA_CASES])
def test_reactive_matches_hpa_single_evaluation(current: int, ready: int, demand: float, expected: int) -> None:
    run = Run(make_spec(), lambda t: demand, lambda t: 0.0, replicas=current)
    run.cluster.ready = ready
    run.model.broken = "no model trained yet"
    result = run.minutes(1)[0]
    assert result.decision.strategy == "reactive"
    assert result.decision.desired_replicas == expected
    rules = [r for r in result.decision.reasons if isinstance(r, why.HpaRule)]
    assert [r.demand for r in rules] == [demand]


def test_reactive_scale_down_stabilisation_window() -> None:
    """Demand drops from 100 to 40 req/s: HPA keeps 10 replicas for 300 s, then goes to 4."""
    def demand(t: datetime) -> float:
        return 100.0 if minutes_since_start(t) < 5 else 40.0

    run = Run(make_spec(), demand, lambda t: 0.0, replicas=10)
    run.model.broken = "no model"
    results = run.minutes(12)
    desired = [r.decision.desired_replicas for r in results]
    # minute 5 is the first low observation; its recommendation of 4 wins once the last
    # recommendation of 10 (minute 4) falls out of the window: HPA keeps a recommendation
    # only while it is strictly newer than now - 300 s, so at minute 9.
    assert desired[:9] == [10] * 9
    assert desired[9:] == [4, 4, 4]
    assert Limit.SCALE_DOWN_STABILIZATION in results[6].decision.limits
    held = [r for r in results[6].decision.reasons if isinstance(r, why.Stabilised)]
    assert [(r.direction, r.window_seconds, r.recommendation, r.held_at) for r in held] == [("down", 300, 10, 10)]
    assert {c.type: c for c in results[6].conditions}["ScalingLimited"].status == "True"


def test_every_decision_explains_itself_with_numbers() -> None:
    run = Run(make_spec(), noisy(seasonal, 0.05, seed=11), seasonal, cv=0.05, replicas=20)
    results = run.minutes(30)
    run.metrics.down = True
    results += run.minutes(5)
    for r in results:
        assert r.decision.reasons, r.decision
        text = " ".join(r.decision.sentences)
        assert any(ch.isdigit() for ch in text)
        if r.decision.strategy == "predictive":
            need = next(x for x in r.decision.reasons if isinstance(x, why.PredictiveNeed))
            assert need.forecast == r.decision.forecast_pod_lead
            assert f"{r.decision.forecast_pod_lead:.4g}" in text
            assert "P95" in text
        if r.decision.strategy == "hold":
            assert str(r.decision.desired_replicas) in text


def test_restart_changes_no_decision() -> None:
    """Two runs, one of them 'restarted' (a new Reconciler, empty cache) every 7 minutes."""
    truth = noisy(seasonal, 0.08, seed=2)
    spec = make_spec()
    a = Run(spec, truth, seasonal, cv=0.08, replicas=20)
    b = Run(spec, truth, seasonal, cv=0.08, replicas=20)
    for chunk in range(10):
        ra = a.minutes(7)
        b.reconciler = Reconciler(spec, b.metrics, b.model, b.cluster, b.clock)
        rb = b.minutes(7)
        assert [x.decision for x in ra] == [x.decision for x in rb], f"chunk {chunk}"
        assert a.state == b.state
    assert timedelta(minutes=70) == a.clock.now() - START


# -- forecast cache and recent window ----------------------------------------------------------

class LaggedMetrics(FakeMetrics):
    """A source whose newest step becomes queryable only ``delay`` seconds after it ends."""

    def __init__(self, demand: Callable[[datetime], float | None], delay: float) -> None:
        super().__init__(demand, lag_seconds=delay)
        self.delay = delay
        self.windows: list[timedelta] = []

    def recent(self, now: datetime, window: timedelta, step_seconds: int) -> Series:
        self.windows.append(window)
        return super().recent(now - timedelta(seconds=self.delay), window, step_seconds)


@pytest.mark.parametrize(("step", "delay"), [(300, 60), (300, 90), (1800, 60), (1800, 0)],
                         ids=["5m-step-60s-delay", "5m-step-90s-delay", "30m-step-60s-delay", "30m-step-no-delay"])
def test_forecast_is_issued_from_the_newest_complete_step(step: int, delay: float) -> None:
    """Each forecast starts from the last step the source can show; a new step is picked up when it appears."""
    spec = make_spec(horizonSeconds=2 * step, model={"recentWindowSeconds": 86400, "stepSeconds": step})
    run = Run(spec, lambda t: 100.0, lambda t: 100.0)
    run.metrics = LaggedMetrics(lambda t: 100.0, delay)
    run.model.step_seconds, run.model.horizon_steps = step, 2
    run.reconciler = Reconciler(spec, run.metrics, run.model, run.cluster, run.clock)
    results = run.minutes(3 * step // 60)
    for r in results:
        assert r.forecast is not None
        newest = (math.floor((r.now.timestamp() - delay) / step) - 1) * step  # label of the last step observable
        assert r.forecast.issued_at.timestamp() == newest, r.now
        assert r.decision.strategy == "predictive", r.decision.reasons
    assert run.model.forecast_calls == len({r.forecast.issued_at for r in results if r.forecast is not None})


class WindowedModel(FakeModel):
    window_steps = 3 * 288  # a model that reads three days of 5-minute steps


@pytest.mark.parametrize(("configured", "model_class", "expected"), [
    (None, WindowedModel, timedelta(days=3)),
    (None, FakeModel, timedelta(days=7)),
    (7200, WindowedModel, timedelta(hours=2)),
], ids=["model-window", "default-week", "spec-wins"])
def test_recent_window_follows_the_model_unless_set(configured: int | None, model_class: type[FakeModel],
                                                    expected: timedelta) -> None:
    spec = make_spec(model={"recentWindowSeconds": configured})
    metrics = LaggedMetrics(lambda t: 100.0, 0.0)
    reconciler = Reconciler(spec, metrics, model_class(lambda t: 100.0), FakeCluster(desired=10, ready=10),
                            FakeClock(START))
    reconciler.step(PlannerState())
    assert metrics.windows == [expected]


@pytest.mark.parametrize("factor", [1.0, 1.3, 2.0], ids=["none", "1.3", "2"])
def test_intra_step_peak_factor_sizes_above_the_step_mean_forecast(factor: float) -> None:
    spec = make_spec(demand={"query": "sum(rate(requests_total[2m]))", "intraStepPeakFactor": factor})
    run = Run(spec, lambda t: 100.0, lambda t: 100.0, cv=0.0)
    result = run.minutes(2)[-1]
    d = result.decision
    assert d.strategy == "predictive"
    assert d.predicted_replicas == math.ceil(d.forecast_pod_lead * factor / CAPACITY - 1e-9)
    need = next(r for r in d.reasons if isinstance(r, why.PredictiveNeed))
    assert need.peak_factor == factor and need.sized == pytest.approx(d.forecast_pod_lead * factor)
    text = " ".join(d.sentences)
    assert ("intraStepPeakFactor" in text) == (factor != 1.0)
    if factor != 1.0:
        assert f"× {factor:g}" in text


def test_a_clock_jumping_back_never_reuses_a_forecast_from_its_future() -> None:
    run = Run(make_spec(), lambda t: 100.0, lambda t: 100.0)
    run.minutes(12)
    run.clock.advance(-600)  # NTP correction: ten minutes back
    back = run.minutes(5)
    for r in back:
        assert r.forecast is not None and r.forecast.issued_at <= r.now
        assert r.decision.strategy == "predictive", r.decision.reasons


@pytest.mark.parametrize(("share", "bound"), [(None, 8), (3, 3), (0, 0), (30, 8)],
                         ids=["no-cap", "share-binds", "nothing-left", "own-budget-binds"])
def test_the_cluster_share_is_a_value_into_the_step(share: int | None, bound: int) -> None:
    """The cluster-wide share only lowers the prewarm budget, per step, and leaves the spec untouched."""
    spec = make_spec()
    run = Run(spec, lambda t: 150.0, lambda t: 300.0, replicas=10)  # the forecast asks for far more
    results = []
    for _ in range(2):  # (a third would see drift: demand stays far below this forecast)
        result = run.reconciler.step(run.state, cluster_share=ClusterShare(share, "the cluster's part"))
        run.state, _ = result.state, run.clock.advance(60)
        results.append(result)
    assert run.reconciler.spec is spec
    assert all(r.decision.strategy == "predictive" for r in results)
    most = max(r.decision.speculative_gpus for r in results)
    assert most <= bound and (most == 8) == (bound == 8)  # whole 4-GPU nodes: a share of 3 buys less than 3
    if bound < 8:
        assert all(Limit.BUDGET in r.decision.limits for r in results)
        assert any(f"allows {bound} (max {bound} GPUs" in s for r in results for s in r.decision.sentences)

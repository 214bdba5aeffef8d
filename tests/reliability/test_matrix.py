"""The fault matrix: every row of ``scenarios.SCENARIOS`` run through the controller's reconcile.

Each scenario runs ≥ 30 control periods on the injected clock against the real
Prometheus (behind the fault proxy), the stateful fake API server and a model
store on disk. The harness checks the common invariants on every period; this
module injects each fault and asserts the scenario's own promises: the strategy
in each faulted period, the recovery, and the condition, Event and metric that
must appear within one period.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import pytest

from predictive_scaler.forecasting.store import MODEL_FILE, ModelStore, ServingPointer
from tests.reliability.conftest import BUSY_MODEL, MODEL, MakeWorld, trace_time
from tests.reliability.harness import Period, World
from tests.reliability.scenarios import SCENARIOS, Scenario
from tests.support.prometheus import BackfilledPrometheus
from tests.support.proxy import Down, FaultProxy, Hang, Rewrite, Slow, Status

Hook = Callable[[World, int], None]


@dataclass
class Injection:
    """How one scenario is set up and driven: world options, and a hook run before each period."""

    offset: timedelta = timedelta(days=11, hours=6)
    spec: dict[str, Any] = field(default_factory=dict)
    on_start: Hook | None = None  # before the first faulted period
    on_end: Hook | None = None  # before the first period after the fault
    every: Hook | None = None  # before each faulted period


# -- Prometheus bodies rewritten by the proxy -------------------------------------------------------

def _empty(path: str, params: dict[str, str], doc: Any) -> Any:
    doc["data"]["result"] = []
    return doc


def _nan(path: str, params: dict[str, str], doc: Any) -> Any:
    for item in doc["data"]["result"]:
        if "value" in item:
            item["value"][1] = "NaN"
        for pair in item.get("values", ()):
            pair[1] = "NaN"
    return doc


def _duplicated(path: str, params: dict[str, str], doc: Any) -> Any:
    result = doc["data"]["result"]
    doc["data"]["result"] = result + [{**item, "metric": {**item.get("metric", {}), "instance": "replica-b"}}
                                      for item in result]
    return doc


def _proxy(world: World) -> FaultProxy:
    return world.proxy  # type: ignore[attr-defined, no-any-return]


def _inject(fault: Any, timeout: float | None = None) -> Injection:
    def start(world: World, i: int) -> None:
        if timeout is not None:
            world.source.timeout = timeout  # the client's 10 s, scaled so the matrix stays fast
        _proxy(world).inject(fault)

    def end(world: World, i: int) -> None:
        world.source.timeout = world.prometheus_timeout
        _proxy(world).clear()

    return Injection(on_start=start, on_end=end)


# -- model damage ----------------------------------------------------------------------------------

def _serving_file(store: ModelStore, name: str = MODEL) -> Any:
    pointer = store.pointer(name)
    assert pointer is not None
    return store.version_dir(name, pointer.version) / MODEL_FILE


def _republish(world: World, i: int) -> None:
    """The operator's fix: a good version is published and served."""
    good = world.good_model  # type: ignore[attr-defined]
    world.store.publish(MODEL, good.model, series=MODEL, window=good.manifest.window)


def _remember_good(world: World) -> None:
    world.good_model = world.store.serving(MODEL, expected_series=MODEL)  # type: ignore[attr-defined]


def _corrupt(world: World, i: int) -> None:
    _remember_good(world)
    path = _serving_file(world.store)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _tamper(world: World, i: int) -> None:
    _remember_good(world)
    path = _serving_file(world.store)
    doc = json.loads(path.read_bytes())
    doc["params"]["window"] = int(doc["params"]["window"]) + 1
    path.write_text(json.dumps(doc))


def _bad_new_version(world: World, i: int) -> None:
    store = world.store
    pointer = store.pointer(MODEL)
    assert pointer is not None
    new = "29990101T000000Z-deadbeef"
    shutil.copytree(store.version_dir(MODEL, pointer.version), store.version_dir(MODEL, new))
    (store.version_dir(MODEL, new) / MODEL_FILE).write_text('{"kind": "persistence", "params": {')
    store._write_pointer(MODEL, ServingPointer(new, pointer.sha256, (*pointer.history, pointer.version)))


def _rollback(world: World, i: int) -> None:
    world.store.rollback(MODEL)


def _hundredfold(world: World, i: int) -> None:
    _remember_good(world)
    good = world.good_model  # type: ignore[attr-defined]
    params = good.model.to_params()
    params["spread"] = [[v + math.log(100.0) for v in row] for row in params["spread"]]
    model = type(good.model).from_params(params)
    world.store.publish(MODEL, model, series=MODEL, window=good.manifest.window)


# -- Kubernetes API faults ---------------------------------------------------------------------------

def _api_outage(world: World, i: int) -> None:
    world.fake_api.outage(503, requests=10**6)


def _api_clear(world: World, i: int) -> None:
    world.fake_api.clear_faults()


def _conflicts(world: World, i: int) -> None:
    world.fake_api.fail_every_nth_patch(2, 409)


def _throttle(world: World, i: int) -> None:
    world.fake_api.throttle(429, retry_after=1.0, times=1)


# -- clocks --------------------------------------------------------------------------------------------

LOOKBACK_SECONDS = 300.0  # Prometheus' staleness lookback for an instant query


def _prometheus_now(world: World) -> Callable[[str, dict[str, str], Any], Any]:
    """Prometheus holds data up to the world's time: nothing newer exists yet."""
    def body(path: str, params: dict[str, str], doc: Any) -> Any:
        now = world.at(len(world.periods)).timestamp()
        if path.endswith("/query") and float(params.get("time", 0)) > now + LOOKBACK_SECONDS:
            doc["data"]["result"] = []
        for item in doc["data"]["result"]:
            if "values" in item:
                item["values"] = [p for p in item["values"] if float(p[0]) <= now]
        doc["data"]["result"] = [it for it in doc["data"]["result"] if it.get("values", [1])]
        return doc
    return body


def _skew(seconds: float) -> Injection:
    def start(world: World, i: int) -> None:
        world.skew = timedelta(seconds=seconds)
        if seconds > 0:
            _proxy(world).inject(Rewrite(body_fn=_prometheus_now(world)))

    def end(world: World, i: int) -> None:
        world.skew = timedelta(0)
        _proxy(world).clear()

    return Injection(on_start=start, on_end=end)


# -- DCGM ----------------------------------------------------------------------------------------------

def _freeze_dcgm(world: World, i: int) -> None:
    frozen_at = world.at(i).timestamp()

    def params(path: str, p: dict[str, str]) -> dict[str, str]:
        # The exporter stopped updating: every instant answer is the one of the freeze, stamped then.
        if path.endswith("/query") and float(p.get("time", 0)) > frozen_at:
            p["time"] = f"{frozen_at:g}"
        return p

    _proxy(world).inject(Rewrite(params_fn=params))


# -- placeholders --------------------------------------------------------------------------------------

def _pending_placeholder_pods(world: World, i: int) -> None:
    """No node ever arrives: the placeholder's pods exist but stay Pending, unscheduled."""
    want = world.placeholder_replicas() or 0
    labels = {"predictive-scaler.io/role": "placeholder", "predictive-scaler.io/scaler": world.name}
    pods = [p for p in world.fake_api.objects("v1", "Pod", "ml")
            if (p["metadata"].get("labels") or {}).get("predictive-scaler.io/role") == "placeholder"]
    for k in range(len(pods), want):
        world.fake_api.add_pod("ml", f"{world.name}-prewarm-{i:03d}-{k}", labels, phase="Pending", ready=False,
                               scheduled=False, gpus=1)
    if i == 20:
        world.set_spec(mode="forecast-only")


INJECTIONS: dict[str, Injection] = {
    "baseline": Injection(),
    "prometheus-down-10m": _inject(Down()),
    "prometheus-503": _inject(Status(503)),
    "prometheus-timeout": _inject(Hang(seconds=1.0), timeout=0.25),
    "prometheus-slow": _inject(Slow(seconds=0.6), timeout=0.25),
    "prometheus-empty": _inject(Rewrite(body_fn=_empty)),
    "prometheus-duplicated": _inject(Rewrite(body_fn=_duplicated)),
    "prometheus-nan": _inject(Rewrite(body_fn=_nan)),
    # Pod 0's counter restarts 2 days + 8 h into the trace (openmetrics staggers the restarts).
    "counter-resets": Injection(offset=timedelta(days=2, hours=7, minutes=40)),
    "frozen-dcgm": Injection(spec={"demand": {"kind": "dcgm-busy-gpus"}, "capacity": {},
                                   "model": {"name": BUSY_MODEL}},
                             on_start=_freeze_dcgm, on_end=lambda w, i: _proxy(w).clear()),
    "api-5xx-2m": Injection(on_start=_api_outage, on_end=_api_clear),
    "api-409-every-2nd": Injection(on_start=_conflicts, on_end=_api_clear),
    "api-429": Injection(every=_throttle, on_end=_api_clear),
    "corrupt-model": Injection(on_start=_corrupt, on_end=_republish),
    "tampered-model": Injection(on_start=_tamper, on_end=_republish),
    "bad-new-version": Injection(on_start=_bad_new_version, on_end=_rollback),
    "clock-ahead-10m": _skew(600),
    "clock-behind-10m": _skew(-600),
    "forecast-100x": Injection(on_start=_hundredfold, on_end=_republish),
    "placeholders-pending": Injection(every=_pending_placeholder_pods),
}

MATRIX = [s for s in SCENARIOS if s.test == "test_matrix.py::test_scenario"]


def test_every_matrix_row_has_an_injection() -> None:
    assert {s.id for s in MATRIX} == set(INJECTIONS)
    assert all(s.periods >= 30 for s in MATRIX)


def run_scenario(make_world: MakeWorld, proxy: FaultProxy, scenario: Scenario) -> World:
    inj = INJECTIONS[scenario.id]
    world = make_world(inj.offset, **inj.spec)
    world.proxy = proxy  # type: ignore[attr-defined]
    f0, f1 = scenario.fault

    def before(w: World, i: int) -> None:
        if i == f0 and f1 > f0 and inj.on_start:
            inj.on_start(w, i)
        if f0 <= i < f1 and inj.every:
            inj.every(w, i)
        if i == f1 and f1 > f0 and inj.on_end:
            inj.on_end(w, i)

    world.run(scenario.periods, before)
    return world


def _metric_key(signal: str) -> tuple[str, dict[str, str]]:
    m = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})?", signal)
    assert m, signal
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
    return m.group(1), labels


def _sample(p: Period, name: str, labels: dict[str, str]) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for key, value in p.samples.items():
        if key.startswith(name + "{") or key == name:
            got = key[len(name):].strip("{}")
            if all(part in got.split(",") for part in want.split(",") if part):
                return value
    return 0.0


def assert_signals(world: World, scenario: Scenario, onset: int, metric_onset: int | None = None) -> None:
    """The condition and the Event appear in the period ``onset`` or the next; the metric in the
    period ``metric_onset`` (default ``onset``) or the next."""
    sig = scenario.signals
    window = [p for p in world.periods if onset <= p.index <= onset + 1]
    m0 = onset if metric_onset is None else metric_onset
    metric_window = [p for p in world.periods if m0 <= p.index <= m0 + 1]
    before = world.periods[m0 - 1] if m0 > 0 else None
    if sig.condition is not None:
        kind, status = sig.condition.split("=")
        assert any((c := p.condition(kind)) is not None and c["status"] == status for p in window), \
            f"condition {sig.condition} missing within one period of {onset}"
    if sig.event is not None:
        assert any(e.reason == sig.event for p in window for e in p.events), \
            f"Event {sig.event} not posted within one period of {onset}: {[p.events for p in window]}"
    if sig.metric is not None:
        name, labels = _metric_key(sig.metric)
        after = max(_sample(p, name, labels) for p in metric_window)
        if name.endswith("_total"):
            assert after > (_sample(before, name, labels) if before else 0.0), f"{sig.metric} did not increase"
        else:
            assert after > 0, f"{sig.metric} not set"


@pytest.mark.parametrize("scenario", MATRIX, ids=[s.id for s in MATRIX])
def test_scenario(make_world: MakeWorld, proxy: FaultProxy, prometheus_server: BackfilledPrometheus,
                  scenario: Scenario) -> None:
    world = run_scenario(make_world, proxy, scenario)
    world.prometheus = prometheus_server  # type: ignore[attr-defined]
    periods = world.periods
    f0, f1 = scenario.fault
    assert len(periods) == scenario.periods >= 30

    # Before the fault: the control run is predictive.
    assert all(p.strategy == "predictive" for p in periods[:f0]), [p.strategy for p in periods[:f0]]
    # During: the expected strategy in each period (None: the step failed before planning).
    if f1 > f0 and scenario.during:
        got = [p.strategy for p in periods[f0:f1]]
        want = [scenario.during[min(k, len(scenario.during) - 1)] for k in range(f1 - f0)]
        assert got == want, f"strategies during the fault: {got}"
    # After: back to predictive exactly `recovery` periods after the fault ends, and stays.
    if scenario.recovery is not None and f1 < scenario.periods:
        after = [p.strategy for p in periods[f1:]]
        assert after[: scenario.recovery] == [a for a in after[: scenario.recovery] if a != "predictive"]
        assert set(after[scenario.recovery:]) == {"predictive"}, f"after the fault: {after}"
    if scenario.signals_at == "fault-end":
        assert_signals(world, scenario, f1, metric_onset=f0)
    elif scenario.signals_at == "first-retry":
        onset = next(p.index for p in periods[f0:f1] if any(st in (409, 429) or st >= 500 for st in p.api_statuses))
        assert onset <= f0 + 1, f"the fault showed first in period {onset}"
        assert_signals(world, scenario, onset)
    else:
        onset = f0 if scenario.signals_at == "fault" else \
            next((p.index for p in periods[f0:f1] if p.strategy != "predictive"), f0)
        assert_signals(world, scenario, onset)
    # ApiDegraded: False before any fault; True only for API faults; False again by the end of the run.
    degraded = [p.index for p in periods if _api_degraded(p)]
    assert not [i for i in degraded if i < f0], f"ApiDegraded before the fault: {degraded}"
    if scenario.kind != "api":
        assert not degraded, f"ApiDegraded without an API fault: {degraded}"
    if f1 < scenario.periods:
        assert not _api_degraded(periods[-1]), periods[-1].condition("ApiDegraded")
    CHECKS.get(scenario.id, lambda w, s: None)(world, scenario)


def _api_degraded(p: Period) -> bool:
    cond = p.condition("ApiDegraded")
    return cond is not None and cond["status"] == "True"


# -- per-scenario checks --------------------------------------------------------------------------

def _check_baseline(world: World, s: Scenario) -> None:
    assert any((p.placeholder_replicas or 0) > 0 for p in world.periods), "no placeholder ever: weak control"


def _check_proxy_retries(world: World, s: Scenario) -> None:
    faulted = [r for r in _proxy(world).requests if r.outcome != "forwarded"]
    # retries=1: every query of a faulted period was tried twice.
    assert len(faulted) >= 2 * (s.fault[1] - s.fault[0])


def _check_slow(world: World, s: Scenario) -> None:
    _check_proxy_retries(world, s)
    assert max(p.wall_seconds for p in world.periods[s.fault[0]: s.fault[1]]) < 2.0


def _check_empty(world: World, s: Scenario) -> None:
    assert all(p.result is not None and p.result.decision.demand != 0 for p in world.periods)


def _check_duplicated(world: World, s: Scenario) -> None:
    cond = world.periods[s.fault[0]].condition("MetricsUnavailable")
    assert cond is not None and "sum(" in cond["message"], cond


def _check_counter_resets(world: World, s: Scenario) -> None:
    trace = world.prometheus.history.trace  # type: ignore[attr-defined]
    start = trace.start.to_pydatetime()
    reset = start + timedelta(days=2, hours=8)
    assert world.periods[0].at < reset < world.periods[-1].at, "the window must hold a counter reset"
    pods = len(world.prometheus.history.pods)  # type: ignore[attr-defined]
    off = []
    for p in world.periods:
        assert p.result is not None and p.result.decision.demand is not None, p.at
        # rate(…[2m]) at a scrape time is the mean of the trace's last two minutes.
        expected = float(np.mean([trace.values[trace.index_at(p.at - timedelta(minutes=k))] for k in (1, 2)]))
        error = abs(p.result.decision.demand - expected) / expected
        if error > 1e-6:
            off.append((p.index, error))
    # Only where the counter restarted: rate() loses the half scrape interval of one pod's counter
    # before its restart (≤ 1/(2 × pods × samples in range)); never a drop to zero.
    assert off and len(off) <= 2, off
    assert max(e for _, e in off) <= 1 / (2 * pods * 2) + 0.01, off


def _check_frozen(world: World, s: Scenario) -> None:
    onset = next(p for p in world.periods if p.strategy == "hold")
    cond = onset.condition("MetricsUnavailable")
    assert cond is not None and "old" in cond["message"], cond


def _check_api_outage(world: World, s: Scenario) -> None:
    f0, f1 = s.fault
    for p in world.periods[f0:f1]:
        assert p.outcome == "retry" and p.retry_delay == 10.0
        assert 503 in p.api_statuses
    assert world.periods[f1 - 1].status.get("strategy") == world.periods[f0 - 1].status.get("strategy")
    assert world.periods[f1].status.get("strategy") == world.periods[f0 - 1].status.get("strategy")
    # Exponential backoff: within one failed call the delays grow (0.25–0.5, 0.5–1, 1–2, 2–4 s).
    grew = world.kube_sleeps[:4]
    assert len(grew) == 4 and all(b > a for a, b in zip(grew, grew[1:], strict=False)), world.kube_sleeps
    # Reported once the status can be written again: how many reconciles failed, and on what.
    cond = world.periods[f1].condition("ApiDegraded")
    assert cond is not None and cond["status"] == "True" and cond["reason"] == "ReconcileFailed", cond
    assert f"{f1 - f0} reconcile(s) failed" in cond["message"] and "503" in cond["message"], cond
    assert world.periods[f1].samples.get('predictive_scaler_reconcile_errors_total{kind="cluster"}', 0) >= f1 - f0


def _retries(world: World, kind: str) -> float:
    return world.periods[-1].samples.get(f'predictive_scaler_api_retries_total{{kind="{kind}"}}', 0.0)


def _check_absorbed(world: World, s: Scenario, status: int, kind: str) -> None:
    """Every error answer of this kind was retried, counted, and reported as absorbed."""
    answered = sum(p.api_statuses.count(status) for p in world.periods)
    assert _retries(world, kind) == answered, (_retries(world, kind), answered)
    reasons = {c["reason"] for p in world.periods if (c := p.condition("ApiDegraded")) and c["status"] == "True"}
    assert reasons == {"RetriesAbsorbed"}, reasons
    # Deduplicated: one Event per message and EVENT_REPEAT_SECONDS, not one per period.
    posted = [p.index for p in world.periods for e in p.events if e.reason == "ClusterApiErrors"]
    assert 1 <= len(posted) <= math.ceil((s.fault[1] - s.fault[0]) * 60 / 600) + 1, posted


def _check_conflicts(world: World, s: Scenario) -> None:
    assert all(p.outcome == "ok" for p in world.periods)
    conflicts = sum(p.api_statuses.count(409) for p in world.periods)
    assert conflicts >= (s.fault[1] - s.fault[0]) // 2, conflicts
    _check_absorbed(world, s, 409, "conflict")


def _check_throttle(world: World, s: Scenario) -> None:
    assert all(p.outcome == "ok" for p in world.periods)
    assert sum(p.api_statuses.count(429) for p in world.periods) == s.fault[1] - s.fault[0]
    assert sum(1 for d in world.kube_sleeps if d >= 1.0) >= s.fault[1] - s.fault[0]
    _check_absorbed(world, s, 429, "throttled")


def _check_clock_ahead(world: World, s: Scenario) -> None:
    # The controller's clock asks for a time Prometheus has no samples for yet: named, not just "no series".
    for p in world.periods[s.fault[0]: s.fault[1]]:
        cond = p.condition("MetricsUnavailable")
        assert cond is not None and "possible clock skew" in cond["message"], cond
    assert not any("clock skew" in r for p in world.periods[s.fault[1]:] for r in p.status.get("reasons", ()))


def _check_tampered(world: World, s: Scenario) -> None:
    cond = world.periods[s.fault[0]].condition("ModelInvalid")
    assert cond is not None and "sha256" in cond["message"], cond


def _check_kept_previous(world: World, s: Scenario) -> None:
    cond = world.periods[s.fault[0]].condition("ModelInvalid")
    assert cond is not None and cond["reason"] == "PreviousVersionKept", cond


def _check_hundredfold(world: World, s: Scenario) -> None:
    f0, f1 = s.fault
    first = world.periods[f0].result
    assert first is not None and first.decision.strategy == "predictive"
    d = first.decision
    assert d.predicted_replicas == world.parsed_spec.max_replicas and "max-replicas" in d.limits
    assert "budget" in d.limits
    peak = float(np.nanmax(world.prometheus.history.trace.values))  # type: ignore[attr-defined]
    assert d.forecast_pod_lead is not None and d.forecast_pod_lead > 20 * peak
    strategies = [p.strategy for p in world.periods[f0:f1]]
    assert "reactive" in strategies, f"over-forecast drift never detected: {strategies}"
    recovered = next(i for i, p in enumerate(world.periods[f1:]) if p.strategy == "predictive")
    recovery_periods = math.ceil(world.parsed_spec.drift.recovery_seconds / 60) + 1
    assert recovered <= recovery_periods
    assert set(p.strategy for p in world.periods[f1 + recovered:]) == {"predictive"}


def _check_pending(world: World, s: Scenario) -> None:
    before = world.periods[:20]
    assert any((p.placeholder_replicas or 0) > 0 for p in before), "no placeholder to get stuck"
    for p in before:
        assert p.result is not None
        # Pending placeholder pods are never counted as the target's capacity.
        assert p.result.cluster.ready_replicas == p.replicas_before
    assert world.periods[20].placeholder_replicas is None, "forecast-only left the placeholder behind"
    assert all(p.placeholder_replicas is None for p in world.periods[20:])


CHECKS: dict[str, Callable[[World, Scenario], None]] = {
    "baseline": _check_baseline,
    "prometheus-503": _check_proxy_retries,
    "prometheus-timeout": _check_proxy_retries,
    "prometheus-slow": _check_slow,
    "prometheus-empty": _check_empty,
    "prometheus-duplicated": _check_duplicated,
    "counter-resets": _check_counter_resets,
    "frozen-dcgm": _check_frozen,
    "api-5xx-2m": _check_api_outage,
    "api-409-every-2nd": _check_conflicts,
    "api-429": _check_throttle,
    "clock-ahead-10m": _check_clock_ahead,
    "tampered-model": _check_tampered,
    "bad-new-version": _check_kept_previous,
    "forecast-100x": _check_hundredfold,
    "placeholders-pending": _check_pending,
}


def test_trace_time_is_on_the_model_grid(prometheus_server: BackfilledPrometheus) -> None:
    t = trace_time(prometheus_server, timedelta(days=3, minutes=7))
    assert t.timestamp() % 300 == 60

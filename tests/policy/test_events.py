"""Scheduled events: validation (one path, spec.py), when an event is in force, and the planner's raise."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from predictive_scaler.core.values import DemandSample
from predictive_scaler.errors import ConfigError
from predictive_scaler.policy import events as ev
from predictive_scaler.policy.planner import ClusterState, plan
from predictive_scaler.policy.reasons import EventAsk, EventRaised, Limit
from predictive_scaler.policy.state import PlannerState
from predictive_scaler.spec import ScalerSpec

START = "2025-11-28T09:00:00+01:00"  # 08:00 UTC
T0 = datetime(2025, 11, 28, 8, 0, tzinfo=UTC).timestamp()


def spec(*events: dict[str, Any], **over: Any) -> ScalerSpec:
    doc: dict[str, Any] = {"target": {"name": "llm"}, "demand": {"query": "q"},
                           "capacity": {"requestsPerReplica": 10}, "maxReplicas": 20,
                           "leadTimes": {"podStartSeconds": 60, "nodeStartSeconds": 240},
                           "controlPeriodSeconds": 60, "events": list(events)}
    doc.update(over)
    return ScalerSpec.from_dict(doc)


def event(**over: Any) -> dict[str, Any]:
    return {"name": "launch", "start": START, "end": "2025-11-28T11:00:00+01:00", "minReplicas": 12, **over}


@pytest.mark.parametrize(("bad", "field", "words"), [
    (event(start="2025-11-28T09:00:00"), "spec.events[0].start", "offset"),
    (event(start="28/11/2025 09:00"), "spec.events[0].start", "RFC 3339"),
    (event(end="2025-11-28T13:99:00+01:00"), "spec.events[0].end", "not a valid date"),
    (event(end=START), "spec.events[0].end", "not after start"),
    (event(minReplicas=None), "spec.events[0].minReplicas", "exactly one"),
    (event(demandMultiplier=2.0), "spec.events[0].minReplicas", "exactly one"),
    (event(minReplicas=None, demandMultiplier=0.5), "spec.events[0].demandMultiplier", "at least 1"),
    (event(minReplicas=21), "spec.events[0].minReplicas", "maxReplicas"),
    (event(recurrence="daily"), "spec.events[0].recurrence", "weekly"),
    (event(end="2025-12-06T09:00:00+01:00", recurrence="weekly"), "spec.events[0].end", "7 days"),
    (event(name=""), "spec.events[0].name", "empty"),
    (event(colour="red"), "spec.events[0].colour", "unknown field"),
], ids=["no-offset", "not-rfc3339", "bad-minute", "end-not-after-start", "neither", "both",
        "multiplier-below-1", "floor-above-max", "unknown-recurrence", "weekly-too-long", "no-name", "unknown-key"])
def test_bad_events_name_the_field(bad: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as info:
        spec(bad)
    assert info.value.field == field


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(ConfigError, match="unique") as info:
        spec(event(), event(start="2025-12-01T09:00:00Z", end="2025-12-01T10:00:00Z"))
    assert info.value.field == "spec.events[1].name"


def test_too_many_events_are_refused() -> None:
    many = [event(name=f"e{i}") for i in range(101)]
    with pytest.raises(ConfigError, match="at most 100") as info:
        spec(*many)
    assert info.value.field == "spec.events"


def test_keda_mode_refuses_placeholders() -> None:
    with pytest.raises(ConfigError, match="mode 'keda'") as info:
        spec(mode="keda", prewarm={"enabled": True})
    assert info.value.field == "spec.prewarm.enabled"


def test_events_round_trip() -> None:
    s = spec(event(), event(name="sale", minReplicas=None, demandMultiplier=1.5, recurrence="weekly"))
    assert ScalerSpec.from_dict(s.to_dict()) == s


LEAD = 300  # node start 240 + control period 60


@pytest.mark.parametrize(("offset", "weekly", "in_force"), [
    (-LEAD - 1, False, False),
    (-LEAD, False, True),
    (0, False, True),
    (2 * 3600 - 1, False, True),
    (2 * 3600, False, False),
    (7 * 86400 + 60, False, False),
    (7 * 86400 - LEAD, True, True),
    (7 * 86400 + 3600, True, True),
    (7 * 86400 + 2 * 3600, True, False),
    (-7 * 86400, True, False),
], ids=["before-lead", "lead-starts", "start", "last-second", "end-exclusive", "a-week-later-once",
        "weekly-lead", "weekly-inside", "weekly-end", "weekly-never-before-first"])
def test_in_force(offset: int, weekly: bool, in_force: bool) -> None:
    s = spec(event(recurrence="weekly" if weekly else None))
    assert bool(ev.in_force(s.events, T0 + offset, ev.lead_seconds(s))) is in_force


def test_occurrences_of_a_weekly_event() -> None:
    s = spec(event(recurrence="weekly"))
    found = ev.occurrences(s.events, T0 + 3600, T0 + 15 * 86400)
    assert [o.start - T0 for o in found] == [0, 7 * 86400, 14 * 86400]


def decide(s: ScalerSpec, offset: float, demand: float | None = 30.0, replicas: int = 3) -> Any:
    now = datetime.fromtimestamp(T0 + offset, UTC)
    sample = None if demand is None else DemandSample(demand, now)
    d, _ = plan(s, None, sample, ClusterState(replicas, replicas), PlannerState(), now)
    return d


@pytest.mark.parametrize(("events", "offset", "demand", "expected", "named"), [
    ([], 0, 30.0, 3, ()),
    ([event()], -LEAD - 60, 30.0, 3, ()),
    ([event()], -LEAD, 30.0, 12, ("launch",)),
    ([event()], 3600, 30.0, 12, ("launch",)),
    ([event()], 3600, 150.0, 12, ("launch",)),  # the reactive ask (7, rate-limited) is below the floor
    ([event(minReplicas=None, demandMultiplier=2.0)], 60, 30.0, 6, ("launch",)),
    ([event(minReplicas=20), event(name="b", minReplicas=5)], 60, 30.0, 20, ("launch", "b")),
    ([event()], 60, None, 12, ("launch",)),  # missing demand: the floor still holds
], ids=["none", "before", "lead", "inside", "reactive-below-floor", "multiplier", "largest-wins", "missing-demand"])
def test_the_planner_raises_to_the_event(events: list[dict[str, Any]], offset: float, demand: float | None,
                                         expected: int, named: tuple[str, ...]) -> None:
    d = decide(spec(*events), offset, demand)
    assert d.desired_replicas == expected
    assert d.scheduled_events == named
    if named:
        assert Limit.EVENT in d.limits
        assert {r.name for r in d.reasons if isinstance(r, EventAsk)} == set(named)


def test_the_raise_is_not_speculative_and_stays_within_max_replicas() -> None:
    s = spec(event(minReplicas=20), maxReplicas=20, prewarm={"budget": {"maxGpus": 0}})
    d = decide(s, 60)
    assert d.desired_replicas == 20
    assert d.speculative_gpus == 0  # an empty budget, and still the floor the user asked for


def test_a_plan_above_the_floor_is_kept() -> None:
    d = decide(spec(event()), 3600, demand=150.0, replicas=15)
    assert d.desired_replicas == 15
    assert [(r.before, r.to) for r in d.reasons if isinstance(r, EventRaised)] == [(15, 15)]
    assert "already cover" in " ".join(d.sentences)

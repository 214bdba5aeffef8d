"""Cost–service frontiers: each tunable policy at several operating points of its own knob.

- ``reactive`` and ``holt-winters``: HPA target utilisation 0.30 … 0.95 in steps of 0.05;
- ``predictive``: its own planning target (``predictive_target_utilization``, the share of a
  replica's capacity it plans on; its P95 × intra-step peak factor is the rest of its headroom);
- ``static``: fleet sizes from one replica to ``maxReplicas``;
- ``oracle``: one point (perfect foresight with the same lead times).

The **reference curve** of a policy is the lower envelope of its points — the cheapest point serving
at least a given share of demand — linearly interpolated between neighbours on that envelope, and
undefined beyond its highest point. The **headline** is read at the share the predictive default point
serves: cost ratio (predictive GPU-h ÷ reference GPU-h) and gap closed ((reference − predictive) ÷
(reference − oracle)) against reactive and against Holt-Winters, and the unmet ratio at equal cost
(predictive unmet minutes ÷ the fewest unmet minutes reactive reaches for the predictive GPU-hours,
interpolated the same way). A point of any peer policy — reactive, Holt-Winters and every static fleet
size; not the oracle, which no controller can run — that serves more than the predictive default point
for less is listed under ``dominated_by`` (a fixed fleet that beats it on both says as much against the
policy as a better-tuned autoscaler does).

The **service alternative** is the predictive default point once more with ``spec.service.enabled``
the other way round, read against the same curves (:class:`ServiceAlternative`): what the service
tracker would have bought (or, when on, saved) on this history. It is not a frontier point — the
tracker is a choice of contract, the user's SLO, not a knob a cost curve settles — so it never counts
in ``dominated_by`` or the headline.

Work is reused across operating points: the peers are cheap numpy/HPA loops; the predictive policy's
models and forecasts do not depend on its knob, so they are trained and computed once
(:class:`~predictive_scaler.backtest.adapters.PredictiveCache`) and only the reconciler is replayed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from predictive_scaler.backtest.adapters import PredictiveCache, run_predictive
from predictive_scaler.backtest.measures import measure_policy
from predictive_scaler.backtest.records import Progress, Setup, prepare
from predictive_scaler.backtest.runner import (
    Result,
    _clean,
    hpa_run,
    initial_replicas,
    run_backtest,
)
from predictive_scaler.backtest.scenario import Scenario, deep_merge
from predictive_scaler.backtest.simulator import PolicyRun, SimulatedCluster, simulate
from predictive_scaler.series import Series

#: HPA targets the reactive and Holt-Winters frontiers run at.
HPA_TARGETS: tuple[float, ...] = tuple(round(0.30 + 0.05 * i, 2) for i in range(14))
#: The predictive policy's own planning targets.
PREDICTIVE_TARGETS: tuple[float, ...] = (0.7, 0.8, 0.9, 1.0)
#: At most this many static fleet sizes (evenly spread over 1 … maxReplicas).
STATIC_POINTS = 12

#: Frontier policies that are not peers for dominance: the bound no controller reaches, and predictive itself.
NOT_PEERS = frozenset({"predictive", "oracle"})

HEADLINE_KEYS = ("cost_ratio_vs_reactive", "gap_closed_vs_reactive", "unmet_ratio_vs_reactive",
                 "cost_ratio_vs_holt_winters", "gap_closed_vs_holt_winters")


@dataclass(frozen=True)
class Point:
    knob: dict[str, float | int]
    gpu_hours: float
    slo_attainment: float | None
    unmet_minutes: float
    default: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"knob": dict(self.knob), "gpu_hours": self.gpu_hours,
                               "slo_attainment": self.slo_attainment, "unmet_minutes": self.unmet_minutes}
        if self.default:
            out["default"] = True
        return out


@dataclass(frozen=True)
class ServiceAlternative:
    """The predictive default point with the service tracker switched the other way (``enabled``: as
    it ran here), its headline and the peer points that beat it, against the frontier's curves."""

    enabled: bool
    point: Point
    headline: dict[str, float | None]
    dominated_by: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"service_enabled": self.enabled, **self.point.to_dict(), "headline": dict(self.headline),
                "dominated_by": list(self.dominated_by)}


@dataclass
class FrontierResult:
    base: Result
    frontier: dict[str, list[Point]]
    headline: dict[str, float | None]
    dominated_by: list[dict[str, Any]]
    wall_seconds: float
    service_alternative: ServiceAlternative | None = None

    def to_json(self) -> dict[str, Any]:
        doc = self.base.to_json()
        doc["frontier"] = {name: [p.to_dict() for p in points] for name, points in self.frontier.items()}
        doc["headline"] = dict(self.headline)
        doc["frontier_checks"] = {
            "predictive_default": self.predictive_default.to_dict(),
            "oracle_gpu_hours": self.oracle_gpu_hours,
            "dominated_by": self.dominated_by,
            "wall_seconds": self.wall_seconds,
        }
        if self.service_alternative is not None:
            doc["frontier_checks"]["service_alternative"] = self.service_alternative.to_dict()
        return _clean(doc)

    @property
    def predictive_default(self) -> Point:
        return next(p for p in self.frontier["predictive"] if p.default)

    @property
    def oracle_gpu_hours(self) -> float | None:
        points = self.frontier.get("oracle")
        return points[0].gpu_hours if points else None


def _point(run: PolicyRun, setup: Setup, knob: dict[str, float | int], default: bool = False) -> Point:
    m = measure_policy(run, setup.demand, setup.scenario.cluster, reactive_billed=run.billed_gpus,
                       reactive_need=setup.demand.need(), demand_unit_seconds=setup.scenario.demand_unit_seconds)
    return Point(knob, m.gpu_hours, m.slo_attainment, m.unmet_minutes, default)


def _from_measures(result: Result, name: str, knob: dict[str, float | int]) -> Point:
    m = result.measures[name]
    return Point(knob, m.gpu_hours, m.slo_attainment, m.unmet_minutes, True)


def _static(setup: Setup, replicas: int) -> PolicyRun:
    def control(i: int, now_s: float, cluster: SimulatedCluster) -> bool:
        cluster.apply(replicas, 0, now_s)
        return False

    return simulate("static", control, setup.n_ticks, setup.tick_s, setup.scenario.cluster,
                    initial_replicas=replicas, control_every=setup.control_every)


def static_sizes(max_replicas: int, points: int = STATIC_POINTS) -> list[int]:
    return sorted({max(1, round(x)) for x in np.linspace(1, max_replicas, min(points, max_replicas))})


def run_frontier(
    trace: Series,
    scenario: Scenario,
    *,
    progress_factory: Callable[[str, int], Progress] | None = None,
    hpa_targets: Sequence[float] = HPA_TARGETS,
    predictive_targets: Sequence[float] = PREDICTIVE_TARGETS,
    say: Callable[[str], None] | None = None,
    service_alternative: bool = True,
) -> FrontierResult:
    """Every policy of ``scenario`` at its default point (a plain backtest) and at its frontier's points;
    with ``service_alternative``, the predictive default point with the service tracker switched."""
    started = time.perf_counter()
    cache = PredictiveCache()
    base = run_backtest(trace, scenario, progress_factory=progress_factory, cache=cache)
    setup = base.setup
    first = initial_replicas(setup)
    default_u = scenario.target_utilization
    frontier: dict[str, list[Point]] = {}

    def note(text: str) -> None:
        if say is not None:
            say(text)

    for name in ("reactive", "holt-winters"):
        if name not in scenario.policies:
            continue
        points = []
        for u in sorted(set(hpa_targets) | {default_u}):
            if math.isclose(u, default_u):
                points.append(_from_measures(base, name, {"target_utilization": u}))
                continue
            points.append(_point(hpa_run(setup, name, u, initial_replicas=first), setup, {"target_utilization": u}))
        frontier[name] = points
        note(f"{name}: {len(points)} operating points")
    if "predictive" in scenario.policies:
        pu = scenario.planning_utilization
        points = []
        for u in sorted(set(predictive_targets) | {pu}):
            knob = {"predictive_target_utilization": u}
            if math.isclose(u, pu):
                points.append(_from_measures(base, "predictive", knob))
                continue
            other = prepare(trace, replace(scenario, predictive_target_utilization=u))
            run, _ = run_predictive(other, initial_replicas=first, cache=cache,
                                    progress=progress_factory("predictive", other.n_ticks) if progress_factory else None)
            points.append(_point(run, other, knob))
            note(f"predictive at target {u:g}: {points[-1].gpu_hours:,.0f} GPU-h, "
                 f"{100 * (points[-1].slo_attainment or 0):.2f} % served")
        frontier["predictive"] = points
    if "static" in scenario.policies:
        frontier["static"] = [_point(_static(setup, r), setup, {"replicas": r}) for r in static_sizes(setup.max_replicas)]
    if "oracle" in scenario.policies:
        frontier["oracle"] = [_from_measures(base, "oracle", {})]
    result = FrontierResult(base, frontier, {}, [], 0.0)
    if "predictive" in frontier:
        result.headline, result.dominated_by = headline(frontier)
        if service_alternative:
            result.service_alternative = _service_alternative(trace, scenario, setup, frontier, cache, first,
                                                              progress_factory)
            alt = result.service_alternative
            note(f"predictive with spec.service.enabled {str(alt.enabled).lower()}: {alt.point.gpu_hours:,.0f} GPU-h, "
                 f"{100 * (alt.point.slo_attainment or 0):.2f} % served")
    result.wall_seconds = time.perf_counter() - started
    return result


def _service_alternative(trace: Series, scenario: Scenario, setup: Setup, frontier: dict[str, list[Point]],
                         cache: PredictiveCache, first: int,
                         progress_factory: Callable[[str, int], Progress] | None) -> ServiceAlternative:
    """The predictive default point again with ``spec.service.enabled`` flipped; the forecasts are the
    cache's (the tracker changes only what is planned on them), so only the reconciler is replayed."""
    enabled = not setup.spec.service.enabled
    flipped = prepare(trace, replace(scenario, spec=deep_merge(scenario.spec, {"service": {"enabled": enabled}})))
    run, _ = run_predictive(flipped, initial_replicas=first, cache=cache,
                            progress=progress_factory("predictive", flipped.n_ticks) if progress_factory else None)
    point = _point(run, flipped, {"predictive_target_utilization": scenario.planning_utilization}, default=True)
    figures, beaten = headline({**frontier, "predictive": [point]})
    return ServiceAlternative(enabled, point, figures, beaten)


# -- reference curves ---------------------------------------------------------------------------------

def envelope(points: Sequence[Point]) -> list[Point]:
    """The lower envelope: points no other point beats on both cost and share served, by share ascending."""
    usable = sorted((p for p in points if p.slo_attainment is not None), key=lambda p: (-p.slo_attainment, p.gpu_hours))  # type: ignore[operator]
    out: list[Point] = []
    cheapest = math.inf
    for p in usable:  # from the highest share down: keep a point only if it is cheaper than every higher one
        if p.gpu_hours < cheapest:
            out.append(p)
            cheapest = p.gpu_hours
    return out[::-1]


def reference_cost(points: Sequence[Point], share: float) -> float | None:
    """GPU-hours of the reference curve at ``share`` served; None beyond its highest point."""
    env = envelope(points)
    if not env or share > (env[-1].slo_attainment or 0.0) + 1e-12:
        return None
    for a, b in zip(env, env[1:], strict=False):
        sa, sb = a.slo_attainment or 0.0, b.slo_attainment or 0.0
        if share <= sa:
            return a.gpu_hours
        if share <= sb:
            return a.gpu_hours + (b.gpu_hours - a.gpu_hours) * (share - sa) / (sb - sa) if sb > sa else b.gpu_hours
    return env[0].gpu_hours if share <= (env[0].slo_attainment or 0.0) else env[-1].gpu_hours


def reference_unmet(points: Sequence[Point], gpu_hours: float) -> float | None:
    """Fewest unmet minutes the policy reaches for ``gpu_hours`` (lower envelope by cost, interpolated);
    None below its cheapest point."""
    pts = sorted(points, key=lambda p: (p.gpu_hours, p.unmet_minutes))
    env: list[Point] = []
    for p in pts:
        if not env or p.unmet_minutes < env[-1].unmet_minutes:
            env.append(p)
    if not env or gpu_hours < env[0].gpu_hours:
        return None
    for a, b in zip(env, env[1:], strict=False):
        if gpu_hours < b.gpu_hours:
            return a.unmet_minutes + (b.unmet_minutes - a.unmet_minutes) * (gpu_hours - a.gpu_hours) / (b.gpu_hours - a.gpu_hours)
    return env[-1].unmet_minutes


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def headline(frontier: dict[str, list[Point]]) -> tuple[dict[str, float | None], list[dict[str, Any]]]:
    """The headline figures at the predictive default point, and the peer points that beat it: those of every
    policy but the oracle (static fleets included) both cheaper and serving more."""
    pred = next(p for p in frontier["predictive"] if p.default)
    share = pred.slo_attainment or 0.0
    oracle = frontier["oracle"][0].gpu_hours if frontier.get("oracle") else None
    out: dict[str, float | None] = {}
    for name, key in (("reactive", "reactive"), ("holt-winters", "holt_winters")):
        ref = reference_cost(frontier[name], share) if name in frontier else None
        out[f"cost_ratio_vs_{key}"] = _ratio(pred.gpu_hours, ref)
        gap = None
        if ref is not None and oracle is not None and ref - oracle > 1e-9:
            gap = (ref - pred.gpu_hours) / (ref - oracle)
        out[f"gap_closed_vs_{key}"] = gap
        if name == "reactive":
            ref_unmet = reference_unmet(frontier[name], pred.gpu_hours) if name in frontier else None
            out["unmet_ratio_vs_reactive"] = _ratio(pred.unmet_minutes, ref_unmet)
    beaten = [{"policy": name, **p.to_dict()} for name, points in frontier.items() if name not in NOT_PEERS
              for p in points if p.gpu_hours < pred.gpu_hours and (p.slo_attainment or 0.0) > share]
    return {k: out.get(k) for k in HEADLINE_KEYS}, beaten

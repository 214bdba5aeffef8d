"""The dcgm-busy-gpus guard, driven through the controller on the real H200 ladders.

Each ladder (backtests/telemetry/) is replayed through the controller's own demand path: a kopf
reconcile every minute (tests/reliability/harness.py's World: the fake API server, an injected
clock), demand kind ``dcgm-busy-gpus``, target utilisation 0.7, maxReplicas 20. Each rung of the
ladder lasts three control periods; its served rate is the workload's load, split evenly across
the replicas the Deployment has, and each replica's GPU utilisation and latency are looked up in
the ladder at that replica's own load (linear between the rungs measured; an idle GPU reads 0 %).
So a replica added reads what the real server read at the lower per-replica load.

The continuous-batching decoder reads 97 % from a tenth of its capacity: scaled on that, the
workload climbs to maxReplicas while one replica could serve it. With the guard, the controller
holds and says why. The serial decoder's utilisation tracks its load: it still scales.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from benchmarks.gpu_ladders import plateau, steps
from predictive_scaler.core.values import DemandSample
from predictive_scaler.errors import SourceError
from predictive_scaler.forecasting.store import ModelStore
from predictive_scaler.policy.saturation import ServingHistory
from predictive_scaler.series import Series
from tests.reliability.harness import INTERVAL, World
from tests.support.fakes.apiserver import FakeApiServer

START = datetime(2026, 12, 4, 17, 0, tzinfo=UTC)
#: Control periods per rung of the ladder.
PERIODS_PER_RUNG = 3
SPEC: dict[str, Any] = {
    "mode": "scale",
    "target": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
    "demand": {"kind": "dcgm-busy-gpus"},
    "capacity": {"gpuUtilizationTarget": 0.7},
    "minReplicas": 1, "maxReplicas": 20,
    "leadTimes": {"podStartSeconds": 60, "nodeStartSeconds": 300},
    "prewarm": {"enabled": False},
    "model": {"name": "llm"},
}


class LadderReplay:
    """The ladder as a workload's metrics: busy GPUs now, and (``with_history``) its serving history."""

    def __init__(self, name: str, replicas: Callable[[], int]) -> None:
        rungs = steps(name)
        self.load = [s.served for s in rungs]
        # Per-replica lookup: the rungs by served rate (a saturated rung repeats the rate: first kept).
        table = sorted({round(s.served, 1): s for s in reversed(rungs)}.items())
        self.rate = np.array([0.0] + [k for k, _ in table])
        self.util = np.array([0.0] + [s.gpu_util for _, s in table])
        self.latency = np.array([table[0][1].mean_ms] + [s.mean_ms for _, s in table]) / 1000
        self.replicas = replicas
        self.samples: dict[int, tuple[float, int, float, float]] = {}

    def period(self, now: datetime) -> int:
        return int((now - START).total_seconds() // INTERVAL)

    def sample(self, now: datetime) -> tuple[float, int, float, float]:
        """(workload req/s, replicas, mean GPU utilisation %, latency s) of the period ``now`` falls in."""
        i = self.period(now)
        if i not in self.samples:
            load = self.load[min(i // PERIODS_PER_RUNG, len(self.load) - 1)]
            n = max(1, self.replicas())
            each = load / n
            util = float(np.interp(each, self.rate, self.util))
            latency = float(np.interp(each, self.rate, self.latency))
            self.samples[i] = (load, n, util, latency)
        return self.samples[i]

    def demand_now(self, now: datetime) -> DemandSample:
        _, n, util, _ = self.sample(now)
        return DemandSample(n * util / 100, now)

    def recent(self, now: datetime, window: timedelta, step_seconds: int) -> Series:
        raise SourceError("the replay keeps no history for a model: the controller runs reactive")

    def history(self, now: datetime) -> ServingHistory:
        self.sample(now)
        first, last = min(self.samples), self.period(now)
        rows = [self.samples.get(i, (math.nan,) * 4) for i in range(first, last + 1)]
        start = pd.Timestamp(START + timedelta(seconds=INTERVAL * first))

        def s(k: int) -> Series:
            return Series(np.array([r[k] for r in rows], dtype=float), start, int(INTERVAL))

        return ServingHistory(throughput=s(0), gpus=s(1), utilisation=s(2), latency=s(3))


class GuardedReplay(LadderReplay):
    """The replay with the serving history the guard reads (a metrics port that can give it)."""

    def serving_history(self, now: datetime, window: timedelta) -> ServingHistory:
        return self.history(now)


def replay(api: FakeApiServer, store: Path, ladder: str, *, guarded: bool, replicas: int) -> World:
    holder: dict[str, World] = {}
    port = (GuardedReplay if guarded else LadderReplay)(ladder, lambda: holder["w"].target_replicas())
    world = World(api, ModelStore(store), "http://127.0.0.1:9", START, SPEC, replicas=replicas, metrics=port)
    holder["w"] = world
    world.run(len(port.load) * PERIODS_PER_RUNG + 3)
    return world


def trajectory(world: World) -> list[int]:
    """The Deployment's replicas after each period (printed: docs/gpu-capacity.md quotes them)."""
    replicas = [p.scale_replicas for p in world.periods]
    print(f"{world.metrics.__class__.__name__}: {replicas}")
    return replicas


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "models"  # empty: no model, so the controller decides reactively on the demand


def test_the_batching_decoder_does_not_climb_to_max_replicas_when_guarded(fake_api: FakeApiServer,
                                                                         store: Path) -> None:
    world = replay(fake_api, store, "decoder-batched", guarded=True, replicas=2)
    peak_load = max(steps("decoder-batched"), key=lambda s: s.served).served
    capacity = plateau("decoder-batched")
    assert capacity is not None
    need = math.ceil(peak_load / capacity)  # replicas the plateau needs at the ladder's peak
    assert max(trajectory(world)) <= need + 1, trajectory(world)
    last = world.periods[-1]
    cond = last.condition("DemandSignalSaturated")
    assert cond is not None and cond["status"] == "True" and cond["reason"] == "UtilisationPinned", cond
    assert "demand.kind: requests" in cond["message"]
    posted = [e for p in world.periods for e in p.events if e.reason == "DemandSignalSaturated"]
    assert posted and posted[0].type == "Warning" and "pinned" in posted[0].message
    # Withheld on purpose: no metrics error is counted for it.
    assert world.errors("metrics") == 0


def test_unguarded_the_batching_decoder_climbs_to_max_replicas(fake_api: FakeApiServer, store: Path) -> None:
    """The same replay without a serving history (as before the guard): utilisation drives it to maxReplicas —
    19 of 20 at the top rung, where 19 replicas read 20.1 replicas' worth of busy GPUs, inside the HPA's 10 %
    tolerance; one replica would serve that load."""
    world = replay(fake_api, store, "decoder-batched", guarded=False, replicas=2)
    assert max(trajectory(world)) >= SPEC["maxReplicas"] - 1, trajectory(world)
    cond = world.periods[-1].condition("DemandSignalSaturated")
    assert cond is not None and cond["status"] == "Unknown" and cond["reason"] == "NotChecked"


def test_the_serial_decoder_still_scales_with_load(fake_api: FakeApiServer, store: Path) -> None:
    world = replay(fake_api, store, "decoder-serial", guarded=True, replicas=1)
    replicas = trajectory(world)
    assert replicas[0] == 1 and max(replicas) >= 2, replicas
    # It scaled when the load did: not before the rung where one GPU saturates.
    first_up = next(i for i, r in enumerate(replicas) if r > 1)
    saturating = next(k for k, s in enumerate(steps("decoder-serial")) if s.gpu_util >= 90)
    assert first_up >= saturating * PERIODS_PER_RUNG, replicas
    cond = world.periods[-1].condition("DemandSignalSaturated")
    assert cond is not None and cond["status"] == "False" and cond["reason"] == "UtilisationTracksLoad", cond
    assert not [e for p in world.periods for e in p.events if e.reason == "DemandSignalSaturated"]


# -- the guard's edge, without a controller ----------------------------------------------------------
class _Inner:
    def demand_now(self, now: datetime) -> DemandSample:
        return DemandSample(1.5, now)

    def recent(self, now: datetime, window: timedelta, step_seconds: int) -> Series:
        raise SourceError("none")


class _History:
    def __init__(self, history: ServingHistory | None) -> None:
        self.history = history

    def serving_history(self, now: datetime, window: timedelta) -> ServingHistory:
        if self.history is None:
            raise SourceError("connection refused (fake)")
        return self.history


def _ladder_history(name: str) -> ServingHistory:
    from benchmarks.gpu_ladders import ladder_series
    s = ladder_series(name, 15, 5)
    ones = Series(np.ones(len(s.served)), s.served.start, 5)
    return ServingHistory(s.served, ones, s.gpu_util, s.mean_latency)


def test_the_guard_withholds_a_pinned_reading_and_passes_a_tracking_one() -> None:
    from predictive_scaler.controller.demand_guard import GuardedDemand
    pinned = GuardedDemand(_Inner(), _History(_ladder_history("decoder-batched")))
    with pytest.raises(SourceError, match="demand signal saturated: GPU utilisation is pinned"):
        pinned.demand_now(START)
    assert pinned.last is not None and pinned.last.fired
    tracking = GuardedDemand(_Inner(), _History(_ladder_history("decoder-serial")))
    assert tracking.demand_now(START).value == 1.5
    assert tracking.last is not None and tracking.last.verdict == "tracks-load"


def test_no_serving_history_is_no_verdict_and_the_reading_passes() -> None:
    from predictive_scaler.controller.demand_guard import GuardedDemand
    from predictive_scaler.controller.status import demand_signal_condition
    guard = GuardedDemand(_Inner(), _History(None))
    assert guard.demand_now(START).value == 1.5
    assert guard.last is not None and guard.last.verdict == "unknown"
    cond = demand_signal_condition(guard.last)
    assert (cond.status, cond.reason) == ("Unknown", "ServingHistoryUnavailable") and "connection refused" in cond.message
    assert demand_signal_condition(None).reason == "NotChecked"

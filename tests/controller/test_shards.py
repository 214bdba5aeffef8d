"""Sharding: two shards split 1,000 scalers, none is acted on twice (also while a third joins), and the
cluster-wide speculative budget holds across shards."""

from __future__ import annotations

import random

import pytest

from predictive_scaler.controller.budget import ClusterBudget
from predictive_scaler.controller.settings import ClusterBudgetLimits
from predictive_scaler.controller.shards import ShardedBudget, ShardMembership, shard_limits
from predictive_scaler.kube.client import KubeCluster
from tests.support.fakes.apiserver import FakeApiServer, ResourceType

NS = "predictive-scaler-system"
LEASE = ResourceType("coordination.k8s.io", "v1", "Lease", "leases", builtin=False)
SCALERS = [("ml", f"llm-{i:04d}") for i in range(1000)]


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def leases(fake_api: FakeApiServer) -> FakeApiServer:
    fake_api.register_type(LEASE)
    return fake_api


def member(kube: KubeCluster, index: int, count: int, clock: Clock, who: str | None = None) -> ShardMembership:
    return ShardMembership(kube, NS, index, count, who or f"controller-{index}-of-{count}", clock=clock)


def owners(members: list[ShardMembership]) -> dict[tuple[str, str], list[int]]:
    return {s: [m.index for m in members if m.owns(*s)] for s in SCALERS}


def test_two_shards_split_the_scalers_and_a_third_joins_without_double_action(leases, kube: KubeCluster) -> None:
    clock = Clock()
    a, b = member(kube, 0, 2, clock), member(kube, 1, 2, clock)
    assert a.renew() and b.renew()
    split = owners([a, b])
    assert all(len(o) == 1 for o in split.values()), "every scaler has exactly one shard"
    assert 400 < sum(o == [0] for o in split.values()) < 600

    # A third replica starts with count 3 (a StatefulSet scaled to 3, rolling out).
    c = member(kube, 2, 3, clock)
    assert not c.renew() and "changing" in (c.waiting or "")
    assert all(len(o) <= 1 for o in owners([a, b, c]).values()), "old shards still act, the new one waits"
    clock.t += 15
    assert not a.renew() and not b.renew(), "the old shards see the new count and stop"
    assert all(o == [] for o in owners([a, b, c]).values()), "nobody acts until the counts agree"

    # The old replicas restart with count 3 (new pods, new identities): they release, then take their Leases.
    a.release()
    b.release()
    a3, b3 = member(kube, 0, 3, clock, "controller-0-new"), member(kube, 1, 3, clock, "controller-1-new")
    states = []
    for m in (a3, b3, c):
        m.renew()
        states.append(owners([a, b, a3, b3, c]))
    assert all(len(o) <= 1 for state in states for o in state.values()), "never two shards on one scaler"
    assert all(c.renew() for c in (a3, b3, c))
    final = owners([a, b, a3, b3, c])
    assert all(len(o) == 1 for o in final.values()) and {o[0] for o in final.values()} == {0, 1, 2}


def test_a_replica_that_cannot_renew_stops_before_its_lease_can_be_taken(leases, kube: KubeCluster) -> None:
    clock = Clock()
    a = member(kube, 0, 1, clock)
    assert a.renew() and a.acting()
    clock.t += a.lease_seconds - a.margin  # no renewal since (API unreachable, say)
    assert not a.acting(), "stops acting a margin before the Lease expires"
    thief = member(kube, 0, 1, clock, "other-pod")
    assert not thief.renew(), "a live Lease held by another pod is not taken"
    clock.t += a.margin
    assert thief.renew() and thief.acting()


def test_a_lease_changed_since_read_is_not_overwritten(leases, kube: KubeCluster) -> None:
    clock = Clock()
    a = member(kube, 0, 1, clock)
    assert a.renew()
    leases.touch("coordination.k8s.io/v1", "Lease", NS, a.lease_name)  # someone else wrote it meanwhile
    stale = dict(a._raw[a.lease_name])
    with pytest.raises(Exception, match="409|changed"):
        kube.write_lease(NS, a._body(clock(), stale))


@pytest.mark.parametrize("total, count", [(100, 2), (100, 3), (7, 3)], ids=["100-2", "100-3", "7-3"])
def test_shard_shares_add_up_to_at_most_the_whole(total: int, count: int) -> None:
    limits = ClusterBudgetLimits(max_gpus=total, max_cost_per_hour=90.0)
    shares = [shard_limits(limits, i, count) for i in range(count)]
    assert sum(s.max_gpus or 0 for s in shares) == total
    assert sum(s.max_cost_per_hour or 0 for s in shares) <= 90.0 + 1e-9


def test_the_cluster_budget_holds_across_shards_also_while_a_third_joins() -> None:
    """1,000 scalers that each want 1 speculative GPU; a 100-GPU cluster cap; 2 shards, then 3."""
    limits = ClusterBudgetLimits(max_gpus=100)
    rng = random.Random(5)
    held: dict[tuple[str, str], int] = {}  # what each scaler's status says it holds (the record)

    def status_list():
        return [{"metadata": {"namespace": ns, "name": n}, "status": {"budgetInUse": {"gpus": held.get((ns, n), 0)}}}
                for ns, n in SCALERS]

    def run_periods(count: int, periods: int) -> None:
        from predictive_scaler.core.sharding import shard_of
        ledgers = []
        for i in range(count):
            sharded = ShardedBudget(limits, i, count)
            sharded.observe(status_list())
            ledger = ClusterBudget(sharded.limits_now())
            mine = [s for s in SCALERS if shard_of(f"{s[0]}/{s[1]}", count) == i]
            for s in mine:  # start-up: book what the status says (own shard only)
                ledger.seed("/".join(s), held.get(s, 0), 0.0, 0.0)
            ledgers.append((sharded, ledger, mine))
        for _ in range(periods):
            order = [(i, s) for i, (_, _, mine) in enumerate(ledgers) for s in mine]
            rng.shuffle(order)  # shards interleave
            for step, (i, s) in enumerate(order):
                sharded, ledger, _ = ledgers[i]
                if step % 100 == 0:  # each shard re-reads the others' statuses about once per period
                    sharded.observe(status_list())
                ledger.limits = sharded.limits_now()
                with ledger.reserve("/".join(s), None, 0.0) as r:
                    want = rng.choice([0, 1, 1, 2])
                    r.settle(want if r.allowed_gpus is None else min(want, r.allowed_gpus), 0.0)
                    held[s] = r.settled.gpus if r.settled else 0
                assert sum(held.values()) <= 100, "the cluster budget is never exceeded"

    run_periods(2, 3)
    assert sum(held.values()) > 80, "the shards use the budget"
    run_periods(3, 3)  # a third shard joins: scalers move, some shards inherit more than their share
    assert sum(held.values()) <= 100


@pytest.mark.parametrize("env, expected", [
    ({"PREDICTIVE_SCALER_SHARD_COUNT": "3", "HOSTNAME": "predictive-scaler-controller-2"}, (2, 3)),
    ({"PREDICTIVE_SCALER_SHARD_COUNT": "2", "PREDICTIVE_SCALER_SHARD_INDEX": "1", "HOSTNAME": "x"}, (1, 2)),
    ({}, (0, 1)),
], ids=["statefulset-ordinal", "explicit-index", "unsharded"])
def test_shard_settings_from_the_environment(env, expected) -> None:
    from predictive_scaler.controller.settings import ControllerSettings

    s = ControllerSettings.from_env(env, prometheus_url="http://p:9090", model_store="/m")
    assert (s.shard_index, s.shard_count) == expected


@pytest.mark.parametrize("env", [{"PREDICTIVE_SCALER_SHARD_COUNT": "2", "HOSTNAME": "controller"},
                                 {"PREDICTIVE_SCALER_SHARD_COUNT": "2", "HOSTNAME": "controller-5"}],
                         ids=["no-ordinal", "ordinal-out-of-range"])
def test_bad_shard_settings_say_what_to_set(env) -> None:
    from predictive_scaler.controller.settings import ControllerSettings
    from predictive_scaler.errors import ConfigError

    with pytest.raises(ConfigError, match="SHARD"):
        ControllerSettings.from_env(env, prometheus_url="http://p:9090", model_store="/m")


def test_a_service_reconciles_only_its_shard(leases, kube: KubeCluster, tmp_path) -> None:
    from predictive_scaler.clock import FakeClock
    from predictive_scaler.controller.service import ControllerService
    from predictive_scaler.controller.settings import ControllerSettings
    from predictive_scaler.forecasting.store import ModelStore
    from predictive_scaler.sources.prometheus import PrometheusSource
    from tests.controller.conftest import START

    clock = Clock()
    m = member(kube, 0, 2, clock)
    assert m.renew()
    settings = ControllerSettings(prometheus_url="http://127.0.0.1:9", model_store=tmp_path, shard_count=2)
    service = ControllerService(settings, kube, PrometheusSource("http://127.0.0.1:9"), ModelStore(tmp_path),
                                FakeClock(START), shards=m)
    before = len(leases.requests)
    other = next(n for ns, n in SCALERS if not m.owns(ns, n))
    outcome = service.reconcile(name=other, namespace="ml", uid="u", spec={})
    assert outcome.refused == "OtherShard" and len(leases.requests) == before, "nothing read or written"

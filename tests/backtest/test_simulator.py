"""The simulator against hand-computed cases.

Cluster used throughout: 4-GPU nodes, 1 GPU per replica, node 50 s + image
pull 300 s, pod start 10 s + model load 60 s → warm start 70 s, cold start
420 s; empty nodes removed after 300 s.
"""

from __future__ import annotations

import numpy as np
import pytest

from predictive_scaler.backtest.measures import (
    audit_budget,
    measure_policy,
    speculative_per_tick,
    wasted_billed_gpus,
)
from predictive_scaler.backtest.simulator import (
    ClusterConfig,
    Demand,
    PolicyRun,
    SimulatedCluster,
    simulate,
)
from predictive_scaler.errors import ConfigError

CFG = ClusterConfig(gpus_per_node=4, gpus_per_replica=1, price_per_gpu_hour=2.0, node_provision_s=50,
                    image_pull_s=300, pod_start_s=10, model_load_s=60, consolidation_delay_s=300)


@pytest.mark.parametrize(
    ("start", "desired", "placeholders_before", "new_ready_at", "nodes_after"),
    [
        (2, 3, 0, [70.0], 1),                       # room on a warm node: warm start
        (4, 5, 0, [420.0], 2),                      # node full: cold node = 50 + 300 + 70
        (4, 6, 0, [420.0, 420.0], 2),               # both land on the one new node
        (2, 4, 2, [70.0, 70.0], 2),                 # preempt placeholders: warm start; placeholders re-homed on a new node
    ],
    ids=["warm-node", "cold-node", "two-on-cold-node", "preempts-placeholders"],
)
def test_lead_times(start: int, desired: int, placeholders_before: int, new_ready_at: list[float], nodes_after: int) -> None:
    cluster = SimulatedCluster.warm(CFG, start)
    cluster.apply(start, placeholders_before, 0.0)
    cluster.apply(desired, placeholders_before, 0.0)
    assert cluster.replica_ready_times()[start:] == new_ready_at
    assert cluster.snapshot(0.0).nodes == nodes_after
    assert cluster.placeholder_gpus == placeholders_before  # a preempted placeholder goes pending, then lands again


def test_replica_on_a_prewarming_node_waits_for_the_node() -> None:
    cluster = SimulatedCluster.warm(CFG, 4)
    cluster.apply(4, 4, 0.0)          # a node provisioned for placeholders at t=0, warm at 350
    cluster.apply(5, 4, 100.0)        # a replica asked for at t=100 lands on it
    assert cluster.replica_ready_times()[-1] == 350.0 + 70.0
    cluster2 = SimulatedCluster.warm(CFG, 4)
    cluster2.apply(4, 4, 0.0)
    cluster2.apply(5, 4, 400.0)       # after the node is warm: warm start
    assert cluster2.replica_ready_times()[-1] == 470.0


@pytest.mark.parametrize(
    ("replicas", "gpus_per_node", "billed"),
    [(1, 4, 4), (4, 4, 4), (5, 4, 8), (9, 8, 16), (0, 4, 0)],
    ids=["one-replica-whole-node", "full-node", "spills-to-second", "big-nodes", "empty"],
)
def test_billing_by_whole_node(replicas: int, gpus_per_node: int, billed: int) -> None:
    cfg = CFG.with_overrides(gpus_per_node=gpus_per_node)
    cluster = SimulatedCluster.warm(cfg, replicas)
    assert cluster.billed_gpus == billed


def test_consolidation_delay_removes_empty_nodes_only_after_the_delay() -> None:
    cluster = SimulatedCluster.warm(CFG, 8)   # two full nodes
    cluster.apply(4, 0, 0.0)                  # newest replicas removed: one node empties at t=0
    assert cluster.billed_gpus == 8
    cluster.advance(299.0)
    assert cluster.billed_gpus == 8
    cluster.advance(300.0)
    assert cluster.billed_gpus == 4
    assert cluster.ready_replicas(300.0) == 4


def test_scale_down_removes_not_ready_replicas_first() -> None:
    cluster = SimulatedCluster.warm(CFG, 2)
    cluster.apply(3, 0, 0.0)      # one starting (ready at 70)
    cluster.apply(2, 0, 10.0)
    assert cluster.replica_ready_times() == [0.0, 0.0]


def test_billing_over_a_run_counts_node_lifetime_from_provisioning_to_removal() -> None:
    # 1 replica, then 5 at tick 1 (new cold node), then back to 1 at tick 10 → node removed at tick 15.
    schedule = np.array([1] + [5] * 9 + [1] * 20)

    def control(i: int, now: float, cluster: SimulatedCluster) -> bool:
        cluster.apply(int(schedule[i]), 0, now)
        return False

    run = simulate("t", control, schedule.size, 60, CFG, initial_replicas=1)
    # Node 2 exists from tick 1 (t=60) until removal at t = 600 + 300 = 900 (tick 15): ticks 1..14.
    assert list(run.billed_gpus[:16]) == [4] + [8] * 14 + [4]
    # Three replicas fit on the warm node (ready at 60 + 70 = 130 → tick 3); the fifth needs
    # the cold node (ready at 60 + 420 = 480 → tick 8).
    assert list(run.ready[:4]) == [1, 1, 1, 4]
    assert list(run.ready[6:10]) == [4, 4, 5, 5]


def _run(desired: list[int], placeholders: list[int], ready: list[int] | None = None,
         billed: list[int] | None = None) -> PolicyRun:
    n = len(desired)
    return PolicyRun("t", 60, np.array(desired), np.array(ready if ready is not None else desired),
                     np.array(billed) if billed is not None else np.zeros(n, dtype=int) + 4,
                     np.array(placeholders), None)


# 4-GPU nodes, 1 GPU per replica, price 2/GPU-h, cold start 420 s = 7 ticks: a tick's lead window is it + 7.
@pytest.mark.parametrize(
    ("billed", "desired", "placeholders", "reactive_billed", "need", "wasted", "placeholder_part"),
    [
        # A placeholder node (3 replicas + 2 placeholders take 2 nodes, the replicas alone 1), never used.
        ([8] * 10, [3] * 10, [2] * 10, [4] * 10, [3] * 10, [4] * 10, [4] * 10),
        # Same, but demand needs 6 replicas (2 nodes) from tick 3, inside every tick's lead window: used.
        ([8] * 10, [3] * 10, [2] * 10, [4] * 10, [3] * 3 + [6] * 7, [0] * 10, [0] * 10),
        # Extra replicas (5 on 2 nodes vs reactive's 1 node), never needed: replica waste.
        ([8] * 10, [5] * 10, [0] * 10, [4] * 10, [3] * 10, [4] * 10, [0] * 10),
        # Needed from tick 9: waste while tick 9 is beyond the 7-tick lead (ticks 0 and 1).
        ([8] * 12, [5] * 12, [0] * 12, [4] * 12, [3] * 9 + [6] * 3, [4, 4] + [0] * 10, [0] * 12),
        # Billed less than reactive (released faster): nothing added, nothing wasted.
        ([4] * 5, [3] * 5, [0] * 5, [8] * 5, [3] * 5, [0] * 5, [0] * 5),
        # One more replica on a node reactive already pays for: not billed, not waste.
        ([4] * 5, [4] * 5, [0] * 5, [4] * 5, [3] * 5, [0] * 5, [0] * 5),
    ],
    ids=["placeholder-never-used", "placeholder-used-within-lead", "replicas-never-used", "used-too-late",
         "cheaper-than-reactive", "free-gpu-on-a-billed-node"],
)
def test_wasted_prewarm_is_billed_whole_nodes(billed, desired, placeholders, reactive_billed, need,  # noqa: ANN001
                                              wasted, placeholder_part) -> None:
    demand = Demand(np.ones(len(desired)), 60, 1.0)
    got, ph = wasted_billed_gpus(_run(desired, placeholders, billed=billed), demand, CFG, np.array(reactive_billed),
                                 np.array(need))
    assert list(got) == wasted
    assert list(ph) == placeholder_part


def test_measures_by_hand() -> None:
    # 4 ticks of 60 s, capacity 10/replica; demand 10, 30, NaN, 25 against 2 ready replicas.
    demand = Demand(np.array([10.0, 30.0, np.nan, 25.0]), 60, 10.0)
    run = PolicyRun("t", 60, np.array([2, 2, 2, 3]), np.array([2, 2, 2, 2]), np.array([4, 4, 4, 8]),
                    np.array([0, 0, 0, 1]), np.array([False, True, True, False]))
    m = measure_policy(run, demand, CFG, reactive_billed=np.array([4, 4, 4, 4]),
                       reactive_need=np.array([1, 3, 3, 3]), demand_unit_seconds=60)
    assert m.gpu_hours == pytest.approx((4 + 4 + 8) / 60)      # the NaN tick is outside the evidence
    assert m.cost == pytest.approx(m.gpu_hours * 2.0)
    assert m.slo_attainment == pytest.approx((10 + 20 + 20) / 65)
    assert m.unmet_minutes == 2.0
    assert m.unserved_requests == pytest.approx(15.0)
    assert m.prewarm_gpu_hours == pytest.approx(1 / 60)
    assert m.scale_events == 1
    assert m.reactive_minutes == 1.0
    # Tick 3 is billed a second node (8 vs reactive's 4) that the 3 replicas + 1 placeholder do not need
    # packed (one node holds them): 4 GPUs × 1 minute × 2/GPU-h, all of it on the replica side.
    assert m.wasted_prewarm_cost == pytest.approx(4 / 60 * 2.0)
    assert m.wasted_placeholder_cost == 0.0
    assert m.wasted_replica_cost == pytest.approx(m.wasted_prewarm_cost)
    assert m.max_speculative_gpus is None and m.minutes_over_budget is None


@pytest.mark.parametrize(
    ("desired", "placeholders", "counterfactual", "speculative"),
    [
        ([10, 12, 12], [0, 0, 0], [10, 10, 10], [0, 2, 2]),        # replicas on nodes the counterfactual has
        ([12, 13, 12], [0, 0, 4], [12, 12, 12], [0, 4, 4]),        # one more replica / placeholders: a whole node
        ([8, 8, 8], [0, 2, 0], [10, 10, 10], [0, 2, 0]),           # below the counterfactual; placeholders count
    ],
    ids=["replicas", "whole-node", "below-counterfactual"],
)
def test_budget_audit_every_tick(desired, placeholders, counterfactual, speculative) -> None:  # noqa: ANN001
    run = _run(desired, placeholders)
    got = speculative_per_tick(run, np.array(counterfactual), CFG)
    assert list(got) == speculative
    audit = audit_budget(run, np.array(counterfactual), CFG, allowed_gpus=2)
    assert audit.max_speculative_gpus == max(speculative)
    assert audit.minutes_over_budget == sum(s > 2 for s in speculative)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [({"gpus_per_node": 0}, "gpus_per_node"), ({"gpus_per_replica": 8}, "gpus_per_replica"),
     ({"image_pull_s": -1}, "image_pull_s"), ({"price_per_gpu_hour": float("nan")}, "price_per_gpu_hour")],
    ids=["no-gpus", "replica-too-big", "negative-time", "nan-price"],
)
def test_config_is_validated(overrides: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        ClusterConfig(**overrides)
    assert err.value.field == field


def test_presets_differ_in_node_lead_time() -> None:
    karpenter = ClusterConfig.preset("karpenter")
    ca = ClusterConfig.preset("cluster-autoscaler")
    assert karpenter.cold_start_s < ca.cold_start_s
    assert 45 <= karpenter.node_provision_s <= 60 and 180 <= ca.node_provision_s <= 300
    with pytest.raises(ConfigError):
        ClusterConfig.preset("nope")

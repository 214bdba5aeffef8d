"""The hard budget: allowance arithmetic, table-driven."""

from __future__ import annotations

import math

import pytest

from predictive_scaler.policy.budget import (
    UNCAPPED,
    ClusterShare,
    allowance,
    cluster_share,
    gpus_within,
)
from predictive_scaler.policy.capacity import REPLICA_CAP
from predictive_scaler.spec import Budget

CASES = [
    # (id, budget, allowed gpus, fails closed)
    ("empty-budget-no-speculation", Budget(), 0, True),
    ("gpus-only", Budget(max_gpus=8), 8, False),
    ("zero-gpus", Budget(max_gpus=0), 0, False),
    ("cost-binds", Budget(max_gpus=100, max_cost_per_hour=10.0, price_per_gpu_hour=2.5), 4, False),
    ("gpus-bind", Budget(max_gpus=3, max_cost_per_hour=10.0, price_per_gpu_hour=2.5), 3, False),
    ("float-edge", Budget(max_cost_per_hour=0.3, price_per_gpu_hour=0.1), 2, False),  # 3 × 0.1 > 0.3 in floats
    ("free-gpus-cost-unbounded", Budget(max_gpus=5, max_cost_per_hour=1.0, price_per_gpu_hour=0.0), 5, False),
]


@pytest.mark.parametrize(("budget", "gpus", "closed"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_allowance(budget: Budget, gpus: int, closed: bool) -> None:
    a = allowance(budget)
    assert a.gpus == gpus
    assert (a.problem is not None) == closed
    if a.price_per_gpu_hour and budget.max_cost_per_hour is not None:
        cost = a.cost(a.gpus)
        assert cost is not None and cost <= budget.max_cost_per_hour


@pytest.mark.parametrize("field,value", [("max_gpus", -3), ("max_gpus", float("nan")), ("max_gpus", "8"),
                                         ("max_cost_per_hour", float("inf")), ("price_per_gpu_hour", -1.0),
                                         ("max_gpus", 2.5)],
                         ids=["negative", "nan", "text", "inf-cost", "negative-price", "fractional"])
def test_corrupted_budget_fails_closed_with_the_field_named(field: str, value: object) -> None:
    b = Budget(max_gpus=8)
    object.__setattr__(b, field, value)
    a = allowance(b)
    assert a.gpus == 0
    assert a.problem and "spec.prewarm.budget." in a.problem and "no speculative GPUs" in a.problem


# The one "GPUs within a cost" rule (the per-scaler budget and the cluster-wide one both use it).
WITHIN = [
    # (id, cost, price, gpus)
    ("exact", 10.0, 2.5, 4),
    ("below", 9.99, 2.5, 3),
    ("float-edge-down", 0.3, 0.1, 2),      # 3 × 0.1 = 0.30000000000000004 > 0.3
    ("float-edge-up", 0.7, 0.1, 6),        # 0.7 / 0.1 = 6.999…, and 7 × 0.1 > 0.7
    ("float-edge-both", 0.6, 0.2, 2),      # 0.6 / 0.2 = 2.9999999999999996, and 3 × 0.2 = 0.6000000000000001 > 0.6
    ("zero-cost", 0.0, 2.5, 0),
    ("free-gpus", 5.0, 0.0, REPLICA_CAP),
    ("tiny-price-capped", 1.0, 1e-12, REPLICA_CAP),  # never beyond the cap, whatever the ratio
    ("negative-cost", -1.0, 2.5, 0),
    ("nan-cost", math.nan, 2.5, 0),
    ("nan-price", 10.0, math.nan, 0),
    ("negative-price", 10.0, -1.0, 0),
    ("infinite-price", 10.0, math.inf, 0),
    ("infinite-cost", math.inf, 2.5, REPLICA_CAP),
]


@pytest.mark.parametrize(("cost", "price", "gpus"), [c[1:] for c in WITHIN], ids=[c[0] for c in WITHIN])
def test_gpus_within_a_cost(cost: float, price: float, gpus: int) -> None:
    n = gpus_within(cost, price)
    assert n == gpus
    if 0 < price < math.inf and 0 <= cost < math.inf and n < REPLICA_CAP:
        assert n * price <= cost < (n + 1) * price  # the largest count, as the cost will be computed


SHARES = [
    # (id, max gpus, max cost, others' gpus, others' cost, price, share)
    ("no-cap", None, None, 5, 5.0, 1.0, None),
    ("gpus-left", 10, None, 7, 0.0, 1.0, 3),
    ("gpus-over", 3, None, 5, 0.0, 1.0, 0),
    ("cost-left", None, 10.0, 0, 2.5, 2.5, 3),
    ("cost-without-price", None, 10.0, 0, 0.0, None, 0),
    ("cost-nan-price", None, 10.0, 0, 0.0, math.nan, 0),
    ("both-gpus-bind", 6, 100.0, 4, 4.0, 1.0, 2),
    ("both-cost-binds", 60, 10.0, 4, 4.0, 2.0, 3),
    ("free-gpus-cost-binds-nothing", 6, 10.0, 0, 0.0, 0.0, 6),
]


@pytest.mark.parametrize(("max_gpus", "max_cost", "others", "others_cost", "price", "share"),
                         [c[1:] for c in SHARES], ids=[c[0] for c in SHARES])
def test_cluster_share(max_gpus: int | None, max_cost: float | None, others: int, others_cost: float,
                       price: float | None, share: int | None) -> None:
    got = cluster_share(max_gpus, max_cost, others_gpus=others, others_cost=others_cost, price_per_gpu_hour=price)
    assert got.gpus == share
    assert (got.reason is None) == (share is None)


CAPPED = [
    # (id, budget, cluster share, gpus allowed, problem) — the share only ever lowers maxGpus
    ("lowers", Budget(max_gpus=8), ClusterShare(3), 3, False),
    ("never-raises", Budget(max_gpus=8), ClusterShare(30), 8, False),
    ("uncapped", Budget(max_gpus=8), UNCAPPED, 8, False),
    ("cost-only-budget-capped", Budget(max_cost_per_hour=10.0, price_per_gpu_hour=1.0), ClusterShare(4), 4, False),
    ("cost-binds-below-share", Budget(max_cost_per_hour=10.0, price_per_gpu_hour=2.5), ClusterShare(6), 4, False),
    ("no-budget-stays-none", Budget(), ClusterShare(3), 0, True),
    ("zero-share", Budget(max_gpus=8), ClusterShare(0), 0, False),
]


@pytest.mark.parametrize(("budget", "share", "gpus", "closed"), [c[1:] for c in CAPPED], ids=[c[0] for c in CAPPED])
def test_the_cluster_share_caps_the_allowance(budget: Budget, share: ClusterShare, gpus: int, closed: bool) -> None:
    a = allowance(budget, share)
    assert a.gpus == gpus and (a.problem is not None) == closed
    if not closed and share.gpus is not None:
        assert f"max {min(share.gpus, budget.max_gpus if budget.max_gpus is not None else share.gpus)} GPUs" \
            in a.summary

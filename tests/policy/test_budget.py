"""The hard budget: allowance arithmetic, table-driven."""

from __future__ import annotations

import pytest

from predictive_scaler.policy.budget import allowance
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

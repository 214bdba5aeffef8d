"""The hard prewarm budget: how many speculative GPUs may exist, failing closed.

Speculative GPUs are every GPU that exists only because of the forecast. The
budget bounds their count and their cost per hour. This module re-checks the
numbers itself (NaN, negative, non-numeric, a cost limit without a price) and
answers "no speculation" on anything wrong, so no input, however strange, buys
more than the operator allowed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from predictive_scaler.policy.capacity import REPLICA_CAP
from predictive_scaler.policy.reasons import Limit
from predictive_scaler.spec import Budget


@dataclass(frozen=True)
class Allowance:
    """Speculative GPUs allowed now, and how that was derived (for reasons)."""

    gpus: int
    price_per_gpu_hour: float | None
    currency: str
    #: Why nothing is allowed (invalid or empty budget); None when the budget is usable.
    problem: str | None
    #: Human description of the limits, e.g. "max 8 GPUs, max 20.00 USD/h at 2.50 USD/GPU-hour".
    summary: str
    #: What ``problem`` is, as data: BUDGET_INVALID or BUDGET_EMPTY (None when the budget is usable).
    problem_limit: Limit | None = None

    def cost(self, gpus: int) -> float | None:
        return None if self.price_per_gpu_hour is None else gpus * self.price_per_gpu_hour


def _bad_number(value: Any) -> bool:
    return (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < 0
    )


@dataclass(frozen=True)
class ClusterShare:
    """What the cluster-wide budget leaves one scaler this step (a value passed into the step).

    ``gpus`` None means no cluster cap; ``reason`` says how it was derived (for the Event).
    """

    gpus: int | None
    reason: str | None = None


#: No cluster-wide cap.
UNCAPPED = ClusterShare(None)


def cluster_share(max_gpus: int | None, max_cost_per_hour: float | None, *, others_gpus: int, others_cost: float,
                  price_per_gpu_hour: float | None) -> ClusterShare:
    """The speculative GPUs one scaler may take under the cluster-wide cap, given what the others hold.

    ``max_gpus``/``max_cost_per_hour`` are the cluster's (None: no cap on that axis); the cost cap is
    counted at the scaler's own price, and fails closed (0 GPUs) without a usable one.
    """
    if max_gpus is None and max_cost_per_hour is None:
        return UNCAPPED
    allowed: int | None = None
    reasons = []
    if max_gpus is not None:
        allowed = max(0, max_gpus - others_gpus)
        reasons.append(f"the cluster-wide budget of {max_gpus} speculative GPUs has {allowed} left "
                       f"({others_gpus} held by other scalers)")
    if max_cost_per_hour is not None:
        price = price_per_gpu_hour
        if price is None or _bad_number(price):
            return ClusterShare(0, "the cluster-wide cost budget needs every scaler's spec.prewarm.budget."
                                   "pricePerGpuHour to count its cost; set it — no speculative GPUs until then")
        left = max(0.0, max_cost_per_hour - others_cost)
        by_cost = gpus_within(left, float(price))
        reasons.append(f"the cluster-wide budget of {max_cost_per_hour:.2f}/h has {left:.2f}/h left")
        allowed = by_cost if allowed is None else min(allowed, by_cost)
    return ClusterShare(allowed, "; ".join(reasons))


def allowance(budget: Budget, share: ClusterShare | None = None) -> Allowance:
    """Speculative GPUs the budget allows; 0 with a ``problem`` when it is unusable.

    ``share`` (the cluster-wide budget's part for this scaler) only ever lowers ``maxGpus``; an unset
    per-scaler budget stays unset (no budget means no speculation).
    """
    currency = budget.currency if isinstance(budget.currency, str) and budget.currency else "?"
    price = budget.price_per_gpu_hour
    max_gpus = budget.max_gpus
    max_cost = budget.max_cost_per_hour

    def closed(problem: str, limit: Limit = Limit.BUDGET_INVALID) -> Allowance:
        good_price = None if price is None or _bad_number(price) else float(price)
        return Allowance(0, good_price, currency, problem, "no speculation", limit)

    for name, value in (("maxGpus", max_gpus), ("maxCostPerHour", max_cost), ("pricePerGpuHour", price)):
        if value is not None and _bad_number(value):
            return closed(f"the prewarm budget is invalid: {name} is {value!r}, not a non-negative number; "
                          f"fix spec.prewarm.budget.{name} — no speculative GPUs until then")
    if max_gpus is not None and not float(max_gpus).is_integer():
        return closed(f"the prewarm budget is invalid: maxGpus {max_gpus!r} is not a whole number; "
                      "fix spec.prewarm.budget.maxGpus — no speculative GPUs until then")
    if max_gpus is None and max_cost is None:
        return closed("no prewarm budget is set (spec.prewarm.budget.maxGpus or maxCostPerHour), so "
                      "nothing is speculated; set one to let the forecast add capacity ahead of demand",
                      Limit.BUDGET_EMPTY)
    if share is not None and share.gpus is not None:
        max_gpus = share.gpus if max_gpus is None else min(int(max_gpus), share.gpus)
    gpus = REPLICA_CAP
    parts = []
    if max_gpus is not None:
        gpus = min(gpus, int(max_gpus))
        parts.append(f"max {int(max_gpus)} GPUs")
    if max_cost is not None:
        if price is None:
            return closed("the prewarm budget is invalid: maxCostPerHour is set without pricePerGpuHour; "
                          "set spec.prewarm.budget.pricePerGpuHour — no speculative GPUs until then")
        parts.append(f"max {max_cost:.2f} {currency}/h at {price:.2f} {currency}/GPU-hour")
        gpus = min(gpus, gpus_within(float(max_cost), float(price)))
    return Allowance(gpus, None if price is None else float(price), currency, None, ", ".join(parts))


def gpus_within(cost: float, price: float) -> int:
    """Largest n with n × price ≤ cost, exactly as the cost will be computed: *the* "GPUs within a cost" rule.

    Free GPUs (price ≤ 0) and a cost no finite count reaches are bounded by :data:`REPLICA_CAP` alone;
    a cost that is not a non-negative number buys nothing; float rounding never buys one GPU too many.
    """
    if not (cost >= 0):  # also NaN
        return 0
    if price == 0:
        return REPLICA_CAP  # free GPUs: the cost bounds nothing
    if not (price > 0) or not math.isfinite(price):
        return 0  # a negative, NaN or infinite price buys nothing (fail closed)
    ratio = cost / price
    if not math.isfinite(ratio) or ratio >= REPLICA_CAP:
        return REPLICA_CAP
    n = math.floor(ratio)
    while n > 0 and n * price > cost:
        n -= 1
    while (n + 1) * price <= cost and n < REPLICA_CAP:
        n += 1
    return n


def speculative_gpus(replicas: int, placeholder_gpus: int, counterfactual: int, gpus_per_replica: int,
                     gpus_per_node: int) -> int:
    """GPUs held above the counterfactual: ``max(GPU excess, whole-node excess)``, never negative.

    GPU excess = every placeholder GPU plus the GPUs of replicas above the counterfactual's. Whole
    nodes are counted packed (``ceil(GPUs / gpusPerNode)`` of replicas + placeholders against the
    counterfactual's replicas): capacity that needs one more node than the counterfactual would have
    costs that whole node.
    """
    replicas, counterfactual, placeholder_gpus = max(0, replicas), max(0, counterfactual), max(0, placeholder_gpus)
    held = replicas * gpus_per_replica + placeholder_gpus
    base = counterfactual * gpus_per_replica
    excess = max(0, replicas - counterfactual) * gpus_per_replica + placeholder_gpus
    nodes = gpus_per_node * (-(-held // gpus_per_node) - -(-base // gpus_per_node)) if gpus_per_node > 0 else 0
    return max(excess, nodes)


def most_within(lo: int, hi: int, fits: Callable[[int], bool]) -> int:
    """Largest ``n`` in ``[lo, hi]`` with ``fits(n)`` (``fits`` monotone, true at ``lo``); ``lo`` if none."""
    if hi <= lo or not fits(lo):
        return lo
    if fits(hi):
        return hi
    good, bad = lo, hi
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good

"""The shadow report's figures against a calculation written out here, step by step (docs/shadow.md)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from predictive_scaler.backtest import shadow

START = pd.Timestamp("2024-03-04T23:00:00Z")


def _input(n: int = 180) -> shadow.ShadowInput:
    rng = np.random.default_rng(1)
    demand = 30 + 25 * (np.arange(n) % 60 > 40) + rng.uniform(0, 5, n)
    demand[7] = np.nan  # not recorded: left out
    yours = np.full(n, 4.0)
    ready = np.where(np.arange(n) % 60 > 45, 6.0, 4.0)
    ours = np.ceil(np.nan_to_num(demand, nan=30) / 10)
    placeholder = np.where(np.arange(n) % 60 > 30, 2.0, 0.0)
    price = np.full(n, np.nan)
    price[:90] = 2.0
    return shadow.ShadowInput(start=START, step_s=60, demand=demand, yours_replicas=yours, yours_ready=ready,
                              ours_replicas=ours, ours_placeholder_gpus=placeholder, price=price, default_price=3.0,
                              capacity_per_replica=10.0, gpus_per_replica=1, pod_start_s=120, node_start_s=300,
                              scaler="ml/llm")


def _by_hand(inp: shadow.ShadowInput) -> dict[str, dict[str, float]]:
    out = {s: {"gpu_hours": 0.0, "cost": 0.0, "unmet": 0.0, "served": 0.0, "wasted": 0.0} for s in shadow.SIDES}
    for i in range(len(inp.demand)):
        d = inp.demand[i]
        if math.isnan(d):
            continue
        price = inp.price[i] if not math.isnan(inp.price[i]) else inp.default_price
        ours_ready = min(inp.ours_replicas[max(0, i - 2): i + 1])  # pod start 120 s = 2 steps
        ahead = max(x for x in inp.demand[i: i + 6] if not math.isnan(x))  # node start 300 s = 5 steps
        needed_extra = max(0.0, math.ceil(ahead / 10 - 1e-9) - inp.ours_replicas[i])
        wasted = inp.ours_placeholder_gpus[i] - min(inp.ours_placeholder_gpus[i], needed_extra)
        for side, billed, capacity, waste in (
                ("yours", inp.yours_replicas[i], inp.yours_ready[i] * 10, 0.0),
                ("ours", inp.ours_replicas[i] + inp.ours_placeholder_gpus[i], ours_ready * 10, wasted)):
            out[side]["gpu_hours"] += billed / 60
            out[side]["cost"] += billed * price / 60
            out[side]["unmet"] += 1.0 if d > capacity else 0.0
            out[side]["served"] += min(d, capacity)
            out[side]["wasted"] += waste * price / 60
    return out


def test_the_totals_equal_the_step_by_step_calculation():
    inp = _input()
    result = shadow.compare(inp)
    expected = _by_hand(inp)
    assert result.steps_counted == 179 and result.steps_left_out == 1
    for side in shadow.SIDES:
        got = result.total[side]
        assert math.isclose(got.gpu_hours, expected[side]["gpu_hours"])
        assert math.isclose(got.cost, expected[side]["cost"])
        assert got.unmet_minutes == expected[side]["unmet"]
        assert math.isclose(got.served, expected[side]["served"])
        assert math.isclose(got.wasted_prewarm_cost, expected[side]["wasted"], abs_tol=1e-12)
    assert result.total["yours"].unmet_minutes > 0 and result.total["ours"].wasted_prewarm_cost > 0


def test_days_are_utc_days_and_add_up_to_the_total():
    result = shadow.compare(_input())
    assert list(result.days) == ["2024-03-04", "2024-03-05"]
    for side in shadow.SIDES:
        assert math.isclose(sum(d[side].cost for d in result.days.values()), result.total[side].cost)
        assert sum(d[side].unmet_minutes for d in result.days.values()) == result.total[side].unmet_minutes


def test_the_report_shows_both_sides_the_difference_and_the_replay():
    replay = {"policies": {"predictive": {"gpu_hours": 9.0, "cost": 27.0, "slo_attainment": 0.99,
                                          "unmet_minutes": 3.0, "wasted_prewarm_cost": 1.0},
                           "reactive": {"gpu_hours": 8.0, "cost": 24.0, "slo_attainment": 0.95,
                                        "unmet_minutes": 30.0, "wasted_prewarm_cost": 0.0}}}
    result = shadow.compare(_input(), replay)
    md = shadow.markdown(result)
    assert "| ours − yours |" in md and "## Day by day" in md and "| predictive, replayed |" in md
    assert "replayed − recorded (predictive)" in md
    page = shadow.html_page(result)
    assert page.startswith("<!doctype html>") and "<table>" in page
    doc = result.to_json()
    assert doc["total"]["yours"]["gpu_hours"] == result.total["yours"].gpu_hours and doc["replay"] == replay

"""The report's verdict lines (each aim is met, not met, or where it does not apply not judged) and its
per-day and bucketed figures, which add up to the tables' totals."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from predictive_scaler.backtest.plots import MAX_POINTS, bucket_ticks, bucketed, daily
from predictive_scaler.backtest.report import verdict
from predictive_scaler.backtest.runner import Result, run_backtest
from tests.backtest.test_runner import FAST, daily_trace


@pytest.fixture(scope="module")
def result() -> Result:
    return run_backtest(daily_trace(), FAST)


def _with_served(result: Result, predictive: float, oracle: float) -> Result:
    measures = dict(result.measures)
    measures["predictive"] = replace(measures["predictive"], slo_attainment=predictive)
    measures["oracle"] = replace(measures["oracle"], slo_attainment=oracle)
    return replace(result, measures=measures)


SERVED_CASES = [
    # (id, predictive served, oracle served, the ending the served line must have)
    ("oracle-full-met", 0.996, 1.0, "(aim: at least 99.5 %) — met"),
    ("oracle-full-missed", 0.990, 1.0, "(aim: at least 99.5 %) — not met"),
    ("oracle-short-reached", 0.996, 0.999, "here even it serves 99.9 %"),
    ("oracle-short-below", 0.9933, 0.9991, "here even it serves 99.9 %; 99.33 % is below 99.5 %"),
]


@pytest.mark.parametrize(("predictive", "oracle", "ending"), [c[1:] for c in SERVED_CASES],
                         ids=[c[0] for c in SERVED_CASES])
def test_the_served_aim_is_judged_only_where_the_oracle_serves_everything(
        result: Result, predictive: float, oracle: float, ending: str) -> None:
    line = next(x for x in verdict(_with_served(result, predictive, oracle)) if x.startswith("demand served"))
    assert line.endswith(ending), line
    # One verdict per line: a line that says the aim does not apply never also says "not met".
    assert ("not judged" in line) != line.endswith("met"), line


def test_the_aims_say_met_or_not_met_in_the_readers_terms(result: Result) -> None:
    lines = verdict(result)
    judged = [x for x in lines if not x.startswith("why:")]
    assert all(x.endswith((" — met", " — not met")) or "not judged" in x for x in judged), judged
    assert not any("issue" in x.lower() or "NOT" in x for x in lines), lines


def test_the_days_add_up_to_the_tables_totals(result: Result) -> None:
    days = daily(result)
    # FAST evaluates one day from midnight: one whole UTC day, no partial ones.
    assert len(days.days) == 1 + (result.setup.eval_start.hour > 0)
    for name, m in result.measures.items():
        assert days.cost[name].sum() == pytest.approx(m.cost, rel=1e-9), name
        assert days.unmet_minutes[name].sum() == pytest.approx(m.unmet_minutes), name
    assert days.wasted is not None
    assert days.wasted.sum() == pytest.approx(result.measures["predictive"].wasted_prewarm_cost, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize(("ticks", "tick_s", "per_bucket"), [
    (60_480, 60, 180),  # 42 days at one minute: 3-hour buckets, 336 of them
    (1_440, 60, 5),     # one day: 5-minute buckets
    (300, 60, 1),       # few enough to draw every tick
])
def test_long_runs_are_bucketed_to_a_readable_number_of_points(ticks: int, tick_s: int, per_bucket: int) -> None:
    k = bucket_ticks(ticks, tick_s)
    assert k == per_bucket and -(-ticks // k) <= MAX_POINTS


def test_buckets_keep_the_extremes_and_a_gap_stays_a_gap() -> None:
    values = np.array([1.0, 5.0, 2.0, np.nan, np.nan, np.nan, 7.0])
    assert bucketed(values, 3, "max").tolist()[0] == 5.0 and bucketed(values, 3, "min")[0] == 1.0
    assert np.isnan(bucketed(values, 3, "max")[1])  # a trace gap is not drawn as zero demand
    assert bucketed(values, 3, "max")[2] == 7.0  # the short last bucket is kept

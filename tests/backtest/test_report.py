"""The report's verdict lines: each aim is met, NOT met, or (where it does not apply) not judged."""

from __future__ import annotations

from dataclasses import replace

import pytest

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
    ("oracle-full-met", 0.996, 1.0, "(aim ≥ 99.5 %) — met"),
    ("oracle-full-missed", 0.990, 1.0, "(aim ≥ 99.5 %) — NOT met"),
    ("oracle-short-reached", 0.996, 0.999, "— not judged"),
    ("oracle-short-below", 0.9933, 0.9991, "— not judged, 99.33 % is below 99.5 %"),
]


@pytest.mark.parametrize(("predictive", "oracle", "ending"), [c[1:] for c in SERVED_CASES],
                         ids=[c[0] for c in SERVED_CASES])
def test_the_served_aim_is_judged_only_where_the_oracle_serves_everything(
        result: Result, predictive: float, oracle: float, ending: str) -> None:
    line = next(x for x in verdict(_with_served(result, predictive, oracle)) if x.startswith("demand served"))
    assert line.endswith(ending), line
    # One verdict per line: a line that says the aim does not apply never also says "NOT met".
    assert not ("not judged" in line and "NOT met" in line), line

"""bench/peers.py's 'why' for a missed target: derived from the run's figures, never empty."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.forecast_peers import (
    aim_gap,
    calibration_text,
    geometric_mean_ratio_interval,
    summary_row,
    verdict,
    verdict_line,
    why,
)


def _doc(served: float, best: float, peer: float, regret: float, coverage: float = 0.95) -> dict[str, Any]:
    def model(pinball: float, cov: float = 0.95) -> dict[str, Any]:
        return {"horizons": {"30m": {"normalised_pinball": pinball, "coverage": cov}}}
    return {
        "served": {**model(served, coverage), "choices": ["holt-winters"], "origins": 336},
        "models": {"arima": model(best)},
        "best_candidate": "arima",
        "peers": {"MSTL": model(peer)},
        "best_peer": "MSTL",
        "regret": regret,
        "blocks": 1,
        "protocol": {"min_history": "7d"},
    }


WHY_CASES = [
    # (id, served, best candidate, best peer, regret, coverage, words the reason must hold)
    ("selection-over-target", 0.012, 0.010, 0.011, 1.2, 0.95, "selection: the served choices scored 1.200×"),
    ("best-candidate-loses", 0.0105, 0.0104, 0.010, 1.01, 0.95, "even the best candidate (arima) is 1.040×"),
    ("within-regret-target", 0.01097, 0.01075, 0.01083, 1.02, 0.95, "within the regret target"),
    ("coverage-only", 0.010, 0.010, 0.011, 1.0, 0.90, "coverage 0.900"),
]


@pytest.mark.parametrize(("served", "best", "peer", "regret", "coverage", "words"),
                         [c[1:] for c in WHY_CASES], ids=[c[0] for c in WHY_CASES])
def test_the_reason_names_the_cause(served: float, best: float, peer: float, regret: float,
                                    coverage: float, words: str) -> None:
    assert words in why(_doc(served, best, peer, regret, coverage))


def test_the_reason_is_never_empty() -> None:
    assert why(_doc(0.010, 0.010, 0.011, 1.0)).strip()


@pytest.mark.parametrize(("ratio", "shown"), [(1.0042, "1.004"), (0.8957, "0.896"), (None, "–")],
                         ids=["just-over-one", "under-one", "missing"])
def test_a_ratio_keeps_the_digits_that_decide_it(ratio: float | None, shown: str) -> None:
    # "%.3g" printed 1.0042 as "1" and the summary said "ratio 1 > 1".
    assert summary_row("t", {**_doc(0.01, 0.01, 0.01, 1.0), "ratio_to_best_peer": ratio}).count(f"**{shown}**") == 1


AIM_CASES = [
    # (id, served, best candidate, best peer, regret, ratio, initial history,
    #  words the gap must hold, or None: aim met)
    ("aim-met", 0.0052, 0.0061, 0.0072, 0.858, 0.722, "14d", None),
    ("combination-gains", 0.03247, 0.03324, 0.03667, 0.977, 0.886, "14d",
     ["ratio 0.886, 0.036 above the 0.85 aim (4.2 % more", "(arima) is 0.906× the best peer", "gains 2.3 %"]),
    ("selection-costs-short-trace", 0.01097, 0.01067, 0.01083, 1.028, 1.013, "7d",
     ["0.163 above", "selection costs 2.8 %", "7 days of history"]),
]


@pytest.mark.parametrize(("served", "best", "peer", "regret", "ratio", "history", "words"),
                         [c[1:] for c in AIM_CASES], ids=[c[0] for c in AIM_CASES])
def test_a_missed_aim_says_by_how_much_and_what_the_figures_say(
        served: float, best: float, peer: float, regret: float, ratio: float, history: str,
        words: list[str] | None) -> None:
    doc = {**_doc(served, best, peer, regret), "ratio_to_best_peer": ratio, "protocol": {"min_history": history}}
    gap = aim_gap(doc)
    if words is None:
        assert gap is None
        return
    assert gap is not None
    for w in words:
        assert w in gap, (w, gap)
    assert ("7 days of history" in gap) == (history == "7d")


VERDICT_CASES = [
    # (id, the ratio's interval, verdict, words the reason must hold when the ratio is over 1)
    ("tie", [0.91, 1.11], "tie", "[0.910, 1.110]: it holds 1, so these days cannot tell the two apart"),
    ("peer-better", [1.02, 1.08], "worse", "[1.020, 1.080]: above 1, the peer is better here"),
    ("project-better", [0.80, 0.95], "better", None),
    ("no-interval", None, None, None),
]


@pytest.mark.parametrize(("interval", "expected", "words"), [c[1:] for c in VERDICT_CASES],
                         ids=[c[0] for c in VERDICT_CASES])
def test_the_ratios_interval_says_win_tie_or_loss(interval: list[float] | None, expected: str | None,
                                                  words: str | None) -> None:
    doc = {**_doc(0.0105, 0.0104, 0.010, 1.01), "ratio_to_best_peer": 1.05 if words else 0.9,
           "intervals": {"level": 0.9, "days": 8, "ratio_to_best_peer": interval, "regret": [0.9, 1.1],
                         "coverage": None}}
    assert verdict(doc) == expected
    if words:
        assert words in why(doc) and "over 8 days resampled" in why(doc)
    row = summary_row("t", doc)
    assert ("[0.900, 1.100]" in row) and ((f"[{interval[0]:.3f}, {interval[1]:.3f}]" in row) if interval else True)


def test_the_interval_line_names_the_traces_each_way() -> None:
    line = " ".join(verdict_line({"a": "better", "b": "tie", "c": "tie", "d": None}))
    assert "below 1, the project better on 1 (a)" in line
    assert "a tie these days cannot split on 2 (b, c)" in line and "above 1, the peer better on 0" in line
    assert verdict_line({"d": None}) == []


@pytest.mark.parametrize(("interval", "words"), [([0.89, 0.95], "it reaches into the band"),
                                                 ([0.86, 0.92], "it misses the band"),
                                                 (None, "sampling error ±0.024 on 336 origins")],
                         ids=["reaches", "misses", "binomial-without-interval"])
def test_a_coverage_miss_says_what_its_interval_says(interval: list[float] | None, words: str) -> None:
    doc = {**_doc(0.010, 0.010, 0.011, 1.0, 0.908),
           "intervals": {"level": 0.9, "days": 8, "ratio_to_best_peer": None, "regret": None, "coverage": interval}}
    assert words in why(doc)


def test_the_geometric_mean_interval_needs_every_traces_day_sums() -> None:
    with_sums = {"intervals": {"day_sums": {"ratio_to_best_peer": [[0.9, 1.0, 0.95], [1.0, 1.0, 1.0]]}}}
    lo, hi = geometric_mean_ratio_interval([with_sums, with_sums])
    assert lo < 0.95 < hi < 1.0
    assert geometric_mean_ratio_interval([with_sums, {"intervals": {"level": 0.9}}]) is None


@pytest.mark.parametrize(("calibrations", "shown"), [
    ([], ""),
    (["additive shifts, tracked at 0.15"], "its P95 calibrated at every refit: additive shifts, tracked at 0.15; "),
    (["a", "a", "b"], "its P95 calibrated at each refit: a; a; b; "),
], ids=["not-recorded", "one-for-all", "per-refit"])
def test_the_detail_says_how_the_served_p95_was_calibrated(calibrations: list[str], shown: str) -> None:
    assert calibration_text(calibrations) == shown


def test_a_short_traces_coverage_miss_names_the_calibration_served() -> None:
    doc = _doc(0.010, 0.010, 0.011, 1.0, 0.908)
    doc["served"]["calibrations"] = ["additive shifts, tracked at 0.15"]
    assert "2 days to calibrate on (short history), served with additive shifts, tracked at 0.15" in why(doc)

"""The retraining job's memory between weeks (retrain/ledger.py): losers skipped, settled scales,
Holt-Winters warm starts — and a cold week whenever the ledger cannot be trusted."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from predictive_scaler.errors import ModelError
from predictive_scaler.forecasting.baselines import HoltWintersForecaster
from predictive_scaler.forecasting.walkforward import clear_fit_memo
from predictive_scaler.retrain.ledger import (
    ARIMA_KEY,
    LOSER_MARGIN,
    LOSER_WEEKS,
    RECHECK_WEEKS,
    Ledger,
    WeekScores,
    fitted_parameters,
    recheck_week,
    relative_scores,
)
from predictive_scaler.retrain.stores import MemoryStore
from predictive_scaler.retrain.training import train_and_promote
from tests.test_retrain import FAST, START, FakeHistory, synthetic, target

KINDS = ("arima", "prophet", "persistence", "ensemble", "holt-winters")
NAME = "ml-chat"
#: Three candidates ahead of any loser: the pool a combination is searched over.
AHEAD = {"arima": 1.0, "ensemble": 1.01, "holt-winters": 1.05}


def weeks_until(now: datetime, rows: list[dict[str, float | None]], scales: list[dict[str, str]] | None = None) -> Ledger:
    """A ledger of consecutive weeks ending a week before ``now``."""
    out = []
    for i, relative in enumerate(rows):
        until = now - timedelta(weeks=len(rows) - i)
        out.append(WeekScores(f"w{i}", until, relative, (scales or [{}] * len(rows))[i]))
    return Ledger(weeks=tuple(out))


def not_recheck(start: datetime) -> datetime:
    now = start
    while recheck_week(NAME, now):
        now += timedelta(weeks=1)
    return now


def test_a_candidate_that_lost_widely_three_weeks_running_is_skipped_except_on_its_recheck_week() -> None:
    now = not_recheck(datetime(2026, 3, 2, tzinfo=UTC))
    losing = [{**AHEAD, "prophet": 1.4, "persistence": 1.1}] * LOSER_WEEKS
    ledger = weeks_until(now, losing)
    skipped = ledger.skipped(KINDS, NAME, now)
    assert list(skipped) == ["prophet"] and "1.33x" in skipped["prophet"]  # 1.4 behind the third best, 1.05
    rechecks = [w for w in range(RECHECK_WEEKS) if recheck_week(NAME, now + timedelta(weeks=w))]
    assert len(rechecks) == 1  # one week in RECHECK_WEEKS scores it again
    later = now + timedelta(weeks=rechecks[0])
    assert weeks_until(later, losing).skipped(KINDS, NAME, later) == {}


@pytest.mark.parametrize(("rows", "why"), [
    pytest.param([{**AHEAD, "prophet": 1.4}] * (LOSER_WEEKS - 1), "too few weeks", id="two-weeks"),
    pytest.param([{**AHEAD, "prophet": 1.4}, {**AHEAD, "prophet": LOSER_MARGIN - 0.01}, {**AHEAD, "prophet": 1.4}],
                 "one close week", id="one-close-week"),
    pytest.param([{"arima": 1.0, "prophet": 1.4, "persistence": 1.5}] * LOSER_WEEKS,
                 "could have joined the combination (second best)", id="in-the-pool"),
    pytest.param([{**AHEAD, "ensemble": 3.0}] * LOSER_WEEKS, "the combination's default member", id="protected"),
])
def test_a_candidate_is_kept_unless_every_recent_week_says_it_lost_widely(rows: list[dict[str, float]], why: str) -> None:
    now = not_recheck(datetime(2026, 3, 2, tzinfo=UTC))
    assert weeks_until(now, rows).skipped(KINDS, NAME, now) == {}, why


def test_skipped_weeks_do_not_count_and_stale_weeks_are_forgotten() -> None:
    now = not_recheck(datetime(2026, 3, 2, tzinfo=UTC))
    rows: list[dict[str, float | None]] = [{**AHEAD, "prophet": 1.5}, {**AHEAD, "prophet": None},
                                           {**AHEAD, "prophet": 1.5}, {**AHEAD, "prophet": 1.5}]
    assert "prophet" in weeks_until(now, rows).skipped(KINDS, NAME, now)  # the last three *scored* weeks
    stale = weeks_until(now - timedelta(weeks=20), [{**AHEAD, "prophet": 1.5}] * 3)
    assert stale.skipped(KINDS, NAME, now) == {}


def test_never_down_to_one_candidate() -> None:
    now = not_recheck(datetime(2026, 3, 2, tzinfo=UTC))
    ledger = weeks_until(now, [{**AHEAD, "prophet": 2.0, "persistence": 2.0}] * LOSER_WEEKS)
    assert ledger.skipped(("arima", "prophet"), NAME, now) == {}
    assert ledger.skipped(("arima", "prophet", "persistence"), NAME, now) == {}
    assert set(ledger.skipped(KINDS, NAME, now)) == {"prophet", "persistence"}  # three left


def test_a_scale_that_won_widely_three_weeks_running_is_the_only_one_calibrated() -> None:
    now = not_recheck(datetime(2026, 3, 2, tzinfo=UTC))
    scales = [{"arima": "log", "prophet": "additive", "ets": "log"}, {"arima": "log", "prophet": "log", "ets": "log"},
              {"arima": "log", "prophet": "log", "ets": "log"}]
    margins = [{"arima": 1.2, "prophet": 1.3, "ets": 1.2}, {"arima": 1.15, "prophet": 1.3, "ets": 1.01},
               {"arima": 1.3, "prophet": 1.3, "ets": 1.2}]
    ledger = Ledger(weeks=tuple(replace(w, scale_margins=m) for w, m in zip(
        weeks_until(now, [{}] * 3, scales).weeks, margins, strict=True)))
    assert ledger.scales((*KINDS, "ets"), NAME, now) == {"arima": "log"}  # prophet flipped, ets won narrowly once
    pinned = Ledger(weeks=(*ledger.weeks, WeekScores("w3", now - timedelta(days=1), {}, {"arima": "log"})))
    assert pinned.scales(KINDS, NAME, now) == {"arima": "log"}  # a week on one scale is no evidence either way


def test_the_ledger_round_trips_and_a_malformed_one_is_refused_by_name() -> None:
    now = datetime(2026, 3, 2, tzinfo=UTC)
    ledger = replace(weeks_until(now, [{"arima": 1.0, "prophet": None}], [{"arima": "additive"}]),
                     warm={"holt-winters/day": (0.1, 0.01, 0.2, 0.9)})
    assert Ledger.from_json(ledger.to_json()) == ledger
    doc = json.loads(ledger.to_json())
    for broken, words in [
        ({**doc, "format": 99}, "format 99"),
        ({**doc, "warm": {"holt-winters/day": [1e400]}}, "finite"),
        ({**doc, "weeks": [{**doc["weeks"][0], "relative": {"arima": -1}}]}, "non-negative"),
        ({**doc, "weeks": [{**doc["weeks"][0], "scales": {"arima": "cubic"}}]}, "is not one of"),
        ({**doc, "weeks": [{**doc["weeks"][0], "scale_margins": {"arima": 0.5}}]}, "at least 1"),
    ]:
        with pytest.raises(ModelError, match=words):
            Ledger.from_json(json.dumps(broken).encode())
    with pytest.raises(ModelError, match="larger than"):
        Ledger.from_json(b" " * (1 << 17))


def test_relative_scores_are_mean_pinball_over_the_best_and_none_where_not_scored() -> None:
    models = {
        "arima": {"horizons": {"10m": {"pinball": 1.0}, "30m": {"pinball": 3.0}}},
        "prophet": {"horizons": {"10m": {"pinball": 4.0}, "30m": {"pinball": 4.0}}},
        "persistence": {"horizons": {}, "error": "persistence: failed"},
    }
    assert relative_scores(models, ("arima", "prophet", "persistence", "ensemble")) == {
        "arima": 1.0, "prophet": 2.0, "persistence": None, "ensemble": None}


def test_a_warm_started_holt_winters_fit_lands_where_the_cold_one_does() -> None:
    series = synthetic(21, noise=0.08)
    clear_fit_memo()
    last_week = HoltWintersForecaster().fit(series.slice(0, 14 * 288))
    start = fitted_parameters([last_week])["holt-winters/day"]
    clear_fit_memo()
    cold = HoltWintersForecaster().fit(series.slice(7 * 288, 21 * 288))
    warm = HoltWintersForecaster(start=start).fit(series.slice(7 * 288, 21 * 288))
    np.testing.assert_allclose([warm.alpha, warm.gamma], [cold.alpha, cold.gamma], rtol=0.1, atol=2e-3)
    outside = HoltWintersForecaster(start=(2.0, 0.0, 0.0, 0.9))  # not a fit of this model: starts cold
    assert outside._start(4) is None


def test_a_warm_started_arima_fit_lands_where_the_cold_one_does_in_fewer_likelihoods(monkeypatch) -> None:
    from statsmodels.tsa.statespace.mlemodel import MLEModel

    from predictive_scaler.forecasting.arima import ArimaForecaster, fit_residual_arima

    series = synthetic(21, noise=0.08)
    clear_fit_memo()
    last_week = ArimaForecaster().fit(series.slice(0, 14 * 288))
    start = fitted_parameters([last_week])[ARIMA_KEY]
    assert len(start) == 2  # AR and MA: the variance is not searched
    assert Ledger(warm={ARIMA_KEY: start}).options()["arima"] == {"start": start}
    assert Ledger(warm={ARIMA_KEY: start}).options()["ensemble"]["member_options"]["arima"] == {"start": start}
    clear_fit_memo()
    calls = []
    loglike = MLEModel.loglike
    monkeypatch.setattr(MLEModel, "loglike", lambda self, *a, **k: (calls.append(1), loglike(self, *a, **k))[1])
    cold = ArimaForecaster().fit(series.slice(7 * 288, 21 * 288))
    cold_calls, calls[:] = len(calls), []
    warm = ArimaForecaster(start=start).fit(series.slice(7 * 288, 21 * 288))
    assert len(calls) < cold_calls
    np.testing.assert_allclose(warm.arima_params, cold.arima_params, rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(warm.coef, cold.coef)  # the regression is not searched
    # Not a fit of this model (non-stationary AR, wrong length, NaN): the search starts cold, same result.
    resid = np.random.default_rng(2).normal(0.0, 0.1, 2000).cumsum() * 0.01
    reference = fit_residual_arima(resid, (1, 1, 1))
    for bad in ((1.5, 0.2), (0.3,), (float("nan"), 0.1)):
        np.testing.assert_array_equal(fit_residual_arima(resid, (1, 1, 1), bad), reference)


@pytest.mark.slow  # ~20 s: eight weekly trainings of five candidates
def test_weekly_runs_fill_the_ledger_skip_a_loser_and_start_cold_when_it_is_unreadable() -> None:
    t = target("chat")
    settings = replace(FAST, kinds=("persistence", "seasonal-naive", "holt-winters", "quantile-regression", "arima"))
    history = FakeHistory({t.key: synthetic(70, noise=0.02)})
    store = MemoryStore()
    skipped_weeks = 0
    for week in range(7):
        now = START + timedelta(days=28 + 7 * week)
        outcome = train_and_promote(t, history, store, settings, now, f"w{week}")
        assert outcome.result in ("promoted", "kept"), outcome.reason
        ledger = Ledger.from_json(store.ledgers[t.model_name])
        assert ledger.weeks[-1].run_id == f"w{week}"
        skipped = [n for n in outcome.notes if n.startswith("candidates skipped")]
        if skipped:
            skipped_weeks += 1
            assert not recheck_week(t.model_name, now)
            gone = [k for k, v in ledger.weeks[-1].relative.items() if v is None]
            assert gone and all(k in skipped[0] for k in gone)  # not scored, said so
    assert skipped_weeks >= 1  # a loser was in fact skipped: the loop above checked something
    assert "holt-winters/day" in ledger.warm
    assert ARIMA_KEY in ledger.warm

    store.ledgers[t.model_name] = b"{not json"
    now = START + timedelta(days=28 + 7 * 7)
    outcome = train_and_promote(t, history, store, settings, now, "w7")
    assert outcome.result in ("promoted", "kept")
    assert any("selection ledger not used" in n for n in outcome.notes)
    assert Ledger.from_json(store.ledgers[t.model_name]).weeks[-1].run_id == "w7"  # rewritten, one week


def test_cold_settings_neither_read_nor_write_the_ledger() -> None:
    t = target("chat")
    store = MemoryStore()
    settings = replace(FAST, reuse_earlier_weeks=False)
    train_and_promote(t, FakeHistory({t.key: synthetic(35)}), store, settings, START + timedelta(days=28), "w1")
    assert store.ledgers == {}


@pytest.mark.parametrize("planted", ["a directory at the ledger", "a file at its folder", "a FIFO at the ledger"])
def test_a_ledger_path_that_is_not_a_file_never_costs_the_week(planted: str, tmp_path: Path) -> None:
    """Whatever sits where the ledger goes, the scaler is trained and promoted, cold, and the notes say why;
    nothing blocks on a FIFO."""
    import os

    from predictive_scaler.forecasting.store import ModelStore
    from predictive_scaler.retrain.stores import DirectoryStore

    t = target("chat")
    folder = tmp_path / t.model_name / "selection"
    if planted == "a directory at the ledger":
        (folder / "ledger.json").mkdir(parents=True)
    elif planted == "a file at its folder":
        folder.parent.mkdir(parents=True)
        folder.write_text("not a folder")
    else:
        folder.mkdir(parents=True)
        os.mkfifo(folder / "ledger.json")
    outcome = train_and_promote(t, FakeHistory({t.key: synthetic(35)}), DirectoryStore(ModelStore(tmp_path)), FAST,
                                START + timedelta(days=28), "w1")
    assert outcome.result == "promoted", outcome.reason
    said = " ".join(outcome.notes)
    if planted == "a FIFO at the ledger":
        assert "selection ledger not used" in said and "FIFO" in said
        assert Ledger.from_json((folder / "ledger.json").read_bytes()).weeks[-1].run_id == "w1"  # replaced
    else:
        assert "selection ledger not written" in said and "next week runs cold" in said

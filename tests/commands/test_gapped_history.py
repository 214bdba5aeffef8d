"""History with gaps is history: a 22-day one-minute trace with a daily half-hour gap (a maintenance
window, a scrape outage) runs through `backtest`, `train` and `evaluate` with their default settings,
wherever the gap falls against the training window's edges — and the one minimum-history rule
(:func:`observed_history`) says what it does about a gap at the moment of reading."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.cli import main
from predictive_scaler.errors import InsufficientHistoryError
from predictive_scaler.series import Series, check_history, observed_history, parse_duration

DAYS = 22


def gapped_trace(path: Path, gap_starts_at_minute: int) -> Path:
    """22 days at one minute, a daily cycle with bursts, minutes [m, m+30) of every day missing."""
    idx = pd.date_range("2024-03-01", periods=DAYS * 1440, freq="1min", tz="UTC")
    t = np.arange(len(idx))
    rng = np.random.default_rng(3)
    values = 100 + 50 * np.sin(2 * np.pi * t / 1440) + rng.normal(0, 4, len(idx))
    values = np.where(t % 120 < 8, 2.5 * values, values)  # a burst every two hours
    minute_of_day = t % 1440
    keep = ~((minute_of_day >= gap_starts_at_minute) & (minute_of_day < gap_starts_at_minute + 30))
    frame = pd.DataFrame({"timestamp": idx[keep].strftime("%Y-%m-%dT%H:%M:%SZ"), "value": values[keep].round(3)})
    frame.to_csv(path, index=False)
    return path


def run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue() + err.getvalue()


# 00:00: the file starts right after a gap; 23:30: every window ending at midnight ends in one.
@pytest.mark.parametrize("gap_at", [0, 23 * 60 + 30], ids=["gap-after-midnight", "gap-before-midnight"])
def test_backtest_train_and_evaluate_run_on_a_trace_with_a_daily_gap(tmp_path: Path, gap_at: int) -> None:
    trace = str(gapped_trace(tmp_path / "gapped.csv", gap_at))
    code, text = run(["backtest", "--trace", trace])
    assert code == 0, text
    assert "predictive" in text and "insufficient history" not in text
    code, text = run(["train", "--trace", trace, "--out", str(tmp_path / "store"), "--name", "gapped"])
    assert code == 0, text
    assert "(serving)" in text
    code, text = run(["evaluate", "--trace", trace])
    assert code == 0, text
    assert "selected:" in text


def series(values: list[float], step: int = 60) -> Series:
    return Series(values=np.array(values, dtype=float), start=pd.Timestamp("2024-01-01T00:00:00Z"),
                  step_seconds=step, name="s")


def test_a_gap_at_the_moment_of_reading_is_a_gap_inside_the_history() -> None:
    s = series([np.nan, 1, 2, np.nan, 4, np.nan, np.nan])
    read_at = s.start + pd.Timedelta(minutes=7)
    held = observed_history(s, read_at)
    assert (held.start, len(held)) == (s.start + pd.Timedelta(minutes=1), 6)  # first observation → reading
    assert held.missing_fraction == pytest.approx(3 / 6)
    assert len(observed_history(s)) == 4  # a file: first to last row


def test_a_metric_that_stopped_is_refused_by_its_missing_share_not_counted_as_history() -> None:
    day = 1440
    s = series([1.0] * (2 * day) + [np.nan] * (12 * day))  # observed for 2 days, then nothing for 12
    held = observed_history(s, s.end)
    assert held.span == parse_duration("14d")
    with pytest.raises(InsufficientHistoryError, match="86% of the 20,160 steps are missing"):
        check_history(held, parse_duration("14d"), max_missing=0.2)

"""series.py: loading traces, refusing bad input with a useful message, resampling."""

from __future__ import annotations

import warnings
from datetime import timedelta

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.errors import DataError, InsufficientHistoryError
from predictive_scaler.series import (
    Series,
    ValueKind,
    format_duration,
    load_trace,
    parse_duration,
)


def _csv(tmp_path, text: str, name: str = "trace.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _rows(n: int, step: int = 300, start: int = 1_700_000_000, value: str = "1") -> str:
    return "".join(f"{start + i * step},{value}\n" for i in range(n))


DAY5 = 288  # rows per day at 5 minutes


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the file is empty"),
        ("timestamp,value\n", "header but no rows"),
        ("time,count\n1700000000,1\n", "wrong columns"),
        ("timestamp,value,extra\n1700000000,1,2\n", "wrong columns"),
        ("timestamp,value\n1700000000,1\n1700000300,abc\n", "row 3: value 'abc' is not a number"),
        ("timestamp,value\n1700000000,1\n1700000300,-4\n", "row 3: negative rate -4"),
        ("timestamp,value\n1700000000,1\n1700000000,2\n", "row 3: timestamp .* is duplicate"),
        ("timestamp,value\n1700000300,1\n1700000000,2\n", "row 3: timestamp .* is earlier than the one before"),
        ("timestamp,value\n1700000000000,1\n1700000300000,2\n", "row 2: timestamp 1700000000000 looks like epoch milliseconds"),
        ("timestamp,value\nyesterday,1\n", "row 2: cannot read timestamp 'yesterday'"),
        ("timestamp,value\n1700000000,inf\n1700000300,1\n", "row 2: value 'inf' is infinite"),
    ],
    ids=["empty", "header-only", "wrong-names", "extra-column", "non-numeric", "negative",
         "duplicate", "decreasing", "epoch-ms", "bad-timestamp", "infinite"],
)
def test_bad_input_is_refused_with_file_row_and_remedy(tmp_path, text, message):
    path = _csv(tmp_path, text)
    with pytest.raises(DataError, match=message) as info:
        load_trace(path, min_history=None)
    assert str(path) in str(info.value)


def test_negative_count_is_named_a_count(tmp_path):
    path = _csv(tmp_path, "timestamp,value\n1700000000,1\n1700000300,-1\n")
    with pytest.raises(DataError, match="negative count"):
        load_trace(path, value_kind="count", min_history=None)


def test_missing_file_says_what_to_give(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_trace(tmp_path / "nope.csv")


def test_eleven_days_are_insufficient_history(tmp_path):
    path = _csv(tmp_path, "timestamp,value\n" + _rows(11 * DAY5))
    with pytest.raises(InsufficientHistoryError, match=r"insufficient history: 11\.0 days < 14 days required"):
        load_trace(path)


def test_lowering_min_history_warns_and_loads(tmp_path):
    path = _csv(tmp_path, "timestamp,value\n" + _rows(11 * DAY5))
    with pytest.warns(UserWarning, match="below the 14 days"):
        series = load_trace(path, min_history=timedelta(days=7))
    assert series.span == timedelta(days=11)


def test_fourteen_days_load_without_warning(tmp_path):
    path = _csv(tmp_path, "timestamp,value\n" + _rows(14 * DAY5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        series = load_trace(path)
    assert len(series) == 14 * DAY5 and series.step_seconds == 300


def test_gaps_stay_nan_never_zero(tmp_path):
    lines = [f"{1_700_000_000 + i * 60},{i + 1}" for i in range(10) if i not in (3, 4)]
    lines.append("1700000600,NaN")
    path = _csv(tmp_path, "timestamp,value\n" + "\n".join(lines) + "\n")
    series = load_trace(path, min_history=None)
    assert len(series) == 11
    assert np.isnan(series.values[[3, 4, 10]]).all()
    assert not np.isnan(np.delete(series.values, [3, 4, 10])).any()


def test_iso_timestamps_with_z_are_utc(tmp_path):
    path = _csv(tmp_path, "timestamp,value\n2024-01-01T00:00:00Z,1\n2024-01-01T00:01:00Z,2\n")
    series = load_trace(path, min_history=None)
    assert series.start == pd.Timestamp("2024-01-01T00:00:00Z") and series.step_seconds == 60


def test_parquet_is_read_like_csv(tmp_path):
    frame = pd.DataFrame({"timestamp": pd.date_range("2024-01-01", periods=5, freq="5min", tz="UTC"),
                          "value": [1.0, 2.0, np.nan, 4.0, 5.0]})
    path = tmp_path / "t.parquet"
    frame.to_parquet(path)
    series = load_trace(path, min_history=None)
    assert len(series) == 5 and np.isnan(series.values[2])


def _series(values, step, kind=ValueKind.RATE, start="2024-01-01T00:00:00Z"):
    return Series(values=np.asarray(values, float), start=pd.Timestamp(start), step_seconds=step,
                  value_kind=kind)


@pytest.mark.parametrize(
    ("kind", "values", "to_step", "expected"),
    [
        (ValueKind.RATE, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 300, [3.0, 8.0]),
        (ValueKind.COUNT, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 300, [15.0, 40.0]),
        (ValueKind.RATE, [1, np.nan, 3, 4, 5], 300, [3.25]),  # mean of the present minutes
        (ValueKind.COUNT, [1, np.nan, 3, 4, 5], 300, [np.nan]),  # a partial sum would read as a dip
    ],
    ids=["rate-1to5-mean", "count-1to5-sum", "rate-gap-mean", "count-gap-nan"],
)
def test_merging_steps(kind, values, to_step, expected):
    out = _series(values, 60, kind).resample(to_step)
    np.testing.assert_allclose(out.values, expected)
    assert out.step_seconds == to_step


@pytest.mark.parametrize(
    ("kind", "from_step", "to_step"),
    [(ValueKind.RATE, 900, 300), (ValueKind.COUNT, 900, 300), (ValueKind.RATE, 300, 60),
     (ValueKind.COUNT, 300, 60)],
    ids=["rate-15to5", "count-15to5", "rate-5to1", "count-5to1"],
)
def test_split_then_merge_round_trips(kind, from_step, to_step):
    orig = _series([10.0, 20.0, 30.0], from_step, kind)
    split = orig.resample(to_step)
    assert len(split) == 3 * from_step // to_step
    if kind is ValueKind.COUNT:
        assert np.nansum(split.values) == pytest.approx(60.0)  # counts are shared, totals kept
    np.testing.assert_allclose(split.resample(from_step).values, orig.values)


def test_merge_aligns_buckets_to_the_clock():
    out = _series(np.arange(10), 60, start="2024-01-01T00:03:00Z").resample(300)
    assert out.start == pd.Timestamp("2024-01-01T00:00:00Z")
    np.testing.assert_allclose(out.values, [0.5, 4.0, 8.0])  # :03–:04, :05–:09, :10–:12


def test_resample_to_a_non_multiple_is_refused():
    with pytest.raises(DataError, match="multiple"):
        _series([1, 2, 3], 60).resample(90)


def test_span_is_steps_times_step():
    s = _series(np.ones(20160), 60)
    assert s.span == timedelta(days=14)
    assert s.until(s.start + timedelta(minutes=5)).values.size == 6


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30m", 1800), ("90s", 90), ("2h", 7200), ("14d", 14 * 86400), ("1w", 604800), ("45", 45)],
    ids=["minutes", "seconds", "hours", "days", "weeks", "bare-number"],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text).total_seconds() == seconds
    assert parse_duration(format_duration(parse_duration(text))) == parse_duration(text)


def test_parse_duration_refuses_nonsense():
    with pytest.raises(DataError, match="30s, 10m"):
        parse_duration("soon")


# -- the right reason for timestamps and values ---------------------------------------------------------

def _iso_rows(fmt: str, n: int = 3) -> str:
    start = pd.Timestamp("2024-01-01T00:00:00Z")
    return "".join(f"{(start + pd.Timedelta(minutes=5 * i)).strftime(fmt)},{i}\n" for i in range(n))


def test_lower_case_rfc3339_is_read(tmp_path):
    series = load_trace(_csv(tmp_path, "timestamp,value\n" + _iso_rows("%Y-%m-%dt%H:%M:%Sz")), min_history=None)
    assert series.start == pd.Timestamp("2024-01-01T00:00:00Z") and len(series) == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("timestamp,value\n" + _iso_rows('"%a, %d %b %Y %H:%M:%S +0000"'), "is an RFC 2822 date"),
        ("timestamp,value\n" + _iso_rows("%a, %d %b %Y %H:%M:%S +0000"), "one field more than the 'timestamp,value'"),
        ("timestamp,value\n" + _iso_rows("%m/%d/%Y %H:%M"), "is a date, but not ISO-8601"),
        ("timestamp,value\n12024-01-01T00:00:00Z,1\n", "outside the years 1678–2261"),
        ("timestamp,value\n1700000000000000,1\n1700000300000000,2\n", "looks like epoch microseconds"),
        ("timestamp,value\n1700000000000000000,1\n1700000300000000000,2\n", "looks like epoch nanoseconds"),
    ],
    ids=["rfc2822", "rfc2822-unquoted", "month-day-year", "year-12024", "epoch-us", "epoch-ns"],
)
def test_timestamps_are_refused_for_what_they_are(tmp_path, text, message):
    with pytest.raises(DataError, match=message):
        load_trace(_csv(tmp_path, text), min_history=None)


def test_named_columns_in_either_order_are_read(tmp_path):
    series = load_trace(_csv(tmp_path, "value,timestamp\n" + "".join(
        f"{i},{1_700_000_000 + 300 * i}\n" for i in range(3))), min_history=None)
    assert list(series.values) == [0.0, 1.0, 2.0]


def test_a_parquet_timestamp_index_is_the_timestamp(tmp_path):
    t = pd.date_range("2024-01-01", periods=3, freq="5min", tz="UTC", name="timestamp")
    pd.DataFrame({"value": [1.0, 2.0, 3.0]}, index=t).to_parquet(tmp_path / "t.parquet")
    series = load_trace(tmp_path / "t.parquet", min_history=None)
    assert series.start == t[0] and list(series.values) == [1.0, 2.0, 3.0]


@pytest.mark.parametrize(("values", "message"), [
    ([True, False, True], r"of type bool \(true/false values, which would read as 0/1 demand\)"),
    (pd.date_range("2024-01-01", periods=3), "of type datetime64"),
    (["1", "x", "2"], r"row 2: value 'x' is not a number \(the value column holds str values"),
], ids=["bool", "datetime", "text"])
def test_parquet_values_that_are_not_numbers_are_refused_by_type(tmp_path, values, message):
    t = pd.date_range("2024-01-01", periods=3, freq="5min", tz="UTC")
    pd.DataFrame({"timestamp": t, "value": values}).to_parquet(tmp_path / "t.parquet")
    with pytest.raises(DataError, match=message):
        load_trace(tmp_path / "t.parquet", min_history=None)


def test_parse_duration_refuses_a_huge_whole_number_by_its_length():
    with pytest.raises(DataError, match="of a 401-digit number of seconds is not a usable length of time"):
        parse_duration(10**400)

"""Regular-grid time series: the one shape demand data takes inside the package.

A :class:`Series` is a start time, a fixed step and a float array. Missing
observations are NaN, never zero: a gap in the data must never look like a
quiet period (that is how autoscalers scale workloads to zero).

:func:`load_trace` reads a ``timestamp,value`` CSV or Parquet file and refuses,
with an error naming the file, the row and what to do, anything it would
otherwise have to guess about.
"""

from __future__ import annotations

import enum
import math
import re
import warnings
import zoneinfo
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO

import numpy as np
import pandas as pd

from predictive_scaler.errors import ConfigError, DataError, InsufficientHistoryError, did_you_mean
from predictive_scaler.yaml_input import (
    MAX_TRACE_BYTES,
    MAX_TRACE_LINE_BYTES,
    TRACE_BYTES_ENV,
    byte_limit,
    excerpt,
    open_regular,
    scan_lines,
)

#: History the models need by default: two full weeks, so the weekly cycle is seen twice.
DEFAULT_MIN_HISTORY = timedelta(days=14)

# Epoch seconds of year 5138 — anything larger is almost surely milliseconds.
_EPOCH_MS_THRESHOLD = 1e11
#: Most steps a trace's grid may hold (19 years at one minute, 80 MB): a trace spanning more is
#: almost surely a typo in a year, and is refused before anything that size is allocated.
MAX_GRID_STEPS = 10_000_000
#: Longest duration a flag or setting may give (a century): longer is a typo, and overflows.
_MAX_DURATION_SECONDS = 100 * 365.25 * 86400
#: Largest share of missing steps a trace may have when its history is checked (``--max-missing``).
DEFAULT_MAX_MISSING = 0.5
#: Times this tool can hold (nanosecond timestamps): years 1678 to 2261.
_FIRST_TIME = pd.Timestamp("1678-01-01", tz="UTC")
_LAST_TIME = pd.Timestamp("2261-12-31", tz="UTC")
# An ISO-8601 time of day followed by Z or a numeric UTC offset.
_HAS_OFFSET = re.compile(r"\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?\s*(?:[zZ]|[+-]\d{2}(?::?\d{2})?)$")


class ValueKind(enum.StrEnum):
    """What a value means, which decides how it is resampled."""

    #: A rate (requests/s, requests/min, GPU %): averaged when steps are merged.
    RATE = "rate"
    #: A count per step (requests in this step): summed when steps are merged.
    COUNT = "count"


@dataclass(frozen=True)
class Series:
    """Observations on a regular grid; ``values[i]`` is the step starting at ``start + i*step``."""

    values: np.ndarray
    start: pd.Timestamp
    step_seconds: int
    name: str = "series"
    value_kind: ValueKind = ValueKind.RATE
    source: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        arr = np.asarray(self.values, dtype=float)
        if arr.ndim != 1:
            raise DataError(f"series {self.name!r}: values must be one-dimensional, got shape {arr.shape}")
        if not isinstance(self.step_seconds, int | np.integer) or self.step_seconds <= 0:
            raise DataError(f"series {self.name!r}: step must be a positive whole number of seconds, got {self.step_seconds!r}")
        start = pd.Timestamp(self.start)
        start = start.tz_localize("UTC") if start.tzinfo is None else start.tz_convert("UTC")
        arr = arr.copy()
        arr.flags.writeable = False
        object.__setattr__(self, "values", arr)
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "step_seconds", int(self.step_seconds))
        object.__setattr__(self, "value_kind", ValueKind(self.value_kind))

    # -- shape -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.values.shape[0])

    @property
    def step(self) -> timedelta:
        return timedelta(seconds=self.step_seconds)

    @property
    def span(self) -> timedelta:
        """Number of steps × step (a 14-day trace at 1 min has 20,160 steps)."""
        return self.step * len(self)

    @property
    def end(self) -> pd.Timestamp:
        """Exclusive end: the start of the step after the last one."""
        return self.start + self.span

    @property
    def last_time(self) -> pd.Timestamp:
        return self.start + self.step * (len(self) - 1)

    def timestamps(self) -> pd.DatetimeIndex:
        return pd.date_range(self.start, periods=len(self), freq=f"{self.step_seconds}s")

    def to_pandas(self) -> pd.Series:
        return pd.Series(self.values, index=self.timestamps(), name=self.name)

    @property
    def missing_fraction(self) -> float:
        return float(np.isnan(self.values).mean()) if len(self) else 1.0

    # -- slicing -----------------------------------------------------------------------------
    def index_at(self, when: datetime | pd.Timestamp) -> int:
        """Index of the step containing ``when`` (may be <0 or ≥len for times outside)."""
        delta = (to_utc(when) - self.start).total_seconds()
        return math.floor(delta / self.step_seconds)

    def slice(self, i: int, j: int) -> Series:
        """Steps ``i`` to ``j`` (exclusive), clamped to the series."""
        i = max(0, min(i, len(self)))
        j = max(i, min(j, len(self)))
        return self._with(self.values[i:j], self.start + self.step * i)

    def until(self, when: datetime | pd.Timestamp) -> Series:
        """Observations whose step started at or before ``when`` — what was known at ``when``."""
        return self.slice(0, self.index_at(when) + 1)

    def tail(self, n: int) -> Series:
        return self.slice(len(self) - n, len(self))

    def _with(self, values: np.ndarray, start: pd.Timestamp, step_seconds: int | None = None) -> Series:
        return Series(
            values=values,
            start=start,
            step_seconds=self.step_seconds if step_seconds is None else step_seconds,
            name=self.name,
            value_kind=self.value_kind,
            source=self.source,
        )

    # -- resampling --------------------------------------------------------------------------
    def resample(self, step_seconds: int) -> Series:
        """Put the series on another grid (1 min ↔ 5 min ↔ 15 min …).

        Merging steps: rates by mean of the present values, counts by sum — a
        bucket with any missing count is NaN, since a partial sum would read as
        a dip. Splitting steps: rates repeat, counts are shared evenly.
        """
        if step_seconds == self.step_seconds:
            return self
        if step_seconds <= 0:
            raise DataError(f"series {self.name!r}: resample step must be positive, got {step_seconds}")
        if step_seconds > self.step_seconds:
            if step_seconds % self.step_seconds:
                raise DataError(
                    f"series {self.name!r}: cannot resample a {self.step_seconds}s step to {step_seconds}s; "
                    "choose a multiple of the trace's step"
                )
            k = step_seconds // self.step_seconds
            # Align buckets on multiples of the new step from the epoch, so
            # 5-minute buckets start at :00, :05 … whatever the trace's first minute.
            offset = int(self.start.timestamp()) % step_seconds // self.step_seconds
            head = np.full(offset, np.nan) if offset else np.empty(0)
            vals = np.concatenate([head, self.values])
            new_start = self.start - self.step * offset
            n = math.ceil(len(vals) / k)
            pad = n * k - len(vals)
            vals = np.concatenate([vals, np.full(pad, np.nan)]).reshape(n, k)
            if self.value_kind is ValueKind.COUNT:
                merged = vals.sum(axis=1)  # NaN if any piece is missing
            else:
                present = np.isfinite(vals)
                counts = present.sum(axis=1)
                sums = np.where(present, vals, 0.0).sum(axis=1)
                with np.errstate(invalid="ignore", divide="ignore"):
                    merged = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
            return self._with(merged, new_start, step_seconds)
        if self.step_seconds % step_seconds:
            raise DataError(
                f"series {self.name!r}: cannot resample a {self.step_seconds}s step to {step_seconds}s; "
                "choose a divisor of the trace's step"
            )
        k = self.step_seconds // step_seconds
        split = np.repeat(self.values, k)
        if self.value_kind is ValueKind.COUNT:
            split = split / k
        return self._with(split, self.start, step_seconds)


def to_utc(when: datetime | pd.Timestamp) -> pd.Timestamp:
    """``when`` as a UTC timestamp; a naive time is taken to be UTC already."""
    ts = pd.Timestamp(when)
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def parse_duration(text: str | int | float | timedelta) -> timedelta:
    """'30m', '90s', '2h', '14d', '1w' or a number of seconds → timedelta."""
    if isinstance(text, timedelta):
        return text
    if isinstance(text, int | float) and not isinstance(text, bool):
        try:
            seconds = float(text)
        except OverflowError:  # a whole number too large for a float: absurd, refused below
            seconds = math.inf if text > 0 else -math.inf
        if not math.isfinite(seconds) and isinstance(text, float):
            raise DataError(f"duration must be finite, got {text!r}")
    else:
        s = str(text).strip().lower()
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
        try:
            seconds = float(s[:-1]) * units[s[-1]] if s and s[-1] in units else float(s)
        except ValueError:
            raise DataError(
                f"cannot read duration {excerpt(text)}: write a number with a unit, e.g. 30s, 10m, 2h, 14d"
            ) from None
    if not math.isfinite(seconds) or abs(seconds) > _MAX_DURATION_SECONDS:
        from predictive_scaler.spec import number_text

        number = "" if isinstance(text, str) else number_text(text)
        shown = excerpt(text) if isinstance(text, str) else (
            f"of {number} of seconds" if number.startswith("a ") else f"{number} s")
        raise DataError(f"duration {shown} is not a usable length of time (a finite one of at most 100 years); "
                        "write one such as 30s, 10m, 2h, 14d")
    return timedelta(seconds=seconds)


def format_duration(delta: timedelta) -> str:
    secs = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs % size == 0 and secs >= size:
            return f"{secs // size}{unit}"
    return f"{secs}s"


# -- loading ---------------------------------------------------------------------------------

def load_trace(
    path: str | Path,
    *,
    value_kind: ValueKind | str = ValueKind.RATE,
    min_history: timedelta | None = DEFAULT_MIN_HISTORY,
    name: str | None = None,
    timezone: str | None = None,
    max_missing: float | None = DEFAULT_MAX_MISSING,
) -> Series:
    """Read a ``timestamp,value`` CSV or Parquet trace onto its own regular grid.

    ``min_history`` below 14 days is allowed but warned about; ``None`` disables the check (and
    the ``max_missing`` share of missing steps that comes with it). Timestamps without a UTC
    offset are refused unless ``timezone`` (an IANA name such as ``Europe/Berlin`` or ``UTC``)
    says where they were written; a file mixing both is always refused.
    """
    p = Path(path)
    kind = ValueKind(value_kind)
    zone = parse_timezone(timezone) if timezone is not None else None
    if not p.exists():
        raise DataError(f"{p}: no such file; give the path of a timestamp,value CSV or Parquet trace")
    if p.is_dir():
        inside = sorted(q.name for q in p.iterdir() if q.suffix.lower() in (".csv", ".parquet", ".pq"))[:3]
        hint = f" (it holds {', '.join(inside)})" if inside else ""
        raise DataError(f"{p}: is a directory, not a trace file{hint}; give the path of one timestamp,value "
                        "CSV or Parquet file")
    limit = byte_limit(TRACE_BYTES_ENV, MAX_TRACE_BYTES)
    # One open file, checked to be regular (a FIFO or a device is refused, never read), is what is
    # sniffed, measured and parsed: the path cannot be swapped in between.
    with open_regular(p, what="a trace", remedy="give the path of a timestamp,value CSV or Parquet file",
                      error=DataError, max_bytes=limit,
                      too_big=f"{_SHORTER}, or raise the limit with {TRACE_BYTES_ENV}=BYTES") as fh:
        if p.suffix.lower() in (".parquet", ".pq"):
            frame, header_rows = _read_parquet(p, fh), 0
        else:
            frame, header_rows = _read_csv(p, fh), 1
    return series_from_frame(frame, source=str(p), value_kind=kind, min_history=min_history,
                             name=name or p.stem, first_row=header_rows + 1, timezone=zone,
                             max_missing=max_missing)


def _sniff_text(p: Path, head: bytes) -> None:
    """Refuse, naming what it is, a file that is not UTF-8 CSV text (compressed, UTF-16, binary), from
    ``head``, its first bytes (the caller opened it, once, as a regular file)."""
    what = None
    if head[:2] == b"\x1f\x8b":
        what = "gzip-compressed; decompress it first (gunzip)"
    elif head[:4] == b"PK\x03\x04":
        what = "a ZIP archive; extract the CSV from it first"
    elif head[:4] == b"PAR1":
        what = "a Parquet file; name it .parquet"
    elif head[:4] in (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff"):  # before UTF-16: it shares the first two bytes
        what = "UTF-32 text; save it as UTF-8"
    elif head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        what = "UTF-16 text; save it as UTF-8"
    elif b"\x00" in head:
        what = "binary (it holds NUL bytes), not CSV text; give a timestamp,value CSV or Parquet file"
    else:
        try:
            head.decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.start < len(head) - 4:  # not just a character cut at the end of the sample
                what = (f"not UTF-8 text (byte 0x{head[exc.start]:02x} at offset {exc.start}); save it as UTF-8")
    if what is not None:
        raise DataError(f"{p}: the file is {what}")


_SHORTER = "cut it into shorter files or resample it to a coarser step"


def _read_csv(p: Path, fh: IO[bytes]) -> pd.DataFrame:
    """The rows of the CSV trace open as ``fh``, once it is known to be text with no more rows than a
    trace may hold (one per step of its grid) and no line longer than any row is."""
    _sniff_text(p, fh.read(65536))
    fh.seek(0)
    scan = scan_lines(fh, max_lines=MAX_GRID_STEPS + 1, max_line_bytes=MAX_TRACE_LINE_BYTES)
    fh.seek(0)
    if scan.long_line is not None:
        raise DataError(f"{p}: row {scan.long_line} is over {MAX_TRACE_LINE_BYTES:,} bytes long, which no "
                        "timestamp,value row is; check that this is a trace: one 'timestamp,value' pair per line")
    if scan.lines > MAX_GRID_STEPS + 1:
        raise DataError(f"{p}: more than {MAX_GRID_STEPS:,} rows, the most a trace may hold; {_SHORTER}")
    try:
        return pd.read_csv(fh, dtype=str, keep_default_na=False, skipinitialspace=True)
    except pd.errors.EmptyDataError as exc:
        raise DataError(f"{p}: the file is empty; a trace needs a 'timestamp,value' header and rows") from exc
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise DataError(f"{p}: not a readable CSV file ({exc}); write one 'timestamp,value' pair per line") from exc


def _read_parquet(p: Path, fh: IO[bytes]) -> pd.DataFrame:
    """The Parquet trace open as ``fh``: its row count checked from the metadata before it is read, and
    no column name or text cell longer than a row of a CSV trace may be."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        # pyarrow is an extra (the controller reads Prometheus, never a file): say which one.
        raise ConfigError(f"{p}: reading a Parquet trace needs pyarrow, which is not installed; install "
                          "the parquet extra: pip install 'predictive-scaler[parquet]' (or give the trace as "
                          "CSV)") from exc
    try:
        rows = pq.ParquetFile(fh).metadata.num_rows
        fh.seek(0)
        frame = pd.read_parquet(fh) if rows <= MAX_GRID_STEPS else None
    except Exception as exc:  # pyarrow raises many types
        raise DataError(f"{p}: not a readable Parquet file ({exc}); export it again as timestamp,value") from exc
    if frame is None:
        raise DataError(f"{p}: {rows:,} rows, more than the {MAX_GRID_STEPS:,} a trace may hold; {_SHORTER}")
    for column in frame.columns:
        if len(str(column)) > MAX_TRACE_LINE_BYTES:
            raise DataError(f"{p}: a column name is {len(str(column)):,} characters long ({excerpt(str(column))}); "
                            "a trace has two columns, 'timestamp' and 'value'")
        cells = frame[column]
        if not (pd.api.types.is_numeric_dtype(cells) or pd.api.types.is_datetime64_any_dtype(cells)):
            long = np.flatnonzero(cells.astype(str).str.len().to_numpy() > MAX_TRACE_LINE_BYTES)
            if long.size:
                raise DataError(f"{p}: row {int(long[0]) + 1}: the {excerpt(str(column))} cell is over "
                                f"{MAX_TRACE_LINE_BYTES:,} characters long, which no timestamp or value is; check "
                                "that this is a timestamp,value trace")
    return frame


def parse_timezone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA time zone ``name`` (``--timezone``); a ConfigError with the nearest names otherwise."""
    try:
        return zoneinfo.ZoneInfo(name.strip())
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        hint = did_you_mean(name.strip(), sorted(zoneinfo.available_timezones()))
        raise ConfigError(
            f"--timezone {name!r} is not a time zone; {hint}give an IANA name such as UTC, Europe/Berlin or "
            "America/New_York",
            field="timezone",
        ) from None


def series_from_frame(
    frame: pd.DataFrame,
    *,
    source: str,
    value_kind: ValueKind = ValueKind.RATE,
    min_history: timedelta | None = DEFAULT_MIN_HISTORY,
    name: str = "series",
    first_row: int = 1,
    timezone: zoneinfo.ZoneInfo | None = None,
    max_missing: float | None = DEFAULT_MAX_MISSING,
) -> Series:
    frame = _trace_columns(frame, source, first_row)
    if len(frame) == 0:
        raise DataError(f"{source}: the file has a header but no rows; add timestamp,value rows")

    times = _parse_timestamps(frame["timestamp"], source, first_row, timezone)
    # A reader that typed the columns (Parquet) said what the values are; a CSV is text throughout.
    typed = not all(pd.api.types.is_string_dtype(frame[c]) for c in frame.columns)
    values = _parse_values(frame["value"], source, first_row, value_kind, typed=typed)

    times = times.as_unit("ns")
    ns = times.asi8
    diffs = np.diff(ns)
    bad = np.flatnonzero(diffs <= 0)
    if bad.size:
        i = int(bad[0]) + 1
        what = "duplicate" if diffs[bad[0]] == 0 else "earlier than the one before"
        raise DataError(
            f"{source}: row {i + first_row}: timestamp {times[i]} is {what}; timestamps must strictly "
            "increase — sort the file and remove duplicates"
        )
    if len(ns) < 2:
        raise DataError(f"{source}: only one row; a trace needs many regularly spaced rows")
    step_ns = int(pd.Series(diffs).mode().iloc[0])
    if step_ns % 1_000_000_000:
        raise DataError(f"{source}: the step {step_ns / 1e9}s is not a whole number of seconds; resample the trace")
    off_grid = np.flatnonzero(diffs % step_ns)
    if off_grid.size:
        i = int(off_grid[0]) + 1
        raise DataError(
            f"{source}: row {i + first_row}: timestamp {times[i]} is off the {step_ns // 10**9}s grid the "
            "other rows follow; resample the trace to one regular step"
        )
    idx = (ns - ns[0]) // step_ns
    steps = int(idx[-1]) + 1
    if steps > MAX_GRID_STEPS:
        far = int(np.flatnonzero(idx > MAX_GRID_STEPS - 1)[0])
        raise DataError(
            f"{source}: row {far + first_row}: timestamp {times[far]} is "
            f"{(times[far] - times[0]).days:,} days after the first row ({times[0]}): at the "
            f"{step_ns // 10**9}s step the trace would span {steps:,} steps, more than the "
            f"{MAX_GRID_STEPS:,} a trace may hold; check that row's year, or cut the trace into shorter files"
        )
    grid = np.full(steps, np.nan)
    grid[idx] = values
    series = Series(values=grid, start=times[0], step_seconds=step_ns // 10**9, name=name,
                    value_kind=value_kind, source=source)
    check_history(series, min_history, max_missing=max_missing)
    return series


def _trace_columns(frame: pd.DataFrame, source: str, first_row: int) -> pd.DataFrame:
    """The frame as its ``timestamp`` and ``value`` columns, in that order.

    Named columns are taken in either order, and a timestamp index (a time-indexed frame written to
    Parquet) as the timestamp column; anything else is refused, saying what it looks like.
    """
    cols = [str(c).strip().lower().lstrip("\ufeff") for c in frame.columns]
    index_name = str(frame.index.name or "").strip().lower()
    if cols == ["value"] and (index_name == "timestamp" or isinstance(frame.index, pd.DatetimeIndex)):
        frame, cols = frame.reset_index(), ["timestamp", "value"]
    elif cols == ["value", "timestamp"]:
        frame, cols = frame[frame.columns[::-1]], ["timestamp", "value"]
    if cols != ["timestamp", "value"]:
        hint = ""
        if len(cols) == 1 and any(sep in cols[0] for sep in (";", "\t", "|")):
            hint = " (the columns look separated by something other than a comma: use commas)"
        elif cols == ["value"]:
            hint = (f" (no timestamp column, and the index ({excerpt(frame.index.name)}, of type "
                    f"{frame.index.dtype}) holds no times: write the timestamps as a 'timestamp' column)")
        elif cols and _one_time(cols[0], bounded=False) is not None:
            hint = " (the first line looks like data: add a 'timestamp,value' header line)"
        raise DataError(
            f"{source}: wrong columns {excerpt(list(frame.columns))}{hint}; a trace has exactly two columns named "
            "'timestamp' and 'value'"
        )
    text = [frame.index, *(frame[c] for c in frame.columns)]
    if not isinstance(frame.index, pd.RangeIndex) and all(pd.api.types.is_string_dtype(c) for c in text):
        # pandas reads a CSV whose rows hold one field more than its header with the first as the index.
        first = ", ".join(excerpt(str(v)) for v in (frame.index[0], frame.iloc[0, 0], frame.iloc[0, 1]))
        raise DataError(
            f"{source}: row {first_row}: {first} is one field more than the 'timestamp,value' header: a timestamp "
            "holding a comma, as an RFC 2822 date such as 'Mon, 01 Jan 2024 00:00:00 +0000' does, splits in two; "
            "write ISO-8601 times (2024-01-01T00:00:00Z)"
        )
    return frame.set_axis(["timestamp", "value"], axis=1)


def days_text(delta: timedelta, other: timedelta) -> str:
    """``delta`` in days, precise enough never to print the same figure as ``other``."""
    have, need = delta.total_seconds() / 86400, other.total_seconds() / 86400
    for digits in (1, 3, 5):
        text = f"{have:.{digits}f}"
        if float(text) != need or have == need:
            return f"{text} days"
    return f"{format_duration(delta)}"


def check_history(series: Series, min_history: timedelta | None, *,
                  max_missing: float | None = DEFAULT_MAX_MISSING) -> None:
    """Refuse a series shorter than ``min_history`` or with more than ``max_missing`` of its steps
    missing; warn when the bar is set below 14 days."""
    if min_history is None:
        return
    if min_history < DEFAULT_MIN_HISTORY:
        warnings.warn(
            f"--min-history {min_history.total_seconds() / 86400:.1f} days is below the 14 days the "
            "models are designed for; weekly seasonality will be poorly estimated",
            UserWarning,
            stacklevel=3,
        )
    where = series.source or series.name
    if series.span < min_history:
        short = min_history - series.span
        steps = math.ceil(short.total_seconds() / series.step_seconds)
        raise InsufficientHistoryError(
            f"{where}: insufficient history: {days_text(series.span, min_history)} < "
            f"{min_history.total_seconds() / 86400:g} days required ({steps:,} step(s) of "
            f"{format_duration(series.step)} short); supply a longer trace or lower the bar with --min-history"
        )
    check_missing(series, max_missing)


def observed_history(series: Series, until: pd.Timestamp | datetime | None = None) -> Series:
    """The history a series holds, by the one rule every command applies: from its first observation
    to ``until`` — the moment it was read (a pull's end; None: its last observation, as for a file).

    Gaps anywhere in that span, at its end too, are gaps inside the history: they count against
    ``--max-missing``, not against ``--min-history`` — a 30-minute scrape gap just before the pull
    is not 30 minutes less history, and a metric that stopped days ago is refused by its missing
    share. Raises DataError when nothing at all was observed.
    """
    present = np.flatnonzero(np.isfinite(series.values))
    if present.size == 0:
        raise DataError(f"{series.source or series.name}: no observations between {series.start} and {series.end}")
    last = int(present[-1]) + 1 if until is None else min(len(series), max(
        int(present[-1]) + 1, math.ceil((to_utc(until) - series.start).total_seconds() / series.step_seconds)))
    return series.slice(int(present[0]), last)


def check_missing(series: Series, max_missing: float | None) -> None:
    """Refuse a series with more than ``max_missing`` of its steps missing (``--max-missing``)."""
    if max_missing is None or series.missing_fraction <= max_missing:
        return
    observed = series.step * int(np.isfinite(series.values).sum())
    raise InsufficientHistoryError(
        f"{series.source or series.name}: {series.missing_fraction:.0%} of the {len(series):,} steps are missing "
        f"(more than the {max_missing:.0%} allowed): {observed.total_seconds() / 86400:.1f} days observed in the "
        f"{series.span.total_seconds() / 86400:.1f} days the trace spans; fill the gaps (export the trace again "
        "from a source that has them), or accept more missing steps with --max-missing"
    )


def _parse_timestamps(col: pd.Series, source: str, first_row: int,
                      timezone: zoneinfo.ZoneInfo | None = None) -> pd.DatetimeIndex:
    if pd.api.types.is_datetime64_any_dtype(col):
        return _typed_timestamps(col, source, first_row, timezone)
    text = col.astype(str).str.strip()
    numeric = pd.to_numeric(text, errors="coerce")
    infinite = np.isinf(numeric.to_numpy(dtype=float))
    if infinite.any():  # "inf" reads as a number, but is no epoch time (a 400-digit number stays one)
        numeric = numeric.mask(infinite & text.str.fullmatch(r"[+-]?inf(?:inity)?", case=False).to_numpy(dtype=bool))
    if numeric.notna().all():
        return _epoch_seconds(text, numeric, source, first_row)
    if numeric.notna().any():
        i = int(np.flatnonzero(numeric.isna().to_numpy())[0])
        raise DataError(
            f"{source}: row {i + first_row}: timestamp {excerpt(text.iloc[i])} mixes with epoch-second rows; "
            "use one format for the whole file"
        )
    empty = np.flatnonzero((text == "").to_numpy())
    if empty.size:
        raise DataError(f"{source}: row {int(empty[0]) + first_row}: empty timestamp; every row needs one")
    readable = _read_iso(text)
    if readable.isna().any():  # RFC 3339 allows a lower-case t and z (2024-01-01t00:00:00z); pandas does not
        readable = _read_iso(text.str.upper())
    if readable.isna().any():
        i = int(np.flatnonzero(readable.isna().to_numpy())[0])
        raise DataError(_unreadable_message(source, i + first_row, text.iloc[i]))
    offset = (text.str.endswith("Z") | text.str.endswith("z")).to_numpy(dtype=bool)
    if not offset.all():  # the slower look for numeric offsets only when some row lacks the Z
        offset = offset | text.str.contains(_HAS_OFFSET).to_numpy(dtype=bool)
    if offset.any() and not offset.all():
        i, j = int(np.flatnonzero(~offset)[0]), int(np.flatnonzero(offset)[0])
        raise DataError(
            f"{source}: row {i + first_row}: timestamp {excerpt(text.iloc[i])} has no UTC offset, but row "
            f"{j + first_row} ({excerpt(text.iloc[j])}) has one; a file mixing the two would be read hours apart — "
            "write every timestamp with its offset (Z for UTC)"
        )
    ts = pd.DatetimeIndex(readable)
    if not offset.all():
        if timezone is None:
            raise DataError(_naive_message(source, first_row, text.iloc[0], "the timestamps have no UTC offset"))
        return _localize(ts, timezone, source, first_row)
    return _in_range(ts, source, first_row)


def _read_iso(text: pd.Series) -> pd.Series:
    """ISO-8601 times as UTC timestamps (NaT where a row is not one)."""
    try:
        return pd.to_datetime(text, errors="coerce", utc=True, format="ISO8601")
    except (OverflowError, ValueError, pd.errors.OutOfBoundsDatetime):
        return pd.Series([_one_time(t) for t in text], index=text.index)


# An ISO-8601 date, its year of any length (the group), then a time or nothing.
_ISO_DATE = re.compile(r"^[+-]?(\d{4,})-\d{2}-\d{2}(?:[Tt ]|$)")


def _unreadable_message(source: str, row: int, text: str) -> str:
    """Why a timestamp cannot be read: a year out of range, another format (named), or not a time at all."""
    fix = "write ISO-8601 (2024-01-31T12:00:00Z) or epoch seconds"
    iso = _ISO_DATE.match(text)
    if iso is not None:
        year = iso.group(1)
        if len(year) > 4 or not _FIRST_TIME.year <= int(year) <= _LAST_TIME.year:
            return _range_message(source, row, text)
    else:
        import email.utils

        if email.utils.parsedate_tz(text) is not None:
            return (f"{source}: row {row}: timestamp {excerpt(text)} is an RFC 2822 date (as e-mail and HTTP headers "
                    f"write them), not ISO-8601; {fix}")
        if _one_time(text, bounded=False) is not None:
            return (f"{source}: row {row}: timestamp {excerpt(text)} is a date, but not ISO-8601 (a date such as "
                    f"01/02/2024 is 1 February in some countries and 2 January in others); {fix}")
    return f"{source}: row {row}: cannot read timestamp {excerpt(text)}; {fix}"


def _typed_timestamps(col: pd.Series, source: str, first_row: int,
                      timezone: zoneinfo.ZoneInfo | None) -> pd.DatetimeIndex:
    """A column the reader already typed as datetimes (Parquet): no empty one, and a time zone."""
    ts = pd.DatetimeIndex(col)
    if ts.isna().any():
        i = int(np.flatnonzero(ts.isna())[0])
        raise DataError(f"{source}: row {i + first_row}: empty timestamp; every row needs one")
    if ts.tz is None:
        if timezone is None:
            raise DataError(_naive_message(source, first_row, str(ts[0]), "the timestamp column has no time zone"))
        return _localize(ts, timezone, source, first_row)
    return _in_range(ts.tz_convert("UTC"), source, first_row)


#: Epoch times by their size: a time in the years 1678–2261 is below 1e11 in seconds (year 5138),
#: below 1e14 in milliseconds and below 1e17 in microseconds (a time in 2024 is 1.7e9, 1.7e12, 1.7e15
#: and 1.7e18 in each), so the unit of a value too big for seconds shows in its magnitude.
_EPOCH_UNITS = ((1e14, "milliseconds", 10**3), (1e17, "microseconds", 10**6), (1e20, "nanoseconds", 10**9))


def _epoch_seconds(text: pd.Series, numeric: pd.Series, source: str, first_row: int) -> pd.DatetimeIndex:
    """Timestamps that are all numbers: epoch seconds (another unit is refused by name, not guessed)."""
    big = np.flatnonzero(np.abs(numeric.to_numpy(dtype=float)) > _EPOCH_MS_THRESHOLD)
    if big.size:
        i = int(big[0])
        size, shown = abs(float(numeric.iloc[i])), text.iloc[i]
        unit, factor = next(((unit, factor) for limit, unit, factor in _EPOCH_UNITS if size < limit), ("", 0))
        if not unit:  # too big for a time in any unit
            raise DataError(_range_message(source, i + first_row, shown))
        raise DataError(
            f"{source}: row {i + first_row}: timestamp {shown if len(shown) <= 40 else excerpt(shown)} looks like "
            f"epoch {unit} (by its size); write epoch seconds (divide by {factor}) or ISO-8601 times"
        )
    seconds = numeric.to_numpy(dtype=float)
    out = np.flatnonzero((seconds < _FIRST_TIME.timestamp()) | (seconds > _LAST_TIME.timestamp()))
    if out.size:
        i = int(out[0])
        raise DataError(_range_message(source, i + first_row, text.iloc[i]))
    return pd.DatetimeIndex(pd.to_datetime(seconds, unit="s", utc=True))


def _one_time(text: str, *, bounded: bool = True) -> pd.Timestamp | None:
    """One ISO-8601 time, or None when it cannot be read (or, ``bounded``, is outside 1678–2261)."""
    try:
        ts = pd.Timestamp(text)
    except (ValueError, OverflowError, pd.errors.OutOfBoundsDatetime):
        try:
            datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            return None
        return None if bounded else pd.Timestamp("2000-01-01")  # readable, but out of range
    if pd.isna(ts):
        return None
    if bounded and not (_FIRST_TIME <= to_utc(ts) <= _LAST_TIME):
        return None
    return ts


def _range_message(source: str, row: int, text: str) -> str:
    return (f"{source}: row {row}: timestamp {excerpt(text)} is outside the years 1678–2261 this tool can hold; "
            "check that row's year (a typo?) or its unit (epoch seconds)")


def _in_range(ts: pd.DatetimeIndex, source: str, first_row: int) -> pd.DatetimeIndex:
    seconds = ts.as_unit("s").asi8 if ts.unit != "s" else ts.asi8
    out = np.flatnonzero((seconds < _FIRST_TIME.timestamp()) | (seconds > _LAST_TIME.timestamp()))
    if out.size:
        i = int(out[0])
        raise DataError(_range_message(source, i + first_row, str(ts[i])))
    return ts.as_unit("ns")


def _naive_message(source: str, first_row: int, example: str, what: str) -> str:
    return (f"{source}: row {first_row}: {what} ({excerpt(example)}), so the time zone they were written in is "
            "unknown; say which with --timezone (e.g. --timezone UTC or --timezone Europe/Berlin), or write "
            "every timestamp with its offset (…Z for UTC)")


def _localize(ts: pd.DatetimeIndex, zone: zoneinfo.ZoneInfo, source: str, first_row: int) -> pd.DatetimeIndex:
    """Naive wall-clock times in ``zone`` → UTC; a time that does not exist or is ambiguous is refused."""
    # Naive wall-clock times (read as if UTC when parsed from text): range-check, then drop the zone.
    ts = _in_range(ts if ts.tz is not None else ts.tz_localize("UTC"), source, first_row).tz_localize(None)
    gone = ts.tz_localize(zone, ambiguous="NaT", nonexistent="NaT")
    missing = np.flatnonzero(gone.isna())
    if not missing.size:
        return gone.tz_convert("UTC")
    try:  # clocks went back: an ordered file tells which of the repeated hour each row is
        return ts.tz_localize(zone, ambiguous="infer", nonexistent="raise").tz_convert("UTC")
    except (ValueError, TypeError):
        pass  # pytz/dateutil AmbiguousTimeError and NonExistentTimeError are ValueErrors
    i = int(missing[0])
    skipped = ts.tz_localize(zone, ambiguous=np.zeros(len(ts), dtype=bool), nonexistent="NaT").isna()
    why = ("does not exist (the clocks jumped forward)" if skipped[i] else
           "happens twice (the clocks went back) and the order of the rows does not tell which")
    raise DataError(
        f"{source}: row {i + first_row}: local time {ts[i]} {why} in {zone.key}; write the timestamps with "
        "their UTC offsets, or in UTC"
    )


_MISSING_TOKENS = {"", "nan", "NaN", "NAN", "null", "NULL", "None", "NA", "N/A"}


def _not_numbers(col: pd.Series) -> str | None:
    """What a typed value column holds when it is not numbers (booleans would read as 0/1 demand)."""
    kinds = ((pd.api.types.is_bool_dtype, "true/false values, which would read as 0/1 demand"),
             (pd.api.types.is_datetime64_any_dtype, "times"), (pd.api.types.is_timedelta64_dtype, "durations"),
             (lambda c: isinstance(c.dtype, pd.CategoricalDtype), "categories"),
             (pd.api.types.is_complex_dtype, "complex numbers"))
    return next((what for test, what in kinds if test(col)), None)


def _parse_values(col: pd.Series, source: str, first_row: int, kind: ValueKind, *, typed: bool = False) -> np.ndarray:
    """The value column as floats (NaN = missing); ``typed``: the file's reader typed it (Parquet)."""
    what = _not_numbers(col)
    if what is not None:
        raise DataError(f"{source}: the value column is of type {col.dtype} ({what}), not numbers; write the "
                        "demand as a float or integer column")
    if pd.api.types.is_numeric_dtype(col):
        vals = col.to_numpy(dtype=float, na_value=np.nan)
    else:
        text = col.astype(str).str.strip()
        missing = text.isin(_MISSING_TOKENS).to_numpy()
        vals = pd.to_numeric(text.where(~missing, "nan"), errors="coerce").to_numpy(dtype=float)
        bad = np.flatnonzero(np.isnan(vals) & ~missing)
        if bad.size:
            i = int(bad[0])
            held = f" (the value column holds {col.dtype} values, not numbers)" if typed else ""
            raise DataError(
                f"{source}: row {i + first_row}: value {excerpt(text.iloc[i])} is not a number{held}; write a "
                "number, or NaN for a missing observation"
            )
    inf = np.flatnonzero(np.isinf(vals))
    if inf.size:
        i = int(inf[0])
        given = "" if pd.api.types.is_numeric_dtype(col) else f" {excerpt(str(col.iloc[i]).strip())}"
        raise DataError(f"{source}: row {i + first_row}: value{given} is infinite (or too large for a number); write "
                        "a finite number or NaN")
    neg = np.flatnonzero(vals < 0)
    if neg.size:
        i = int(neg[0])
        noun = "count" if kind is ValueKind.COUNT else "rate"
        raise DataError(
            f"{source}: row {i + first_row}: negative {noun} {vals[i]:g}; demand cannot be negative — "
            "if this is a counter, convert it to a rate (handle counter resets) first"
        )
    return vals



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
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from predictive_scaler.errors import DataError, InsufficientHistoryError

#: History the models need by default: two full weeks, so the weekly cycle is seen twice.
DEFAULT_MIN_HISTORY = timedelta(days=14)

# Epoch seconds of year 5138 — anything larger is almost surely milliseconds.
_EPOCH_MS_THRESHOLD = 1e11


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
        if not math.isfinite(text):
            raise DataError(f"duration must be finite, got {text!r}")
        return timedelta(seconds=float(text))
    s = str(text).strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    try:
        if s and s[-1] in units:
            return timedelta(seconds=float(s[:-1]) * units[s[-1]])
        return timedelta(seconds=float(s))
    except ValueError:
        raise DataError(
            f"cannot read duration {text!r}: write a number with a unit, e.g. 30s, 10m, 2h, 14d"
        ) from None


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
) -> Series:
    """Read a ``timestamp,value`` CSV or Parquet trace onto its own regular grid.

    ``min_history`` below 14 days is allowed but warned about; ``None`` disables the check.
    """
    p = Path(path)
    kind = ValueKind(value_kind)
    if not p.exists():
        raise DataError(f"{p}: no such file; give the path of a timestamp,value CSV or Parquet trace")
    if p.suffix.lower() in (".parquet", ".pq"):
        try:
            frame = pd.read_parquet(p)
        except Exception as exc:  # pyarrow raises many types
            raise DataError(f"{p}: not a readable Parquet file ({exc}); export it again as timestamp,value") from exc
        header_rows = 0
    else:
        try:
            frame = pd.read_csv(p, dtype=str, keep_default_na=False, skipinitialspace=True)
        except pd.errors.EmptyDataError as exc:
            raise DataError(f"{p}: the file is empty; a trace needs a 'timestamp,value' header and rows") from exc
        except (pd.errors.ParserError, UnicodeDecodeError) as exc:
            raise DataError(f"{p}: not a readable CSV file ({exc}); write one 'timestamp,value' pair per line") from exc
        header_rows = 1
    return series_from_frame(frame, source=str(p), value_kind=kind, min_history=min_history,
                             name=name or p.stem, first_row=header_rows + 1)


def series_from_frame(
    frame: pd.DataFrame,
    *,
    source: str,
    value_kind: ValueKind = ValueKind.RATE,
    min_history: timedelta | None = DEFAULT_MIN_HISTORY,
    name: str = "series",
    first_row: int = 1,
) -> Series:
    cols = [str(c).strip().lower() for c in frame.columns]
    if cols != ["timestamp", "value"]:
        raise DataError(
            f"{source}: wrong columns {list(frame.columns)}; a trace has exactly two columns named "
            "'timestamp' and 'value'"
        )
    frame.columns = ["timestamp", "value"]
    if len(frame) == 0:
        raise DataError(f"{source}: the file has a header but no rows; add timestamp,value rows")

    times = _parse_timestamps(frame["timestamp"], source, first_row)
    values = _parse_values(frame["value"], source, first_row, value_kind)

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
    grid = np.full(int(idx[-1]) + 1, np.nan)
    grid[idx] = values
    series = Series(values=grid, start=times[0], step_seconds=step_ns // 10**9, name=name,
                    value_kind=value_kind, source=source)
    check_history(series, min_history)
    return series


def check_history(series: Series, min_history: timedelta | None) -> None:
    """Refuse a series shorter than ``min_history``; warn when the bar is set below 14 days."""
    if min_history is None:
        return
    if min_history < DEFAULT_MIN_HISTORY:
        warnings.warn(
            f"--min-history {min_history.total_seconds() / 86400:.1f} days is below the 14 days the "
            "models are designed for; weekly seasonality will be poorly estimated",
            UserWarning,
            stacklevel=3,
        )
    if series.span < min_history:
        have = series.span.total_seconds() / 86400
        need = min_history.total_seconds() / 86400
        raise InsufficientHistoryError(
            f"{series.source or series.name}: insufficient history: {have:.1f} days < {need:g} days "
            "required; supply a longer trace or lower the bar with --min-history"
        )


def _parse_timestamps(col: pd.Series, source: str, first_row: int) -> pd.DatetimeIndex:
    if pd.api.types.is_datetime64_any_dtype(col):
        ts = pd.DatetimeIndex(col)
        if ts.isna().any():
            i = int(np.flatnonzero(ts.isna())[0])
            raise DataError(f"{source}: row {i + first_row}: empty timestamp; every row needs one")
        return ts.tz_localize("UTC") if ts.tz is None else ts.tz_convert("UTC")
    text = col.astype(str).str.strip()
    numeric = pd.to_numeric(text, errors="coerce")
    if numeric.notna().all():
        big = np.flatnonzero(numeric.to_numpy() > _EPOCH_MS_THRESHOLD)
        if big.size:
            i = int(big[0])
            raise DataError(
                f"{source}: row {i + first_row}: timestamp {text.iloc[i]} looks like epoch milliseconds; "
                "write epoch seconds (divide by 1000) or ISO-8601 times"
            )
        return pd.DatetimeIndex(pd.to_datetime(numeric.to_numpy(dtype=float), unit="s", utc=True))
    if numeric.notna().any():
        i = int(np.flatnonzero(numeric.isna().to_numpy())[0])
        raise DataError(
            f"{source}: row {i + first_row}: timestamp {text.iloc[i]!r} mixes with epoch-second rows; "
            "use one format for the whole file"
        )
    parsed = pd.to_datetime(text, errors="coerce", utc=True, format="ISO8601")
    if parsed.isna().any():
        i = int(np.flatnonzero(parsed.isna().to_numpy())[0])
        raise DataError(
            f"{source}: row {i + first_row}: cannot read timestamp {text.iloc[i]!r}; write ISO-8601 "
            "(2024-01-31T12:00:00Z) or epoch seconds"
        )
    return pd.DatetimeIndex(parsed)


_MISSING_TOKENS = {"", "nan", "NaN", "NAN", "null", "NULL", "None", "NA", "N/A"}


def _parse_values(col: pd.Series, source: str, first_row: int, kind: ValueKind) -> np.ndarray:
    if pd.api.types.is_numeric_dtype(col):
        vals = col.to_numpy(dtype=float)
    else:
        text = col.astype(str).str.strip()
        missing = text.isin(_MISSING_TOKENS).to_numpy()
        vals = pd.to_numeric(text.where(~missing, "nan"), errors="coerce").to_numpy(dtype=float)
        bad = np.flatnonzero(np.isnan(vals) & ~missing)
        if bad.size:
            i = int(bad[0])
            raise DataError(
                f"{source}: row {i + first_row}: value {text.iloc[i]!r} is not a number; write a number, "
                "or NaN for a missing observation"
            )
    inf = np.flatnonzero(np.isinf(vals))
    if inf.size:
        i = int(inf[0])
        raise DataError(f"{source}: row {i + first_row}: value is infinite; write a finite number or NaN")
    neg = np.flatnonzero(vals < 0)
    if neg.size:
        i = int(neg[0])
        noun = "count" if kind is ValueKind.COUNT else "rate"
        raise DataError(
            f"{source}: row {i + first_row}: negative {noun} {vals[i]:g}; demand cannot be negative — "
            "if this is a counter, convert it to a rate (handle counter resets) first"
        )
    return vals



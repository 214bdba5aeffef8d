"""History pulls from Prometheus onto the package's regular grid, and the controller's metrics port.

Grid convention. A Prometheus value at evaluation time ``t`` describes the
past: ``rate(x[5m])`` at ``t`` is the mean rate over ``(t - 5m, t]`` and a gauge
at ``t`` is its latest sample. A :class:`~predictive_scaler.series.Series`
value describes the step that *starts* at its timestamp. So ``values[i]`` of
a pulled series is the query evaluated at ``start + (i + 1)·step``: the last
element of a pull ending at ``now`` is the step that ended at (or just
before) ``now``, which is complete and already observed. For a rate query, give
the range the same length as the step (``[5m]`` at a 5-minute step), or the
pulled value is the mean over a different window than the step it stands for.
Demand is therefore pulled every minute and averaged per step, whatever the
query's range (``average_from``; see ``sources/demand.py``).

Gaps stay NaN. History length follows the one rule of
:func:`~predictive_scaler.series.observed_history`: from the first present value to
the moment of reading, so a series that began 9 days into a 21-day window is
refused as 9 days of history, not accepted as 21 (leading NaN is trimmed), while a
gap anywhere after it — a scrape outage just before the pull, a metric that
stopped — counts against the missing share. A NaN sample Prometheus answered (its
0/0) is a gap too, never 0; when NaN answers are why a history is refused, the
query is at fault and the refusal is a failing source (``NaNAnswerError``) that
names how many samples were NaN. An impossible value (negative, ±Inf, absurdly large) is refused by the
source (:class:`~predictive_scaler.sources.prometheus.ImpossibleValueError`).

Incremental recent windows. :meth:`PrometheusMetrics.recent` keeps the window it
pulled last (one float per model step: 2,016 for 7 days of 5-minute steps) and,
while the query, window and step are the same and the clock moved forward by
less than the window, pulls only the steps since the last pull plus
:data:`LATE_SAMPLE_STEPS` before it (late samples and the step that was still
being scraped are re-read). Each model step is the mean of the one-minute
evaluations inside it and nothing else, so the spliced window equals a full
pull step for step (tested against a real Prometheus); it is pulled in full
again when nothing is kept, the spec changed (a new port), the clock went back
or jumped by a window or more.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd

from predictive_scaler.core.values import DemandSample
from predictive_scaler.errors import DataError, SourceError
from predictive_scaler.series import (
    DEFAULT_MIN_HISTORY,
    Series,
    ValueKind,
    check_history,
    observed_history,
)
from predictive_scaler.sources.prometheus import (
    Combine,
    DuplicateSeriesError,
    NaNAnswerError,
    PrometheusSource,
    RangeSeries,
    iso_utc,
)

#: Demand is evaluated this often and averaged into model steps (``pull_history(…, average_from=…)``).
PULL_STEP_SECONDS = 60

#: An incremental recent pull re-reads this many model steps before the last one it kept.
LATE_SAMPLE_STEPS = 2


def pull_history(
    source: PrometheusSource,
    query: str,
    start: datetime,
    end: datetime,
    step: timedelta | int,
    *,
    min_history: timedelta | None = DEFAULT_MIN_HISTORY,
    max_missing_fraction: float | None = None,
    combine: Combine = "error",
    name: str = "demand",
    allow_partial: bool = False,
    average_from: int | None = None,
) -> Series:
    """Pull ``query`` over [start, end] as a Series of ``step`` steps (gaps NaN).

    The grid is aligned on multiples of ``step`` from the epoch (steps that lie
    wholly inside [start, end]). Several series → :class:`DuplicateSeriesError`
    unless ``combine="sum"`` (summed where any is present, as PromQL's ``sum``
    would). With ``min_history`` set, leading NaN (before the metric existed)
    is trimmed and :class:`InsufficientHistoryError` is raised when the span
    from the first to the last present value is shorter than ``min_history``, DataError when nothing came back at all;
    with None the whole grid is returned, NaN or not. DataError when more than
    ``max_missing_fraction`` of the observed span is NaN. A failing Prometheus
    raises SourceError (retried first); ``warnings`` raise PartialDataError
    unless ``allow_partial``.

    With ``average_from`` (seconds, e.g. :data:`PULL_STEP_SECONDS`), the query is
    evaluated at that finer step and each ``step`` is the mean of the present
    values inside it: a short-range query (``rate(…[2m])`` at a 5-minute step)
    then stands for the whole step, not its last two minutes. Demand is pulled
    this way for training and for serving (``sources/demand.py``); the checks
    apply to the averaged steps. Ignored unless ``step`` is a larger multiple.

    A negative, infinite or absurd value raises
    :class:`~predictive_scaler.sources.prometheus.ImpossibleValueError` (a DataError and a
    SourceError); NaN samples are gaps, counted in the missing-data messages.
    """
    step_s = _step(step)
    if average_from and step_s > average_from and step_s % average_from == 0:
        t0 = math.ceil(_epoch(start) / step_s) * step_s
        t1 = math.floor(_epoch(end) / step_s) * step_s
        if t1 <= t0:
            raise DataError(f"history window {start} → {end} holds no whole {step_s}s step; widen it")
        fine, nans = _pull_grid(source, query, _dt(t0), _dt(t1), average_from, combine=combine, name=name,
                                allow_partial=allow_partial)
        return _check_pulled(fine.resample(step_s), query, min_history, max_missing_fraction, nans)
    series, nans = _pull_grid(source, query, start, end, step_s, combine=combine, name=name,
                              allow_partial=allow_partial)
    return _check_pulled(series, query, min_history, max_missing_fraction, nans)


def _pull_grid(source: PrometheusSource, query: str, start: datetime, end: datetime, step_s: int, *,
               combine: Combine, name: str, allow_partial: bool) -> tuple[Series, str]:
    """``query`` over [start, end] on the ``step_s`` grid (gaps NaN), and what its NaN samples were
    ("" when none)."""
    t0 = math.ceil(_epoch(start) / step_s) * step_s
    last_eval = math.floor(_epoch(end) / step_s) * step_s
    n = (last_eval - t0) // step_s  # steps [t0 + i·step, t0 + (i+1)·step), evaluated at their end
    if n < 1:
        raise DataError(f"history window {start} → {end} holds no whole {step_s}s step; widen it")
    first_eval = t0 + step_s
    found = source.range(query, _dt(first_eval), _dt(last_eval), step_s, allow_partial=allow_partial)
    if len(found) > 1 and combine != "sum":
        labels = source.hide_secrets("; ".join(str(dict(s.labels)) for s in found[:4]))
        raise DuplicateSeriesError(
            f"history query {query!r} returned {len(found)} series ({labels}); aggregate them in the "
            "query with sum(…) or sum by (…), or ask for their sum")
    grid = np.full(n, np.nan)
    if found:
        stacked = np.full((len(found), n), np.nan)
        for row, found_series in enumerate(found):
            idx = np.rint((found_series.timestamps - first_eval) / step_s).astype(np.int64)
            ok = (idx >= 0) & (idx < n)
            stacked[row, idx[ok]] = found_series.values[ok]
        stacked[~np.isfinite(stacked)] = np.nan
        present = np.isfinite(stacked).any(axis=0)
        grid = np.where(present, np.nansum(np.where(np.isfinite(stacked), stacked, 0.0), axis=0), np.nan)
    series = Series(values=grid, start=pd.Timestamp(t0, unit="s", tz="UTC"), step_seconds=step_s,
                    name=name, value_kind=ValueKind.RATE, source=f"prometheus:{query}")
    return series, _nan_note(found)


def _nan_note(found: list[RangeSeries]) -> str:
    """How many of the samples Prometheus answered were NaN, and the first one's time ("" when none)."""
    total = sum(len(s.values) for s in found)
    nan_times = [s.timestamps[np.isnan(s.values)] for s in found]
    count = sum(len(t) for t in nan_times)
    if not count:
        return ""
    first = min(float(t[0]) for t in nan_times if len(t))
    return (f"{count} of its {total} samples were NaN, the first at {iso_utc(first)} — Prometheus's answer "
            "for 0/0 (e.g. a ratio over no requests); NaN counts as missing, never as 0")


def _check_pulled(series: Series, query: str, min_history: timedelta | None,
                  max_missing_fraction: float | None, nans: str = "") -> Series:
    present = np.flatnonzero(np.isfinite(series.values))
    if present.size == 0:
        if min_history is None:
            return series
        if nans:
            raise NaNAnswerError(f"history query {query!r} returned no usable data between {series.start} and "
                                 f"{series.end}: {nans}; guard the divisor in the query (e.g. … / (x > 0)) or "
                                 "check its scrape target in the Prometheus UI")
        raise DataError(f"history query {query!r} returned no data between {series.start} and "
                        f"{series.end}; check the metric name and labels in the Prometheus UI")
    # The one rule (observed_history): from the first observation to the moment of reading; gaps
    # anywhere in it, at its end too, count against the missing share, not against its length.
    observed = observed_history(series, series.end)
    try:
        check_history(observed, min_history)
        if max_missing_fraction is not None and observed.missing_fraction > max_missing_fraction:
            raise DataError(
                f"history query {query!r}: {observed.missing_fraction:.0%} of the steps since "
                f"{observed.start} are missing (> {max_missing_fraction:.0%} allowed); fix the scrape gaps or "
                "allow more missing data")
    except DataError as exc:  # too short or too gappy: when NaN answers made it so, the query is at fault
        if not nans:
            raise
        raise NaNAnswerError(f"{exc}; {nans}; guard the divisor in the query (e.g. … / (x > 0))") from exc
    return observed if min_history is not None else series


class PrometheusMetrics:
    """The reconciler's metrics port over Prometheus (``demand_now`` / ``recent``).

    ``demand_query`` yields demand as one number (e.g. ``sum(rate(requests_total{…}[5m]))``
    or DCGM busy GPUs); ``freshness_query`` (e.g. ``min(timestamp(requests_total{…}))``)
    lets stale data count as missing after ``max_age``; ``history_query``
    (default: ``demand_query``) is what :meth:`recent` pulls, every minute and
    averaged into model steps (``average_from``), as the model was trained on.
    """

    def __init__(
        self,
        source: PrometheusSource,
        demand_query: str,
        *,
        max_age: timedelta = timedelta(minutes=2),
        freshness_query: str | None = None,
        history_query: str | None = None,
        combine: Combine = "error",
        name: str = "demand",
    ) -> None:
        if not demand_query.strip():
            raise SourceError("the demand query is empty; give a PromQL query, e.g. "
                              "sum(rate(http_requests_total{namespace=\"ml\"}[5m]))")
        self.source = source
        self.demand_query = demand_query
        self.max_age = max_age
        self.freshness_query = freshness_query
        self.history_query = history_query or demand_query
        self.combine: Combine = combine
        self.name = name
        #: The last recent window pulled: (window s, step s, end epoch, series); None: pull in full.
        self._kept: tuple[int, int, int, Series] | None = None
        #: Recent pulls made in full and incrementally (for tests and the benchmark).
        self.full_pulls = 0
        self.incremental_pulls = 0

    def demand_now(self, now: datetime) -> DemandSample:
        """Current demand; missing (NaN, with a reason) rather than 0; SourceError when Prometheus fails."""
        return self.source.scalar_now(self.demand_query, now, self.max_age,
                                      freshness_query=self.freshness_query, combine=self.combine)

    def recent(self, now: datetime, window: timedelta, step_seconds: int) -> Series:
        """The last ``window / step_seconds`` completed steps before ``now`` (gaps NaN, no length check)."""
        if window <= timedelta(0):
            raise SourceError(f"recent window must be positive, got {window}")
        step = _step(step_seconds)
        # End on the last step boundary so the window holds window/step steps whatever now's phase.
        end_s = math.floor(_epoch(now) / step) * step
        window_s = _step(window)
        kept = self._kept
        tail_from = None if kept is None else kept[2] - LATE_SAMPLE_STEPS * step
        if (kept is None or tail_from is None or kept[:2] != (window_s, step) or kept[2] > end_s
                or tail_from <= end_s - window_s):
            series = self._pull(_dt(end_s) - window, _dt(end_s), step)
            self.full_pulls += 1
        else:
            series = _splice(kept[3], self._pull(_dt(tail_from), _dt(end_s), step), _dt(end_s) - window)
            self.incremental_pulls += 1
        self._kept = (window_s, step, end_s, series)
        return series

    def _pull(self, start: datetime, end: datetime, step: int) -> Series:
        return pull_history(self.source, self.history_query, start, end, step, min_history=None,
                            combine=self.combine, name=self.name, average_from=PULL_STEP_SECONDS)


def _splice(kept: Series, tail: Series, start: datetime) -> Series:
    """The window from ``start`` to ``tail``'s end: ``kept``'s steps before ``tail``, then ``tail``.

    Both lie on the same epoch-aligned grid; steps of ``kept`` that ``tail`` covers again are
    replaced (they may have had late samples).
    """
    step = tail.step_seconds
    first = math.ceil(_epoch(start) / step) * step
    keep_from = (first - int(kept.start.timestamp())) // step
    keep_to = (int(tail.start.timestamp()) - int(kept.start.timestamp())) // step
    head = kept.values[max(0, keep_from):max(0, keep_to)]
    # Steps between ``start`` and the kept series' start (none on a kept window of the same length).
    missing = (int(tail.start.timestamp()) - first) // step - len(head)
    values = np.concatenate([np.full(missing, np.nan), head, tail.values])
    return dataclasses.replace(tail, values=values, start=pd.Timestamp(first, unit="s", tz="UTC"))


def _step(step: timedelta | int) -> int:
    secs = step.total_seconds() if isinstance(step, timedelta) else float(step)
    if not (secs >= 1 and secs == int(secs)):
        raise DataError(f"history step {step!r} must be a whole number of seconds ≥ 1, e.g. 300")
    return int(secs)


def _epoch(when: datetime) -> float:
    if when.tzinfo is None:
        raise DataError(f"time {when!r} has no timezone; pass timezone-aware UTC times")
    return when.timestamp()


def _dt(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)

"""Write traces as OpenMetrics text for ``promtool tsdb create-blocks-from openmetrics``.

A trace is a rate on a (possibly coarse) grid; Prometheus holds what exporters
expose: per-pod request *counters* (which reset when a container restarts) and
per-pod gauges, sampled every 15–60 s. This module turns the former into the
latter, so that tests, demos and `backtest --prometheus` rehearsals query
history through exactly the PromQL a user would write
(``sum(rate(requests_total{…}[5m]))``).

Facts this relies on (measured against promtool and Prometheus):

- timestamps are in seconds and must increase within a series, or promtool
  silently drops the sample; the file must end with ``# EOF``;
- instant queries look back 5 minutes, so a 10- or 30-minute trace is written
  at a 15–60 s sample step, holding each value (gauges) or spreading its rate
  evenly (counters);
- missing trace values (NaN) become missing samples — a scrape gap — never zeros.

Run promtool with ``--max-block-duration=24h`` (about 8× faster on 14 days).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TextIO

import numpy as np

from predictive_scaler.errors import ConfigError, DataError
from predictive_scaler.series import Series

#: Sample step used when none is given: one scrape a minute keeps 14 days at ~20k points a series.
DEFAULT_SAMPLE_STEP_SECONDS = 60

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(frozen=True)
class CounterFamily:
    """A request counter per pod, integrated from a rate trace.

    ``series`` holds a rate in units per ``rate_unit_seconds`` (60 for a
    requests-per-minute trace, 1 for requests per second). The rate is split
    evenly across ``pods`` pods; pod ``i`` restarts (its counter drops to 0)
    every ``reset_every``, staggered so the pods never restart together.
    The counter's sample name is ``name`` (which must end in ``_total``).
    """

    name: str
    series: Series
    pods: Sequence[str]
    labels: Mapping[str, str] = field(default_factory=dict)
    rate_unit_seconds: float = 1.0
    reset_every: timedelta | None = timedelta(days=3)
    help: str = "Requests served."

    def __post_init__(self) -> None:
        if not self.name.endswith("_total"):
            raise ConfigError(
                f"counter {self.name!r}: OpenMetrics counter samples end in _total; name it "
                f"{self.name}_total",
                field="name",
            )
        _check_names(self.name, self.labels, self.pods)
        if not (self.rate_unit_seconds > 0 and math.isfinite(self.rate_unit_seconds)):
            raise ConfigError(f"counter {self.name!r}: rate_unit_seconds must be positive, got "
                              f"{self.rate_unit_seconds!r}", field="rate_unit_seconds")
        if self.reset_every is not None and self.reset_every <= timedelta(0):
            raise ConfigError(f"counter {self.name!r}: reset_every must be positive or None",
                              field="reset_every")


@dataclass(frozen=True)
class GaugeFamily:
    """One gauge per entry of ``per_series``: ``{label: value}`` extra labels → its Series.

    The reading at sample time t is the trace value of the step containing
    t - Δ (the interval the reading describes), so a coarse trace is held for
    its whole step. To model an exporter that stops, cut the series short.
    """

    name: str
    per_series: Sequence[tuple[Mapping[str, str], Series]]
    labels: Mapping[str, str] = field(default_factory=dict)
    help: str = "Gauge."
    #: Overrides the file's sample step (e.g. 240 s for a constant gauge: fewer samples, same answers).
    sample_step: int | None = None

    def __post_init__(self) -> None:
        if self.sample_step is not None:
            _check_sample_step(self.sample_step)
        _check_names(self.name, self.labels, ())
        for extra, _ in self.per_series:
            _check_names(self.name, extra, ())


def _check_names(metric: str, labels: Mapping[str, str], pods: Iterable[str]) -> None:
    if not _METRIC_NAME.match(metric):
        raise ConfigError(f"metric name {metric!r} is not valid in Prometheus; use letters, digits, _ and :",
                          field="name")
    for key in labels:
        if not _LABEL_NAME.match(key) or key.startswith("__"):
            raise ConfigError(f"label name {key!r} on {metric} is not valid; use letters, digits and _",
                              field="labels")
    if list(pods) == [] and "pod" in labels:
        return
    for pod in pods:
        if not pod:
            raise ConfigError(f"{metric}: pod names must not be empty", field="pods")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _label_text(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


def _sample_times(series: Series, sample_step: int, *, subsample: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Sample timestamps (s) over the series' span, and the index of the trace step each falls in.

    ``subsample``: a sample step coarser than the trace's is allowed (a gauge scraped less
    often reads the value of the moment); counters need a divisor to integrate exactly.
    """
    if series.step_seconds % sample_step and not (subsample and sample_step % series.step_seconds == 0):
        raise ConfigError(
            f"sample step {sample_step}s does not divide the trace step {series.step_seconds}s; pick a "
            "divisor (e.g. 15, 30 or 60 s), or resample the trace to a coarser step first",
            field="sample_step")
    start = int(series.start.timestamp())
    end = int(series.end.timestamp())
    # Samples at whole multiples of the step, so queries on a round grid line up with them.
    first = -(-start // sample_step) * sample_step
    times = np.arange(first, end + 1, sample_step, dtype=np.int64)
    idx = (times - start) // series.step_seconds
    return times, np.minimum(idx, len(series) - 1)


def counter_samples(family: CounterFamily, pod_index: int, sample_step: int) -> tuple[np.ndarray, np.ndarray]:
    """Timestamps and counter values of one pod.

    The increment from one sample to the next is the pod's share of the rate
    of the trace step that interval lies in, so ``rate()`` over any window
    reproduces the trace's mean rate in that window. A missing trace step is a
    scrape gap: no samples, and the counter does not advance over it (the first
    window after a gap reads low, as it would in a real outage). A restart
    happens half-way through a scrape interval: the counter drops to the
    requests counted since, and ``rate()`` loses the other half of that one interval.
    """
    series = family.series
    times, _ = _sample_times(series, sample_step)
    start = int(series.start.timestamp())
    per_second = series.values / family.rate_unit_seconds / len(family.pods)
    # Interval (t - Δ, t] lies in the trace step containing t - Δ.
    covering = np.clip((times - sample_step - start) // series.step_seconds, 0, len(series) - 1)
    rate = per_second[covering]
    present = np.isfinite(rate)
    present[0] = bool(np.isfinite(per_second[0]))
    inc = np.where(np.isfinite(rate), rate, 0.0) * sample_step
    inc[0] = 0.0
    counter = np.cumsum(inc)
    if family.reset_every is not None:
        period = int(family.reset_every.total_seconds())
        # Stagger restarts: pod i restarts at phase (i + 1/2)/N of the period.
        phase = (2 * pod_index + 1) * period // (2 * len(family.pods))
        epoch = (times - start - phase) // period
        base = np.zeros_like(counter)
        for c in np.flatnonzero(np.diff(epoch)) + 1:
            base[c:] = counter[c - 1] + 0.5 * inc[c]
        counter = counter - base
    return times[present], counter[present]


def write_openmetrics(
    path: str | Path,
    *,
    counters: Sequence[CounterFamily] = (),
    gauges: Sequence[GaugeFamily] = (),
    sample_step: int = DEFAULT_SAMPLE_STEP_SECONDS,
) -> int:
    """Write the families to ``path`` as one OpenMetrics file; returns the number of samples."""
    _check_sample_step(sample_step)
    if not counters and not gauges:
        raise ConfigError("nothing to write: give at least one counter or gauge family")
    names = [c.name[: -len("_total")] for c in counters] + [g.name for g in gauges]
    if len(set(names)) != len(names):
        raise ConfigError(f"metric families must be unique, got {names}; merge them into one family")
    total = 0
    with open(path, "w", encoding="utf-8") as out:
        for fam in counters:
            total += _write_counter(out, fam, sample_step)
        for gauge in gauges:
            total += _write_gauge(out, gauge, sample_step)
        out.write("# EOF\n")
    return total


def _check_sample_step(sample_step: int) -> None:
    if not 1 <= sample_step <= 300:
        raise ConfigError(
            f"sample step {sample_step}s: instant queries look back 5 minutes, so write samples at "
            "15–60 s (at most 300 s)", field="sample_step")


def _write_counter(out: TextIO, fam: CounterFamily, sample_step: int) -> int:
    base = fam.name[: -len("_total")]
    out.write(f"# HELP {base} {fam.help}\n# TYPE {base} counter\n")
    n = 0
    for i, pod in enumerate(fam.pods):
        labels = _label_text({**fam.labels, "pod": pod})
        times, values = counter_samples(fam, i, sample_step)
        n += _write_rows(out, f"{fam.name}{labels}", times, values)
    return n


def _write_gauge(out: TextIO, fam: GaugeFamily, sample_step: int) -> int:
    out.write(f"# HELP {fam.name} {fam.help}\n# TYPE {fam.name} gauge\n")
    n = 0
    seen: set[str] = set()
    for extra, series in fam.per_series:
        labels = _label_text({**fam.labels, **extra})
        if labels in seen:
            raise DataError(f"gauge {fam.name}{labels} is listed twice; every series needs its own labels")
        seen.add(labels)
        step = fam.sample_step or sample_step
        times, _ = _sample_times(series, step, subsample=True)
        # Like a counter, a reading at t describes the interval (t - Δ, t]: the trace step
        # containing t - Δ (utilisation is averaged over the last sampling interval).
        idx = np.clip((times - step - int(series.start.timestamp())) // series.step_seconds,
                      0, len(series) - 1)
        values = series.values[idx]
        present = np.isfinite(values)
        n += _write_rows(out, f"{fam.name}{labels}", times[present], values[present])
    return n


def _write_rows(out: TextIO, prefix: str, times: np.ndarray, values: np.ndarray) -> int:
    # repr of a float keeps every digit, so counters integrate back exactly.
    out.writelines(f"{prefix} {float(v)!r} {int(t)}\n" for t, v in zip(times, values, strict=True))
    return int(len(times))

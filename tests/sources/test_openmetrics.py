from __future__ import annotations

import re
from datetime import timedelta

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.errors import ConfigError
from predictive_scaler.series import Series
from tests.support.openmetrics import (
    CounterFamily,
    GaugeFamily,
    counter_samples,
    write_openmetrics,
)

START = pd.Timestamp("2024-03-01T00:00:00Z")


def trace(values: list[float] | np.ndarray, step: int = 60) -> Series:
    return Series(values=np.asarray(values, dtype=float), start=START, step_seconds=step, name="t")


def ramp(n: int = 600, step: int = 60) -> Series:
    rng = np.random.default_rng(7)
    return trace(100 + 50 * np.sin(np.arange(n) / 40) + rng.uniform(0, 10, n), step)


def unreset(values: np.ndarray) -> np.ndarray:
    """Total increase Prometheus would see: a drop counts from zero (a restart)."""
    inc = np.diff(values)
    return np.where(inc >= 0, inc, values[1:])


@pytest.mark.parametrize("pods", [1, 3, 4], ids=["1pod", "3pods", "4pods"])
def test_counters_integrate_the_rate_across_pods_and_resets(pods: int) -> None:
    series = ramp()
    fam = CounterFamily(name="requests_total", series=series, pods=[f"p-{i}" for i in range(pods)],
                        rate_unit_seconds=60.0, reset_every=timedelta(hours=2))
    total = 0.0
    resets = 0
    for i in range(pods):
        times, values = counter_samples(fam, i, 15)
        assert np.all(np.diff(times) == 15)
        assert values[0] == 0.0
        resets += int((np.diff(values) < 0).sum())
        total += unreset(values).sum()
    expected = np.nansum(series.values) / 60.0 * series.step_seconds  # requests in the whole trace
    assert resets == pods * 5  # 10 hours, a restart every 2 hours per pod
    # each restart loses half a scrape interval of one pod's share
    assert total == pytest.approx(expected, rel=resets * 0.5 * 15 / (600 * 60) * 1.5)
    assert total < expected


def test_restarts_are_staggered_across_pods() -> None:
    fam = CounterFamily(name="requests_total", series=ramp(), pods=["a", "b", "c"],
                        reset_every=timedelta(hours=3))
    first_reset = []
    for i in range(3):
        times, values = counter_samples(fam, i, 60)
        first_reset.append(int(times[np.flatnonzero(np.diff(values) < 0)[0] + 1]))
    assert len(set(first_reset)) == 3


def test_missing_trace_steps_are_a_scrape_gap_not_zero() -> None:
    values = np.full(120, 60.0)
    values[30:40] = np.nan
    fam = CounterFamily(name="requests_total", series=trace(values), pods=["a"], reset_every=None)
    times, counter = counter_samples(fam, 0, 60)
    rel = (times - int(START.timestamp())) // 60
    assert not np.isin(np.arange(31, 41), rel).any()  # samples whose interval lies in the gap
    assert np.all(np.diff(counter) >= 0)
    assert counter[-1] == pytest.approx(60.0 * 60 * (120 - 10))


def test_coarse_trace_is_held_at_the_sample_step() -> None:
    coarse = trace([10.0, 20.0, 30.0], step=1800)
    gauge = GaugeFamily(name="util", per_series=[({"pod": "a"}, coarse)])
    lines = _write(gauge=gauge, sample_step=60)
    rows = [ln for ln in lines if ln.startswith("util{")]
    assert len(rows) == 3 * 30 + 1
    values = [float(r.split()[1]) for r in rows]
    # the reading at t describes (t - 60 s, t]: the sample at 30 min still reports the first step
    assert values[:31] == [10.0] * 31 and values[31:61] == [20.0] * 30


def test_file_is_valid_openmetrics_for_promtool(tmp_path) -> None:
    path = tmp_path / "x.om"
    fam = CounterFamily(name="requests_total", series=ramp(50), pods=["a", "b"],
                        labels={"namespace": 'we"ird\\ns'})
    n = write_openmetrics(path, counters=[fam],
                          gauges=[GaugeFamily(name="util", per_series=[({"pod": "a"}, ramp(50))])])
    lines = path.read_text().splitlines()
    assert lines[-1] == "# EOF"
    samples = [ln for ln in lines if not ln.startswith("#")]
    assert len(samples) == n
    assert 'namespace="we\\"ird\\\\ns"' in samples[0]
    by_series: dict[str, list[int]] = {}
    for ln in samples:
        name, value, ts = re.match(r"^(\S+\}|\S+) (\S+) (\d+)$", ln).groups()  # type: ignore[union-attr]
        float(value)
        by_series.setdefault(name, []).append(int(ts))
    assert len(by_series) == 3
    for stamps in by_series.values():
        assert stamps == sorted(set(stamps))  # strictly increasing, seconds


@pytest.mark.parametrize(
    "make",
    [
        lambda: CounterFamily(name="requests", series=ramp(), pods=["a"]),
        lambda: CounterFamily(name="requests_total", series=ramp(), pods=["a"], rate_unit_seconds=0),
        lambda: CounterFamily(name="requests_total", series=ramp(), pods=["a"], labels={"__x": "1"}),
        lambda: CounterFamily(name="requests-total", series=ramp(), pods=["a"]),
        lambda: write_openmetrics("/dev/null", counters=[CounterFamily(
            name="requests_total", series=ramp(), pods=["a"])], sample_step=600),
        lambda: write_openmetrics("/dev/null", gauges=[GaugeFamily(
            name="u", per_series=[({"pod": "a"}, ramp(step=60))])], sample_step=45),
        lambda: write_openmetrics("/dev/null"),
    ],
    ids=["counter-without-_total", "zero-rate-unit", "reserved-label", "bad-metric-name",
         "sample-step-beyond-lookback", "step-not-a-divisor", "nothing-to-write"],
)
def test_refuses_what_promtool_would_drop_or_misread(make) -> None:
    with pytest.raises(ConfigError):
        make()


def _write(*, gauge: GaugeFamily, sample_step: int) -> list[str]:
    import tempfile

    with tempfile.NamedTemporaryFile("r", suffix=".om") as fh:
        write_openmetrics(fh.name, gauges=[gauge], sample_step=sample_step)
        return fh.read().splitlines()


def test_a_family_may_use_a_coarser_sample_step() -> None:
    flat = trace(np.full(60, 5.0))
    lines = _write(gauge=GaugeFamily(name="q", per_series=[({"pod": "a"}, flat)], sample_step=240),
                   sample_step=60)
    stamps = [int(ln.split()[2]) for ln in lines if ln.startswith("q{")]
    assert np.all(np.diff(stamps) == 240) and len(stamps) == 60 * 60 // 240 + 1

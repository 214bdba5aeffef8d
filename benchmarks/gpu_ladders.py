"""The bundled H200 request ladders (backtests/telemetry/), read as Prometheus would show them.

The files hold one row per second of a server under an open-loop Poisson ladder
(backtests/telemetry/SOURCE.md). A scaler never sees those rows: it sees a served
*rate* over a window (``rate(requests_total[15s])``), a latency quantile over the
same window (``histogram_quantile(0.95, rate(..._bucket[15s]))``), the mean
latency (``rate(_sum) / rate(_count)``), and gauges averaged over it (running batch,
DCGM utilisation). :func:`windows` turns the rows into exactly those, window by
window; :func:`ladder_series` hands them to the estimators as per-replica
:class:`~predictive_scaler.series.Series`.

Latency. Each row gives the p50 and p95 of the requests completed in that second,
not the requests themselves. A window's quantile is the quantile of the *union*
of its seconds' requests (what a histogram over the window gives), which is not
the mean of the per-second quantiles: a slow second among fast ones moves the
union's p95 much more than its average. Each second is taken as a log-normal
through its p50 and p95 (latency is skewed and positive), weighted by the requests
it completed, and the mixture's quantile is solved for. The mean latency is the
mixture's mean.

Truth (tests only). A ladder's plateau is the mean ``served`` over the steps where
``served`` falls at least 5 % short of ``offered_rate`` while the queue grows; it
reads ``offered_rate`` and ``queue``, which no estimator may.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from predictive_scaler.series import Series

TELEMETRY = Path(__file__).resolve().parents[1] / "backtests" / "telemetry"

#: ladder name → (file, the server's mode in it)
LADDERS: dict[str, tuple[str, str]] = {
    "encoder-serial": ("h200_encoder_ladder.csv", "serial"),
    "encoder-batched": ("h200_encoder_ladder.csv", "batched"),
    "decoder-serial": ("h200_decode_ladder.csv", "serial"),
    "decoder-batched": ("h200_decode_ladder.csv", "batched"),
}
#: The ladders whose top steps queue (a plateau exists); encoder-serial never does.
SATURATED = ("decoder-serial", "decoder-batched", "encoder-batched")
#: One-sided z of the 95th percentile (the files' second quantile).
Z95 = 1.6448536269514722
#: An epoch for the windows' timestamps (the files count seconds from their start).
EPOCH = pd.Timestamp("2026-12-04T00:00:00Z")


def rows(name: str) -> pd.DataFrame:
    """The per-second rows of one ladder: its own mode's rows and the idle rows after them (the drain)."""
    file, mode = LADDERS[name]
    frame = pd.read_csv(TELEMETRY / file)
    mine = np.flatnonzero(frame["mode"].to_numpy() == mode)
    end = mine[-1] + 1
    while end < len(frame) and frame["mode"].iloc[end] == "idle":
        end += 1
    return frame.iloc[mine[0]:end].reset_index(drop=True)


@dataclass(frozen=True)
class Window:
    """One window as Prometheus would report it (``offered`` and ``queue`` for the tests' truth only)."""

    start: float
    seconds: int
    served: float  # requests/s
    p50: float  # seconds
    p95: float  # seconds
    mean_latency: float  # seconds
    running: float  # mean running batch while the server worked
    gpu_util: float  # %
    sm_util: float  # %
    offered: float
    queue_end: float


def windows(frame: pd.DataFrame, seconds: int = 15, step: int | None = None) -> list[Window]:
    """Windows of ``seconds`` rows, one starting every ``step`` rows (default: ``seconds``, back to back), as
    ``query_range`` evaluates ``rate(…[seconds])`` every ``step``; the last, partial window is dropped."""
    step = step or seconds
    out = []
    for i in range(0, len(frame) - seconds + 1, step):
        w = frame.iloc[i:i + seconds]
        served = w["served"].to_numpy(dtype=float)
        done = served > 0
        p50 = w["p50_ms"].to_numpy(dtype=float)[done] / 1000
        p95 = w["p95_ms"].to_numpy(dtype=float)[done] / 1000
        q50, q95, mean = _mixture(p50, p95, served[done])
        batch = w["mean_batch"].to_numpy(dtype=float)
        out.append(Window(
            start=float(w["t"].iloc[0]), seconds=seconds, served=float(served.sum()) / seconds,
            p50=q50, p95=q95, mean_latency=mean,
            running=float(np.nanmean(batch)) if np.isfinite(batch).any() else 0.0,
            gpu_util=float(w["gpu_util"].mean()), sm_util=float(w["sm_util"].mean()),
            offered=float(w["offered_rate"].mean()), queue_end=float(w["queue"].iloc[-1])))
    return out


def _mixture(p50: np.ndarray, p95: np.ndarray, weights: np.ndarray) -> tuple[float, float, float]:
    """(p50, p95, mean) of a weighted mixture of log-normals through each second's p50 and p95."""
    if weights.sum() <= 0:
        return math.nan, math.nan, math.nan
    mu = np.log(p50)
    # A second with one request has p50 = p95: a narrow spread, not a zero one.
    sigma = np.maximum(np.log(np.maximum(p95, p50) / p50) / Z95, 0.02)
    w = weights / weights.sum()
    mean = float(np.sum(w * np.exp(mu + sigma**2 / 2)))

    def share_below(x: float) -> float:
        z = (math.log(x) - mu) / sigma
        return float(np.sum(w * 0.5 * (1 + _erf(z / math.sqrt(2)))))

    def quantile(q: float) -> float:
        lo, hi = float(np.min(p50)) / 10, float(np.max(p95)) * 10
        for _ in range(80):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if share_below(mid) < q else (lo, mid)
        return math.sqrt(lo * hi)

    return quantile(0.5), quantile(0.95), mean


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf)(x)


@dataclass(frozen=True)
class LadderSeries:
    """One ladder's windows as the per-replica series an estimator reads."""

    served: Series
    p95: Series
    mean_latency: Series
    running: Series
    gpu_util: Series
    sm_util: Series
    #: The range of each window (its step may be shorter: windows then overlap).
    window_seconds: int


def window_series(ws: list[Window], step: int, name: str = "ladder") -> LadderSeries:
    """Windows (one every ``step`` seconds) as Series on a ``step`` grid."""
    start = EPOCH + pd.Timedelta(seconds=round(ws[0].start))

    def s(values: list[float], what: str) -> Series:
        return Series(np.array(values, dtype=float), start, step, name=f"{name} {what}")

    return LadderSeries(
        served=s([w.served for w in ws], "served req/s"), p95=s([w.p95 for w in ws], "p95 s"),
        mean_latency=s([w.mean_latency for w in ws], "mean latency s"), running=s([w.running for w in ws], "running"),
        gpu_util=s([w.gpu_util for w in ws], "gpu_util %"), sm_util=s([w.sm_util for w in ws], "sm_util %"),
        window_seconds=ws[0].seconds)


def ladder_series(name: str, seconds: int = 15, step: int = 5, *, up_to: float | None = None) -> LadderSeries:
    """A ladder as Prometheus shows it: ``rate(…[seconds])`` and friends every ``step`` seconds. ``up_to``:
    only the rungs whose offered rate is at most this (a history that never went higher; no drain)."""
    frame = rows(name)
    if up_to is not None:
        keep = (frame["offered_rate"] <= up_to) & (frame["mode"] != "idle")
        frame = frame[keep].reset_index(drop=True)
    return window_series(windows(frame, seconds, step), step, name)


@dataclass(frozen=True)
class Step:
    """One rung of the ladder (rows sharing an offered rate), its first ``TRANSIENT`` seconds dropped."""

    offered: float
    served: float
    p95_ms: float
    #: Mean latency of the rung's requests (the mixture of its seconds, as a histogram's sum ÷ count).
    mean_ms: float
    gpu_util: float
    sm_util: float
    queue_grew: bool


#: Seconds at the start of each rung that are the previous rung's transient (SOURCE.md).
TRANSIENT = 2


def steps(name: str) -> list[Step]:
    """The ladder's rungs in order of offered rate."""
    frame = rows(name)
    frame = frame[frame["mode"] != "idle"]
    out = []
    for offered, rung in frame.groupby("offered_rate", sort=True):
        body = rung.iloc[TRANSIENT:]
        queue = rung["queue"].to_numpy(dtype=float)
        done = body["served"].to_numpy(dtype=float) > 0
        _, _, mean = _mixture(body["p50_ms"].to_numpy(dtype=float)[done] / 1000,
                              body["p95_ms"].to_numpy(dtype=float)[done] / 1000,
                              body["served"].to_numpy(dtype=float)[done])
        out.append(Step(offered=float(offered), served=float(body["served"].mean()),
                        p95_ms=float(body["p95_ms"].mean()), mean_ms=mean * 1000,
                        gpu_util=float(body["gpu_util"].mean()), sm_util=float(body["sm_util"].mean()),
                        queue_grew=_grows(queue)))
    return out


def _grows(queue: np.ndarray) -> bool:
    """The queue's median over the rung's second half exceeds its first half's by at least one request
    (medians: a single burst at the end of a rung is not a growing queue)."""
    half = len(queue) // 2
    return bool(np.median(queue[half:]) - np.median(queue[:half]) >= 1.0)


def plateau(name: str) -> float | None:
    """Mean ``served`` over the rungs that fall ≥ 5 % short of their offered rate while the queue grows."""
    short = [s.served for s in steps(name) if s.served <= 0.95 * s.offered and s.queue_grew]
    return float(np.mean(short)) if short else None


def highest_served(name: str) -> float:
    return max(s.served for s in steps(name))

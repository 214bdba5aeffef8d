"""What one replica serves, learned from DCGM history, and what idle allocated GPUs cost.

Capacity. A GPU busy ``u`` (0–1) of the time while serving ``r`` requests/s
serves ``r / u`` requests/s at 100 % — as long as it is not saturated: DCGM
utilisation stops at 100 % while requests keep queueing, so saturated steps
would understate capacity. From the joint history of total requests/s and
busy GPUs (Σ utilisation / 100 over the workload's GPUs) we keep the
unsaturated, non-idle steps, estimate requests/s per busy GPU as the ratio of
sums (the least-squares slope of requests on busy GPUs when the noise grows
with load), and report a 90 % interval from a moving-block bootstrap over
one-hour blocks (neighbouring steps are correlated, so resampling single steps
would make the interval too narrow). One replica at the scaler's utilisation
target then serves ``per_gpu × target × gpus_per_replica``.

Idle GPUs. An allocated GPU whose utilisation stayed under 5 % for 10 minutes
or more is waste (the most common GPU waste in Kubernetes clusters). Counting
them is PromQL's job (:func:`predictive_scaler.sources.dcgm.idle_allocated_gpus`);
:func:`summarise_idle` turns that count over time into GPU-hours and cost per day.

Where it is wrong. Requests per busy GPU is right only for a server whose GPU busy time is its
load: on a continuous-batching server utilisation reads ~97 % at a tenth of capacity (16× too low on
the bundled H200 decoder), on a CPU-bound one it misses the load (6.9× too high on the serial
encoder). :mod:`predictive_scaler.policy.slo_capacity` learns capacity at the latency SLO from the
server's own served rate, latency and running batch instead (docs/gpu-capacity.md).

Pure functions: series in, frozen values out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from predictive_scaler.errors import DataError
from predictive_scaler.series import Series

#: Mean utilisation (%) at or above which a step counts as saturated and is not used.
SATURATION_PERCENT = 90.0
#: Busy GPUs below this are too quiet to say anything (exporter noise, warm-up).
MIN_BUSY_GPUS = 0.05
#: Unsaturated steps needed before an estimate is given.
MIN_STEPS = 48
BOOTSTRAP_BLOCK_SECONDS = 3600
BOOTSTRAP_RESAMPLES = 200
#: The interval reported around the estimate.
INTERVAL = 0.90


@dataclass(frozen=True)
class CapacityEstimate:
    """Requests/s one replica serves at the utilisation target, with its uncertainty."""

    #: Point estimate: requests/s per replica at ``utilization_target``.
    requests_per_replica: float
    #: 90 % interval of ``requests_per_replica`` (moving-block bootstrap).
    low: float
    high: float
    #: Requests/s one fully busy GPU serves (the learned slope).
    requests_per_busy_gpu: float
    utilization_target: float
    gpus_per_replica: int
    #: Steps used (unsaturated, non-idle, both signals present) and steps dropped as saturated.
    steps_used: int
    steps_saturated: int
    step_seconds: int

    @property
    def relative_uncertainty(self) -> float:
        """Half-width of the interval relative to the estimate."""
        return (self.high - self.low) / 2.0 / self.requests_per_replica

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["relative_uncertainty"] = self.relative_uncertainty
        doc["interval"] = INTERVAL
        doc["method"] = ("ratio of sums of requests/s to busy GPUs over unsaturated steps "
                         f"(mean utilisation < {SATURATION_PERCENT:g} %); moving-block bootstrap interval")
        return doc


def estimate_capacity(
    requests: Series,
    busy_gpus: Series,
    *,
    utilization_target: float,
    gpus_per_replica: int = 1,
    mean_utilisation: Series | None = None,
    saturation_percent: float = SATURATION_PERCENT,
    min_steps: int = MIN_STEPS,
    seed: int = 0,
) -> CapacityEstimate:
    """Capacity from paired requests/s and busy GPUs on the same grid.

    ``mean_utilisation`` (%, mean over the workload's GPUs) marks saturated
    steps; without it a step counts as saturated when busy GPUs sit at a whole
    number of fully busy GPUs — so pass it whenever you have it. Raises
    :class:`DataError` when too few usable steps remain.
    """
    if not (0 < utilization_target <= 1):
        raise DataError(f"utilisation target {utilization_target} must be in (0, 1], e.g. 0.7")
    if gpus_per_replica < 1:
        raise DataError(f"gpus per replica must be at least 1, got {gpus_per_replica}")
    req, busy, util = _aligned(requests, busy_gpus, mean_utilisation)
    present = np.isfinite(req) & np.isfinite(busy) & (req >= 0)
    if util is not None:
        present &= np.isfinite(util)
        saturated = present & (util >= saturation_percent)
    else:
        saturated = present & (np.abs(busy - np.rint(busy)) < 1e-6) & (busy >= 1)
    usable = present & ~saturated & (busy >= MIN_BUSY_GPUS) & (req > 0)
    n = int(usable.sum())
    if n < min_steps:
        raise DataError(
            f"capacity from DCGM: only {n} unsaturated steps with both requests and GPU utilisation "
            f"(need {min_steps}; {int(saturated.sum())} saturated); check the DCGM exporter covers the "
            "target's pods, or set capacity.requestsPerReplica by hand")
    r, b = req[usable], busy[usable]
    slope = float(r.sum() / b.sum())
    per_replica = slope * utilization_target * gpus_per_replica
    block = max(1, BOOTSTRAP_BLOCK_SECONDS // requests.step_seconds)
    draws = _block_bootstrap(r, b, block, BOOTSTRAP_RESAMPLES, seed)
    lo_q, hi_q = (1 - INTERVAL) / 2, 1 - (1 - INTERVAL) / 2
    low, high = (float(np.quantile(draws, q)) * utilization_target * gpus_per_replica for q in (lo_q, hi_q))
    if not all(math.isfinite(v) and v > 0 for v in (per_replica, low, high)):
        raise DataError("capacity from DCGM came out non-finite; check the request-rate and DCGM series")
    return CapacityEstimate(
        requests_per_replica=per_replica, low=min(low, per_replica), high=max(high, per_replica),
        requests_per_busy_gpu=slope, utilization_target=utilization_target,
        gpus_per_replica=gpus_per_replica, steps_used=n, steps_saturated=int(saturated.sum()),
        step_seconds=requests.step_seconds,
    )


def _aligned(requests: Series, busy: Series, util: Series | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The overlapping steps of the series (same step required)."""
    series = [s for s in (requests, busy, util) if s is not None]
    if len({s.step_seconds for s in series}) != 1:
        raise DataError("capacity from DCGM: requests and utilisation series must share one step; "
                        "pull them at the same step")
    start = max(s.start for s in series)
    end = min(s.end for s in series)
    if end <= start:
        raise DataError("capacity from DCGM: the request and utilisation histories do not overlap")
    out = [s.slice(s.index_at(start), s.index_at(start) + int((end - start) / s.step)).values for s in series]
    return out[0], out[1], (out[2] if util is not None else None)


def _block_bootstrap(r: np.ndarray, b: np.ndarray, block: int, resamples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = r.size
    block = min(block, n)
    starts_max = n - block + 1
    blocks_needed = math.ceil(n / block)
    out = np.empty(resamples)
    offsets = np.arange(block)
    for i in range(resamples):
        idx = (rng.integers(0, starts_max, blocks_needed)[:, None] + offsets).ravel()[:n]
        out[i] = r[idx].sum() / b[idx].sum()
    return out


@dataclass(frozen=True)
class IdleGpus:
    """Allocated GPUs idle (< 5 % for ≥ 10 min) over a window, and what they cost."""

    #: Idle GPUs at the last observed step (None when nothing reported then).
    now: float | None
    #: Mean idle GPUs over the observed steps of the window.
    mean: float
    #: Mean allocated GPUs (reporting to DCGM) over the window, when known.
    allocated_mean: float | None
    idle_gpu_hours_per_day: float
    #: ``idle_gpu_hours_per_day × price per GPU-hour``; None without a price.
    cost_per_day: float | None
    currency: str
    observed_hours: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarise_idle(
    idle: Series,
    *,
    allocated: Series | None = None,
    price_per_gpu_hour: float | None = None,
    currency: str = "USD",
) -> IdleGpus:
    """GPU-hours per day wasted by idle allocated GPUs, from the idle-GPU count over time.

    ``idle`` holds, per step, how many allocated GPUs had been under the idle
    threshold for the whole idle window (NaN where no GPU reported).
    """
    vals = np.asarray(idle.values, dtype=float)
    seen = np.isfinite(vals)
    if not seen.any():
        raise DataError("idle GPUs: no DCGM utilisation reported in the window; check the DCGM exporter")
    mean = float(vals[seen].mean())
    present = np.flatnonzero(seen)
    now = float(vals[-1]) if seen[-1] else None
    alloc_mean = None
    if allocated is not None and np.isfinite(allocated.values).any():
        alloc_mean = float(np.nanmean(allocated.values))
    hours_per_day = mean * 24.0
    cost = None if price_per_gpu_hour is None else hours_per_day * float(price_per_gpu_hour)
    return IdleGpus(now=now, mean=mean, allocated_mean=alloc_mean, idle_gpu_hours_per_day=hours_per_day,
                    cost_per_day=cost, currency=currency,
                    observed_hours=present.size * idle.step_seconds / 3600.0)

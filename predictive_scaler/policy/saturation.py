"""Is DCGM utilisation a demand signal for this server? A pure check over its recent serving history.

``demand.kind: dcgm-busy-gpus`` scales on Σ GPU_UTIL/100: it assumes a GPU's busy share is the
share of its capacity in use. Two kinds of server break that, and the history shows which:

- **pinned** — a batching server (vLLM, TGI: continuous batching) keeps a kernel running whenever
  anything is in flight, so utilisation reads ≥ 90 % at a tenth of capacity and stays there while
  the served rate varies several-fold. Scaling on it adds replicas until ``maxReplicas``: each new
  replica's GPU reads busy too. The history shows it as utilisation at the ceiling while latency
  stays at its unloaded level (a GPU truly at 90 % of its capacity queues or runs near-full
  batches, and either makes requests slower), or while the served rate per GPU doubles.
- **blind** — a server bound by its CPU (kernel launches, tokenisation, Python) queues requests
  while its GPU reads 10–30 %: latency climbs, utilisation does not, and the scaler never adds
  the replica it needs — or removes one.

:func:`check_demand_signal` says which, from per-step fleet throughput, GPUs, mean utilisation and
latency. When it fires the signal must not drive a scale-up; the message names what to scale on
instead (the request rate, with capacity learned at the SLO: :mod:`predictive_scaler.policy.slo_capacity`).
Each threshold is in its constant's comment, argued from how servers behave.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from predictive_scaler.errors import DataError
from predictive_scaler.series import Series

__all__ = ["ServingHistory", "SignalCheck", "check_demand_signal", "gpu_blind_steps"]

#: Utilisation (%) at which DCGM reads "busy all the time".
PINNED_PERCENT = 90.0
#: Reference steps for the unloaded latency: utilisation at most this (%), well below saturation.
REFERENCE_PERCENT = 60.0
#: A GPU truly at ≥ 90 % of its capacity makes requests slower than unloaded: one at a time it queues
#: (M/D/1 at 90 %: 5.5× the service time); batching, it runs near-full batches, and a full batch's
#: forward pass takes 1.45× (encoder) to 1.7× (decoder) a single request's on the bundled H200 servers
#: (backtests/telemetry/*.meta.json). Latency within this factor of unloaded at ≥ 90 % says the GPU was not
#: near its capacity: utilisation is pinned.
FLAT_LATENCY = 1.25
#: Utilisation at the ceiling while the served rate per GPU varies by at least this factor: a GPU whose
#: busy share measured its load could serve at most 1/0.9 = 1.11× more once it read 90 %.
PINNED_SPREAD = 2.0
#: Blind: latency at least this many times unloaded while utilisation stays at most BLIND_PERCENT. A GPU
#: busy u of the time explains at most 1/(1 − u) of queueing latency (M/M/1: 1.43× at 30 %); twice the
#: unloaded latency there comes from somewhere else (the CPU).
BLIND_LATENCY = 2.0
BLIND_PERCENT = 30.0
#: Steps needed before anything is said.
MIN_STEPS = 4


@dataclass(frozen=True)
class ServingHistory:
    """A workload's serving history on one grid: what it served, on how many GPUs, how busy they read,
    how long requests took."""

    #: Requests (or tokens) served per second, the whole workload.
    throughput: Series
    #: GPUs reporting to DCGM (or replicas × GPUs per replica).
    gpus: Series
    #: Mean GPU utilisation, % (DCGM_FI_DEV_GPU_UTIL averaged over the workload's GPUs).
    utilisation: Series
    #: Request latency in seconds (the mean, or the quantile the SLO names).
    latency: Series


@dataclass(frozen=True)
class SignalCheck:
    """Whether utilisation may drive scaling for this workload, and why."""

    verdict: Literal["tracks-load", "pinned", "blind", "unknown"]
    #: CamelCase reason for a Condition.
    reason: str
    message: str
    steps: int
    #: Served rate per GPU where utilisation read pinned (the lowest such rate) or blind (the highest).
    at_throughput: float | None = None
    utilisation: float | None = None
    #: Latency there ÷ the unloaded latency.
    latency_ratio: float | None = None
    #: The most one GPU served while latency stayed unloaded: a lower bound of its capacity.
    served_per_gpu_unloaded: float | None = None

    @property
    def fired(self) -> bool:
        """The signal misleads: it must not drive a scale-up."""
        return self.verdict in ("pinned", "blind")


@dataclass(frozen=True)
class _Steps:
    per_gpu: np.ndarray
    util: np.ndarray
    latency: np.ndarray


def check_demand_signal(history: ServingHistory) -> SignalCheck:
    """Whether GPU utilisation tracks load in ``history``; ``fired`` when it is pinned or blind."""
    s = _steps(history)
    n = int(s.per_gpu.size)
    if n < MIN_STEPS:
        return SignalCheck("unknown", "NotEnoughHistory",
                           f"only {n} steps with requests, GPUs and latency: too few to tell whether GPU "
                           "utilisation tracks load", n)
    reference = s.util <= REFERENCE_PERCENT
    unloaded = float(np.median(s.latency[reference])) if reference.any() else None
    calm_top = None
    if unloaded is not None:
        calm = s.latency <= FLAT_LATENCY * unloaded
        calm_top = float(np.max(s.per_gpu[calm])) if calm.any() else None
    pinned = _pinned(s, unloaded)
    if pinned is not None:
        rate, util, ratio, why = pinned
        return SignalCheck(
            "pinned", "UtilisationPinned",
            f"GPU utilisation is pinned: it read {util:.0f} % at {rate:.3g} req/s per GPU {why}, so it does not "
            "measure load and scaling on it would add replicas up to maxReplicas; not scaling up on "
            "dcgm-busy-gpus. Use demand.kind: requests (the served request rate) with "
            "capacity.requestsPerReplica learned at the latency SLO"
            + (f" (one GPU served {calm_top:.3g} req/s here at unloaded latency: at least that)"
               if calm_top is not None else ""),
            n, rate, util, ratio, calm_top)
    blind = gpu_blind_steps(s.per_gpu, s.util, s.latency, unloaded)
    if blind.any():
        i = int(np.flatnonzero(blind)[np.argmax(s.per_gpu[blind])])
        assert unloaded is not None
        ratio = float(s.latency[i] / unloaded)
        return SignalCheck(
            "blind", "UtilisationBlind",
            f"GPU utilisation misses the load: latency reached {ratio:.1f}× its unloaded level at "
            f"{s.per_gpu[i]:.3g} req/s per GPU while the GPUs read only {s.util[i]:.0f} % (a GPU that busy "
            f"explains at most {1 / (1 - s.util[i] / 100):.2f}×): the bottleneck is elsewhere (CPU, tokenisation), "
            "and dcgm-busy-gpus would not add the replica it needs; not scaling on it. Use demand.kind: requests "
            "with capacity.requestsPerReplica learned at the latency SLO",
            n, float(s.per_gpu[i]), float(s.util[i]), ratio, calm_top)
    return SignalCheck("tracks-load", "UtilisationTracksLoad",
                       "GPU utilisation rises with the served rate and latency agrees with it: dcgm-busy-gpus is a "
                       "usable demand signal", n, served_per_gpu_unloaded=calm_top)


def gpu_blind_steps(per_gpu: np.ndarray, util: np.ndarray, latency: np.ndarray, unloaded: float | None) -> np.ndarray:
    """Steps where latency is BLIND_LATENCY× ``unloaded`` or more while utilisation stays ≤ BLIND_PERCENT and
    the GPU serves more than in any reference step (the load rose): work the GPU does not see."""
    if unloaded is None or not math.isfinite(unloaded) or unloaded <= 0:
        return np.zeros(per_gpu.shape, dtype=bool)
    reference = util <= REFERENCE_PERCENT
    base = float(np.median(per_gpu[reference & (latency <= FLAT_LATENCY * unloaded)])) if reference.any() else 0.0
    return (latency >= BLIND_LATENCY * unloaded) & (util <= BLIND_PERCENT) & (per_gpu > base)


def _pinned(s: _Steps, unloaded: float | None) -> tuple[float, float, float | None, str] | None:
    """(rate per GPU, utilisation, latency ratio, why) where utilisation reads pinned; None when it does not."""
    busy = s.util >= PINNED_PERCENT
    if not busy.any():
        return None
    if unloaded is not None:
        reference = s.util <= REFERENCE_PERCENT
        flat = busy & (s.latency <= FLAT_LATENCY * unloaded) & (s.per_gpu > float(np.max(s.per_gpu[reference])))
        if flat.any():
            i = int(np.flatnonzero(flat)[np.argmin(s.per_gpu[flat])])
            ratio = float(s.latency[i] / unloaded)
            return (float(s.per_gpu[i]), float(s.util[i]), ratio,
                    f"with latency {ratio:.2f}× its unloaded {unloaded * 1000:.0f} ms (a GPU near its capacity "
                    "queues or runs near-full batches, and either is slower)")
    lo, hi = float(np.min(s.per_gpu[busy])), float(np.max(s.per_gpu[busy]))
    if lo > 0 and hi >= PINNED_SPREAD * lo:
        return (lo, float(np.median(s.util[busy])), None,
                f"and stayed at or above {PINNED_PERCENT:g} % while the rate per GPU went up to {hi:.3g} "
                f"({hi / lo:.1f}×; a GPU really {PINNED_PERCENT:g} % busy serves at most 1.11× more)")
    return None


def _steps(h: ServingHistory) -> _Steps:
    series = (h.throughput, h.gpus, h.utilisation, h.latency)
    if len({s.step_seconds for s in series}) != 1:
        raise DataError("demand-signal check: throughput, GPUs, utilisation and latency must share one step")
    start = max(s.start for s in series)
    end = min(s.end for s in series)
    if end <= start:
        return _Steps(np.array([]), np.array([]), np.array([]))
    n = int((end - start) / h.throughput.step)
    x, g, u, lat = (np.asarray(s.slice(s.index_at(start), s.index_at(start) + n).values, dtype=float)
                    for s in series)
    keep = np.isfinite(x) & (x > 0) & np.isfinite(g) & (g > 0) & np.isfinite(u) & np.isfinite(lat) & (lat > 0)
    return _Steps(x[keep] / g[keep], u[keep], lat[keep])

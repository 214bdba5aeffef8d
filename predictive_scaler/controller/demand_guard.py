"""The dcgm-busy-gpus guard at the edge: withhold a utilisation reading that does not measure load.

:func:`predictive_scaler.policy.saturation.check_demand_signal` decides, purely, whether GPU
utilisation tracks this workload's load. Here that decision meets the reconcile step: a scaler
whose demand is ``dcgm-busy-gpus`` and whose metrics port can also give its serving history
(:class:`ServingHistoryPort`: served rate, GPUs, utilisation, latency) has its demand reading
withheld while the check fires. The planner then does what it does with a demand it cannot trust —
it holds: no scale-up on the signal, and no scale-down either (a pinned signal that dropped would
say nothing true about load). The controller reports the check as the ``DemandSignalSaturated``
Condition and Event (``controller/status.py``, ``controller/service.py``).

Without a serving history the scaler runs as before and the Condition says the check is not wired.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

from predictive_scaler.core.values import DemandSample
from predictive_scaler.errors import DataError, SourceError
from predictive_scaler.policy.saturation import ServingHistory, SignalCheck, check_demand_signal
from predictive_scaler.reconcile import MetricsPort
from predictive_scaler.series import Series

__all__ = ["DEFAULT_WINDOW", "GuardedDemand", "ServingHistoryPort"]

#: History the check reads. Whether utilisation tracks load is a property of the server, not of the
#: hour, so the window must reach back past the last time load was low: a pinned server that has sat
#: at one load for a while shows no contrast in a short window.
DEFAULT_WINDOW = timedelta(hours=6)


@runtime_checkable
class ServingHistoryPort(Protocol):
    def serving_history(self, now: datetime, window: timedelta) -> ServingHistory:
        """The workload's served rate, GPUs, mean GPU utilisation and latency over ``(now - window, now]``;
        raise SourceError when the source fails."""
        ...


class GuardedDemand:
    """A MetricsPort whose ``demand_now`` is withheld (a SourceError) while the demand signal misleads."""

    def __init__(self, inner: MetricsPort, history: ServingHistoryPort, window: timedelta = DEFAULT_WINDOW) -> None:
        self.inner = inner
        self.history = history
        self.window = window
        #: The check of the latest reading (None before the first).
        self.last: SignalCheck | None = None

    def check(self, now: datetime) -> SignalCheck:
        try:
            found = check_demand_signal(self.history.serving_history(now, self.window))
        except (SourceError, DataError) as exc:
            # No evidence is no verdict: the signal is used as it is, and the Condition says why unchecked.
            found = SignalCheck("unknown", "ServingHistoryUnavailable",
                                f"the serving history to check GPU utilisation against is unavailable ({exc})", 0)
        self.last = found
        return found

    def demand_now(self, now: datetime) -> DemandSample:
        found = self.check(now)
        if found.fired:
            raise SourceError(f"demand signal saturated: {found.message}")
        return self.inner.demand_now(now)

    def recent(self, now: datetime, window: timedelta, step_seconds: int) -> Series:
        return self.inner.recent(now, window, step_seconds)

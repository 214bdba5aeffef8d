"""Time as an injected dependency.

Policy and forecasting code never reads the wall clock: it is handed ``now``.
The reconciler gets a :class:`Clock`; the controller passes :class:`SystemClock`,
the backtest and the tests pass :class:`FakeClock`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Current time, timezone-aware UTC."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("FakeClock needs a timezone-aware start time (use UTC)")
        self._now = start

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta | float) -> datetime:
        if not isinstance(delta, timedelta):
            delta = timedelta(seconds=float(delta))
        self._now = self._now + delta
        return self._now

    def set(self, when: datetime) -> None:
        if when.tzinfo is None:
            raise ValueError("FakeClock.set needs a timezone-aware time (use UTC)")
        self._now = when

"""Bounded retries for Kubernetes API calls.

Transient failures (server errors, throttling, connection errors) are retried with exponential
backoff and jitter; a throttle's ``Retry-After`` is honoured. A conflict is
retried only for read-modify-write operations, where the operation re-reads
the object itself. Attempts and total time are both bounded so a reconcile
never outlives its period. The loop is tenacity's; sleep, clock and
randomness are injected: tests run with a FakeClock and no real sleeping.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception

from predictive_scaler.clock import Clock
from predictive_scaler.errors import ClusterError, ConfigError, ConflictError, ThrottledError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try before giving up.

    Defaults fit a 30–60 s reconcile period: at most 5 attempts within 20 s,
    delays 0.5, 1, 2, 4 s (capped at 8 s) with ±50 % "equal jitter" so that
    many scalers do not retry in lock-step. A Retry-After longer than
    ``max_retry_after`` is not waited for; the error goes to the caller, who
    tries again next period.
    """

    max_attempts: int = 5
    base_delay: float = 0.5
    max_delay: float = 8.0
    max_elapsed: float = 20.0
    max_retry_after: float = 10.0
    conflict_delay: float = 0.05

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError("retry max_attempts must be at least 1", field="maxAttempts")
        for name in ("base_delay", "max_delay", "max_elapsed", "max_retry_after", "conflict_delay"):
            if getattr(self, name) < 0:
                raise ConfigError(f"retry {name} must not be negative", field=name)
        if self.max_delay < self.base_delay:
            raise ConfigError("retry max_delay must be >= base_delay", field="max_delay")

    def backoff(self, retry_number: int, rng: random.Random) -> float:
        """Delay before retry ``retry_number`` (1 = first retry): half fixed, half random."""
        ceiling = min(self.max_delay, self.base_delay * (2 ** (retry_number - 1)))
        return ceiling / 2 + rng.uniform(0, ceiling / 2)


NO_RETRY = RetryPolicy(max_attempts=1)


def call_with_retry(
    operation: Callable[[], T],
    *,
    policy: RetryPolicy,
    sleep: Callable[[float], object],
    clock: Clock,
    rng: random.Random,
    retry_conflicts: bool = False,
    what: str = "Kubernetes API call",
) -> T:
    """Run ``operation`` until it succeeds or the policy says stop (a tenacity ``Retrying``).

    ``retry_conflicts`` marks a read-modify-write ``operation`` that re-reads the
    object on each attempt, so a conflict is worth retrying; a blind write that got
    one would only conflict again, so it is raised at once.
    Non-retryable errors are raised at once. The last error is raised with a
    note of how many attempts were made. tenacity sleeps with ``sleep`` and the
    elapsed-time bound reads ``clock``: nothing here reads the wall clock.
    """
    started = clock.now()

    def elapsed() -> float:
        return (clock.now() - started).total_seconds()

    def retryable(exc: BaseException) -> bool:
        if isinstance(exc, ConflictError):
            return retry_conflicts
        if isinstance(exc, ThrottledError) and exc.retry_after is not None and exc.retry_after > policy.max_retry_after:
            exc.add_note(
                f"{what}: the API server asked to wait {exc.retry_after:g} s, longer "
                f"than the {policy.max_retry_after:g} s this call may wait; will "
                "retry next reconcile"
            )
            return False
        return isinstance(exc, ClusterError) and exc.retryable

    def wait(state: RetryCallState) -> float:
        exc = _error(state)
        if isinstance(exc, ConflictError):
            return policy.conflict_delay * (1 + rng.random())
        backoff = policy.backoff(state.attempt_number, rng)
        if isinstance(exc, ThrottledError) and exc.retry_after is not None:
            return max(exc.retry_after, backoff)
        return backoff

    def stop(state: RetryCallState) -> bool:
        # The wait is computed first (tenacity's order), so the next sleep counts against the bound.
        return (state.attempt_number >= policy.max_attempts
                or elapsed() + state.upcoming_sleep > policy.max_elapsed)

    def give_up(state: RetryCallState) -> T:
        error = _error(state)
        error.add_note(
            f"{what}: gave up after {state.attempt_number} attempt(s) in {elapsed():.1f} s "
            f"(limit {policy.max_attempts} attempts / {policy.max_elapsed:g} s)"
        )
        raise error

    def pause(seconds: float) -> None:
        sleep(seconds)

    retrying = Retrying(sleep=pause, stop=stop, wait=wait, retry=retry_if_exception(retryable),
                        retry_error_callback=give_up)
    return retrying(operation)


def _error(state: RetryCallState) -> BaseException:
    assert state.outcome is not None and state.outcome.failed
    exc = state.outcome.exception()
    assert exc is not None
    return exc

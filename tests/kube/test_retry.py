from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from predictive_scaler.clock import FakeClock
from predictive_scaler.errors import (
    ClusterError,
    ConfigError,
    ConflictError,
    ForbiddenError,
    GoneError,
    NotFoundError,
    ServerError,
    ThrottledError,
)
from predictive_scaler.kube.retry import RetryPolicy, call_with_retry


class Script:
    """An operation that raises the scripted errors in turn, then returns "ok"."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def _run(operation, policy=None, retry_conflicts=False):
    clock = FakeClock(datetime(2025, 1, 6, tzinfo=UTC))
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock.advance(seconds)

    result = call_with_retry(
        operation,
        policy=policy or RetryPolicy(),
        sleep=sleep,
        clock=clock,
        rng=random.Random(1),
        retry_conflicts=retry_conflicts,
    )
    return result, sleeps


def _server_error():
    return ServerError("boom", status=503)


@pytest.mark.parametrize(
    ("errors", "retry_conflicts", "calls"),
    [
        ((), False, 1),
        ((_server_error(), _server_error()), False, 3),
        ((ServerError("conn"),), False, 2),
        ((ThrottledError("slow", retry_after=2),), False, 2),
        ((ConflictError("stale"), ConflictError("stale")), True, 3),
    ],
    ids=["first-try", "server-error-twice", "connection-error", "throttled", "conflict-read-modify-write"],
)
def test_transient_errors_are_retried_until_success(errors, retry_conflicts, calls):
    op = Script(*errors)
    result, _ = _run(op, retry_conflicts=retry_conflicts)
    assert result == "ok"
    assert op.calls == calls


@pytest.mark.parametrize(
    ("error", "retry_conflicts"),
    [
        (ForbiddenError("forbidden", status=403), False),
        (NotFoundError("not found", status=404), False),
        (GoneError("too old", status=410), False),
        (ConflictError("stale"), False),
        (ConfigError("bad spec"), True),
    ],
    ids=["forbidden", "not-found", "gone", "conflict-blind-write", "config-error"],
)
def test_permanent_errors_are_raised_at_once(error, retry_conflicts):
    op = Script(error)
    with pytest.raises(type(error)):
        _run(op, retry_conflicts=retry_conflicts)
    assert op.calls == 1


def test_backoff_grows_exponentially_with_bounded_jitter():
    policy = RetryPolicy(max_attempts=6, base_delay=1.0, max_delay=8.0, max_elapsed=1000)
    op = Script(*[_server_error() for _ in range(5)])
    _, sleeps = _run(op, policy)
    ceilings = [1.0, 2.0, 4.0, 8.0, 8.0]
    assert len(sleeps) == 5
    for slept, ceiling in zip(sleeps, ceilings, strict=True):
        assert ceiling / 2 <= slept <= ceiling


def test_jitter_differs_between_scalers():
    policy = RetryPolicy(base_delay=1.0)
    delays = {policy.backoff(3, random.Random(seed)) for seed in range(5)}
    assert len(delays) == 5


def test_retry_after_is_honoured():
    op = Script(ThrottledError("slow", retry_after=3.0))
    _, sleeps = _run(op, RetryPolicy(base_delay=0.1))
    assert sleeps == [3.0]


def test_retry_after_longer_than_allowed_is_not_waited_for():
    op = Script(ThrottledError("slow", retry_after=60))
    with pytest.raises(ThrottledError) as info:
        _run(op, RetryPolicy(max_retry_after=10))
    assert op.calls == 1
    assert any("60 s" in note for note in info.value.__notes__)


@pytest.mark.parametrize(
    ("policy", "max_calls"),
    [
        (RetryPolicy(max_attempts=3, max_elapsed=1000), 3),
        # delays are at least 0.5 s each, so at most 10 sleeps fit in 5 s
        (RetryPolicy(max_attempts=100, base_delay=1.0, max_delay=1.0, max_elapsed=5.0), 11),
    ],
    ids=["attempts", "elapsed-time"],
)
def test_retries_are_bounded(policy, max_calls):
    op = Script(*[_server_error() for _ in range(1000)])
    with pytest.raises(ClusterError) as info:
        _run(op, policy)
    assert 1 < op.calls <= max_calls
    assert any("gave up after" in note for note in info.value.__notes__)


def test_total_sleep_stays_within_the_elapsed_budget():
    policy = RetryPolicy(max_attempts=50, base_delay=0.5, max_delay=4.0, max_elapsed=12.0)
    clock = FakeClock(datetime(2025, 1, 6, tzinfo=UTC))
    with pytest.raises(ClusterError):
        call_with_retry(
            Script(*[_server_error() for _ in range(1000)]),
            policy=policy,
            sleep=clock.advance,
            clock=clock,
            rng=random.Random(3),
        )
    assert (clock.now() - datetime(2025, 1, 6, tzinfo=UTC)).total_seconds() <= 12.0


@pytest.mark.parametrize(
    "kwargs",
    [{"max_attempts": 0}, {"base_delay": -1}, {"base_delay": 5, "max_delay": 1}],
    ids=["zero-attempts", "negative-delay", "max-below-base"],
)
def test_policy_is_validated(kwargs):
    with pytest.raises(ConfigError):
        RetryPolicy(**kwargs)

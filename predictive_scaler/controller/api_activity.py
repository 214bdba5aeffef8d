"""What the Kubernetes API did to one reconcile: error answers and the retries that absorbed them.

:class:`~predictive_scaler.kube.client.KubeCluster` retries a conflict, a throttle, a server
error or an unreachable server inside one call (``kube/retry.py``); a call that finally
succeeds leaves no trace, and one that fails surfaces only its last error. The
``ApiDegraded`` condition and ``predictive_scaler_api_retries_total`` need the
retries too, so the edge that builds the adapter (``run.py``, the test harness)
wires an :class:`ApiActivity` around the two things it hands ``KubeCluster``:

- the API client (:meth:`ApiActivity.wrap`), to see every answer (its status means what
  :func:`~predictive_scaler.kube.api_errors.api_error` says, as for KubeCluster);
- the retry sleep (:meth:`ApiActivity.sleep`), called exactly once before each retry,
  so a retry is counted under the kind of the answer that caused it.

The same wrapper notes whether this reconcile has sent a write yet (:meth:`ApiActivity.wrote`):
on SIGTERM a period that has written nothing is abandoned, one that has is finished (lifecycle.py).

Tallies are per thread: kopf runs each reconcile of a sync handler in one worker
thread, from :meth:`begin` to :meth:`take`. Nothing here imports ``kubernetes``: the answers are
classified by the error type they map to, never by their status number.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from predictive_scaler.errors import ConflictError, MissingApiError, ServerError, ThrottledError
from predictive_scaler.kube.api_errors import api_error

#: Retry kinds, the ``kind`` label of ``predictive_scaler_api_retries_total``.
RETRY_KINDS: tuple[str, ...] = ("conflict", "throttled", "server-error", "unreachable")
_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def error_kind(error: BaseException | None) -> str | None:
    """The retry kind of an API error (None: no error, or one no retry absorbs)."""
    if isinstance(error, ConflictError):
        return "conflict"
    if isinstance(error, ThrottledError):
        return "throttled"
    if isinstance(error, ServerError):
        return "server-error" if error.status else "unreachable"
    return None


def answer_kind(status: int | None) -> str | None:
    """The retry kind of an answer with HTTP ``status`` (None or 0: nothing came back)."""
    return error_kind(api_error(status, "an API call"))


def failure_kind(exc: Exception) -> str:
    """What failed a reconcile, for the ApiDegraded condition and Event: a retry kind, the missing
    API (``missing API autoscaling/v2 or autoscaling/v2beta2``), else the HTTP status."""
    if isinstance(exc, MissingApiError):
        return f"{MISSING_API} {exc.api}"
    status = getattr(exc, "status", None)
    return error_kind(exc) or (f"HTTP {status}" if status else "unreachable")


#: Prefix of the failure kind of a reconcile that needs an API the server does not serve.
MISSING_API = "missing API"


@dataclass(frozen=True)
class ApiTally:
    """Retries (by kind) made since the last :meth:`ApiActivity.take` on this thread."""

    retries: Mapping[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.retries.values())

    def __add__(self, other: ApiTally) -> ApiTally:
        return ApiTally(dict(Counter(self.retries) + Counter(other.retries)))

    def describe(self) -> str:
        """``"2 conflict, 1 throttled"`` in RETRY_KINDS order."""
        return ", ".join(f"{self.retries[k]} {k}" for k in RETRY_KINDS if self.retries.get(k))


class ApiActivity:
    def __init__(self) -> None:
        self._local = threading.local()

    def _state(self) -> tuple[Counter[str], list[str | None]]:
        if not hasattr(self._local, "retries"):
            self._local.retries = Counter()
            self._local.last = [None]
            self._local.wrote = [False]
        return self._local.retries, self._local.last

    def wrote(self) -> bool:
        """Whether this thread sent a write (POST/PUT/PATCH/DELETE) since :meth:`begin`."""
        self._state()
        return bool(self._local.wrote[0])

    def writing(self) -> None:
        self._state()
        self._local.wrote[0] = True

    def begin(self) -> None:
        """Start a fresh tally on this thread (retries of an earlier, unrelated call are dropped)."""
        retries, last = self._state()
        retries.clear()
        last[0] = None
        self._local.wrote[0] = False

    def take(self) -> ApiTally:
        """The tally so far on this thread; counting starts again from zero."""
        retries, _ = self._state()
        out = ApiTally(dict(retries))
        retries.clear()
        return out

    def answered(self, status: int | None) -> None:
        _, last = self._state()
        last[0] = answer_kind(status)

    def retried(self) -> None:
        retries, last = self._state()
        # A sleep always follows an error answer; "unreachable" if none was seen (a client-side timeout).
        retries[last[0] or "unreachable"] += 1

    def sleep(self, inner: Callable[[float], object]) -> Callable[[float], object]:
        """The retry sleep to give KubeCluster: counts the retry, then sleeps with ``inner``."""
        def sleep(seconds: float) -> object:
            self.retried()
            return inner(seconds)
        return sleep

    def wrap(self, api_client: Any) -> Any:
        """The API client to give KubeCluster: the same client, reporting each answer's status here."""
        return _ObservedApiClient(api_client, self)


class _ObservedApiClient:
    """Delegates everything to the wrapped ApiClient; notes the status of each ``call_api``."""

    def __init__(self, inner: Any, activity: ApiActivity) -> None:
        self._inner = inner
        self._activity = activity

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        method = str(args[0] if args else kwargs.get("method", "")).upper()
        if method in _WRITES:
            self._activity.writing()  # before the call: a write that timed out may still have landed
        try:
            response = self._inner.call_api(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 — noted and re-raised untouched; KubeCluster maps it
            self._activity.answered(getattr(exc, "status", None))
            raise
        self._activity.answered(getattr(response, "status", None))
        return response

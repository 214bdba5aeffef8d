"""What an answer of the API server means: its HTTP status mapped, once, to a typed error.

:func:`api_error` is the one place in the package that reads HTTP status numbers: a conflict, a
throttle, a missing object, a refused permission, a Gone resourceVersion and a server error each
become their own :class:`~predictive_scaler.errors.ClusterError` subclass (with whether a retry can
help), so every caller catches by type. The transport maps every answer and every failure with it;
the controller's API activity tally (``controller/api_activity.py``) classifies the answers it sees
with it too. Nothing here imports ``kubernetes``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from predictive_scaler.errors import (
    ClusterError,
    ConflictError,
    ForbiddenError,
    GoneError,
    NotFoundError,
    ServerError,
    ThrottledError,
    UnauthorizedError,
)

#: What to do about an answer of each kind, appended to the API server's own message.
CONFLICT_HINT = "the object changed since it was read; re-read and retry"
THROTTLED_HINT = "throttled by the API server; backing off"
SERVER_HINT = "API server error; retried with backoff"
FORBIDDEN_HINT = ("the controller's ServiceAccount lacks this permission; compare the RBAC rules with "
                  "docs/kube-api-calls.md")


def _no_body() -> bytes | None:
    return None


def api_error(
    status: int | None,
    what: str,
    *,
    body: Callable[[], bytes | None] = _no_body,
    headers: Mapping[str, str] | None = None,
    reason: str | None = None,
) -> ClusterError | None:
    """The error an answer with HTTP ``status`` means for the request ``what``; None for a success.

    ``status`` None (or 0) means nothing came back: a :class:`~predictive_scaler.errors.ServerError`
    without a status. The message is ``what`` and ``reason`` when the caller knows what went wrong
    (a watch that failed, a request the client could not send); else the status and the answer's own
    message (``body`` is read only for an error), with what to do about it. A throttle carries the
    answer's ``Retry-After`` (seconds).
    """
    if status and 200 <= status < 300:
        return None
    explained = reason is None
    detail = f"{what}: {reason}" if reason is not None else _detail(status, what, body())

    def told(hint: str) -> str:
        return f"{detail} ({hint})" if explained else detail

    if not status:
        return ServerError(detail)
    if status == 409:
        return ConflictError(told(CONFLICT_HINT), status=status)
    if status == 429:
        return ThrottledError(told(THROTTLED_HINT), status=status, retry_after=_retry_after_seconds(headers))
    if status >= 500:
        return ServerError(told(SERVER_HINT), status=status)
    if status == 401:
        return UnauthorizedError(told(FORBIDDEN_HINT), status=status)
    if status == 403:
        return ForbiddenError(told(FORBIDDEN_HINT), status=status)
    if status == 404:
        return NotFoundError(detail, status=status)
    if status == 410:
        return GoneError(detail, status=status)
    return ClusterError(detail, status=status)


def _detail(status: int | None, what: str, data: bytes | None) -> str:
    """``what: HTTP <status>: <the answer's message>`` (a Kubernetes Status object's, else the body's start)."""
    if not status:
        return f"{what}: no answer from the API server"
    message = ""
    try:
        parsed = json.loads(data or b"{}")
        if isinstance(parsed, dict):
            message = str(parsed.get("message") or "")
    except ValueError:
        message = (data or b"")[:200].decode("utf-8", "replace")
    return f"{what}: HTTP {status}" + (f": {message}" if message else "")


def _retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    value = headers.get("Retry-After") if headers else None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff

"""One error tree for the whole package.

Every error says what was wrong and what to do about it. Third-party
exceptions are mapped at the boundary (sources/, kube/, forecasting/store)
and re-raised ``from exc`` so the original cause stays in the traceback.
"""

from __future__ import annotations

from collections.abc import Iterable


class ScalerError(Exception):
    """Base of every error predictive-scaler raises on purpose."""


class ConfigError(ScalerError):
    """A setting (spec field, CLI flag, scenario key) is invalid.

    ``field`` names the offending setting so callers (CRD status, CLI) can point at it.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class DataError(ScalerError):
    """Input data (a trace, a metric series) is malformed or insufficient."""


class InsufficientHistoryError(DataError):
    """Less history than a model needs (e.g. fewer than 14 days)."""


class ModelError(ScalerError):
    """A model could not be fitted, or a model artifact is invalid or refused."""


class StoreError(ModelError):
    """The model store cannot be read or written as it stands: a full or read-only volume, missing
    permissions, or something of the wrong kind where the store keeps its own files (a file for a
    directory, a directory or a FIFO for its lock). The artifacts may be sound; the message says what
    to fix. A :class:`ModelError`, so every caller that falls back on a refused model still does."""


class SourceError(ScalerError):
    """A metrics source (Prometheus, a trace replay) failed or answered badly."""


class ClusterError(ScalerError):
    """The Kubernetes API failed or refused a request.

    ``status`` is the HTTP status of the API server's answer (None: nothing came back). The subclass
    says what it means: :func:`predictive_scaler.kube.api_errors.api_error` picks it from the status,
    the one place that reads status numbers, so the rest of the code catches by type.
    """

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


class ConflictError(ClusterError):
    """A conflict: the object changed since it was read; re-read and retry."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message, status=status, retryable=True)


class NotFoundError(ClusterError):
    """The object (or the API serving it) does not exist; never retried."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message, status=status, retryable=False)


class ForbiddenError(ClusterError):
    """The API server refused the permission (or the credentials, :class:`UnauthorizedError`): an RBAC
    or kubeconfig problem, never retried."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message, status=status, retryable=False)


class UnauthorizedError(ForbiddenError):
    """The API server did not accept the credentials at all (an expired token, a wrong kubeconfig):
    no grant of a permission would help."""


class GoneError(ClusterError):
    """Gone: the resourceVersion (a watch's or a list's continue token) is too old; re-list. Sending
    the same request again would only be Gone again, so it is not retried as it is."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message, status=status, retryable=False)


class ServerError(ClusterError):
    """The API server failed to answer (a server error, or a broken connection: ``status`` None);
    retried with backoff."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message, status=status, retryable=True)


class MissingApiError(NotFoundError):
    """The API server serves none of the versions of an API the controller needs (e.g. the
    HorizontalPodAutoscaler API). ``api`` names what is missing, for conditions and Events."""

    def __init__(self, message: str, *, api: str) -> None:
        super().__init__(message)
        self.api = api


class BudgetError(ConfigError):
    """The prewarm budget is invalid; the planner fails closed (no speculation)."""


class ThrottledError(ClusterError):
    """The API server asks the client to slow down (Too Many Requests) for ``retry_after`` seconds."""

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, status=status, retryable=True)
        self.retry_after = retry_after


class ShuttingDown(ScalerError):
    """The process is stopping (SIGTERM): the current period is abandoned before it wrote anything."""


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """``"did you mean 'x'? "`` for the choices closest to a misspelt ``word``, else ``""``."""
    import difflib

    close = difflib.get_close_matches(str(word), list(choices), n=2, cutoff=0.6)
    if not close:
        return ""
    return f"did you mean {' or '.join(repr(c) for c in close)}? "

"""Transport and retries: one JSON request to the API server, mapped errors, bounded retries.

:class:`Transport` wraps a ``kubernetes.client.ApiClient`` (in-cluster config, a kubeconfig, or a
test server via ``Configuration(host=…)``, see :mod:`predictive_scaler.kube.kubeconfig`) and speaks
raw JSON over ``ApiClient.call_api``: no per-call model deserialisation (cheap with thousands of
pods). It is the base of every resource family :class:`~predictive_scaler.kube.client.KubeCluster`
is made of.

Every answer that is not a success and every transport failure becomes a typed ``ClusterError``
(``from exc``) through :func:`~predictive_scaler.kube.api_errors.api_error`: a conflict →
``ConflictError``, a throttle → ``ThrottledError`` with Retry-After, server errors and connection
failures → ``ServerError`` (retryable), and so on. Reads and idempotent writes go through
``call_with_retry`` (:mod:`predictive_scaler.kube.retry`); read-modify-write operations re-read on a
conflict. Paginated lists and watch streams (the cluster cache's inputs) and the readiness ping live
here too.
"""

from __future__ import annotations

import functools
import json
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypedDict, TypeVar
from urllib.parse import quote

import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from predictive_scaler.clock import Clock, SystemClock
from predictive_scaler.errors import ClusterError, ForbiddenError, GoneError, ServerError
from predictive_scaler.kube.api_errors import api_error
from predictive_scaler.kube.retry import RetryPolicy, call_with_retry

T = TypeVar("T")

MERGE_PATCH = "application/merge-patch+json"
_JSON = "application/json"
#: Items per page of a paginated list (``limit``; the API server's own default cap is 500).
LIST_PAGE_SIZE = 500


class TransportOptions(TypedDict, total=False):
    """The keyword arguments of :class:`Transport` (for classes built on it that add their own)."""

    retry: RetryPolicy | None
    clock: Clock | None
    sleep: Callable[[float], object]
    rng: random.Random | None
    request_timeout: float
    dry_run: bool


class Transport:
    """Requests to one API server for one controller process.

    ``dry_run`` sends every write with ``dryRun=All``: the API server validates
    and admits it but persists nothing (the controller's ``--dry-run``).
    """

    def __init__(
        self,
        api_client: ApiClient,
        *,
        retry: RetryPolicy | None = None,
        clock: Clock | None = None,
        sleep: Callable[[float], object] = time.sleep,
        rng: random.Random | None = None,
        request_timeout: float = 10.0,
        dry_run: bool = False,
    ) -> None:
        self._api = api_client
        self._retry = retry or RetryPolicy()
        self._clock = clock or SystemClock()
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._timeout = request_timeout
        self._dry_run = dry_run
        _own_the_retries(api_client)

    def _request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = _JSON,
        write: bool = False,
        timeout: float | None = None,
    ) -> Any:
        params = list((query or {}).items())
        if write and self._dry_run:
            params.append(("dryRun", "All"))
        headers = {"Accept": _JSON}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            _, url, headers, body, _ = self._api.param_serialize(
                method=method,
                resource_path=path,
                query_params=params or None,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(
                method, url, header_params=headers, body=body,
                _request_timeout=self._timeout if timeout is None else timeout,
            )
            data = response.read()
        except ApiException as exc:
            raise _failure(exc.status, what, f"{exc.reason or 'request failed'}; check the API server "
                           "address and credentials") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _failure(None, what, f"cannot reach the API server ({type(exc).__name__}: {exc}); it "
                           "will be retried — check network policy and the API server if it persists") from exc
        error = api_error(response.status, what, body=lambda: data, headers=response.headers)
        if error is not None:
            raise error
        if not data:
            return {}
        try:
            return json.loads(data)
        except ValueError as exc:
            raise ClusterError(
                f"{what}: the API server answered {response.status} with a body that is "
                "not JSON; is the configured host really a Kubernetes API server?",
                status=response.status,
            ) from exc

    def _retrying(
        self, operation: Callable[[], T], what: str, *, retry_conflicts: bool = False
    ) -> T:
        return call_with_retry(
            operation,
            policy=self._retry,
            sleep=self._sleep,
            clock=self._clock,
            rng=self._rng,
            retry_conflicts=retry_conflicts,
            what=what,
        )

    # -- paginated lists and watch streams (used by kube/cache.py) ----------

    def list_paginated(
        self, path: str, query: Mapping[str, str] | None = None, *, what: str, page_size: int = LIST_PAGE_SIZE
    ) -> tuple[list[dict[str, Any]], str]:
        """Every item of a collection, ``page_size`` at a time (``limit``/``continue``), and the
        list's resourceVersion (where a watch starts). A continue token that expired while paging
        (Gone) restarts the list from the top, once."""
        for _attempt in range(2):
            items: list[dict[str, Any]] = []
            token: str | None = None
            try:
                while True:
                    params = {**(query or {}), "limit": str(page_size)}
                    if token:
                        params["continue"] = token
                    answer: dict[str, Any] = self._retrying(
                        functools.partial(self._request, "GET", path, what=what, query=params), what)
                    items.extend(_items(answer, what))
                    meta = answer.get("metadata") or {}
                    token = meta.get("continue") or None
                    if not token:
                        return items, str(meta.get("resourceVersion") or "")
            except GoneError:
                if token is None:
                    raise
        raise ClusterError(f"{what}: the list kept expiring while paging (Gone); it is retried")

    def watch_stream(
        self, path: str, resource_version: str, *, what: str, timeout_seconds: int = 300,
        query: Mapping[str, str] | None = None, opened: Callable[[], None] | None = None,
    ) -> Iterable[dict[str, Any]]:
        """Watch events (``{"type", "object"}``) after ``resource_version``, as the server sends them,
        until it closes the stream (``timeoutSeconds``). An ``ERROR`` event becomes the typed error of
        its code (``GoneError``: the resourceVersion is too old — re-list)."""
        params = {**(query or {}), "watch": "true", "resourceVersion": resource_version,
                  "timeoutSeconds": str(timeout_seconds), "allowWatchBookmarks": "true"}
        try:
            _, url, headers, _, _ = self._api.param_serialize(
                method="GET", resource_path=path, query_params=list(params.items()),
                header_params={"Accept": _JSON}, auth_settings=["BearerToken"])
            response = self._api.call_api("GET", url, header_params=headers,
                                          _request_timeout=(self._timeout, timeout_seconds + 30))
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise _failure(getattr(exc, "status", None), what,
                           f"cannot open the watch ({type(exc).__name__}: {exc})") from exc
        error = api_error(response.status, what, body=response.read, headers=response.headers)
        if error is not None:
            raise error
        if opened is not None:
            opened()
        raw: Any = getattr(response, "response", response)
        buffer = b""
        try:
            for chunk in raw.stream(65536, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    try:
                        event = json.loads(line)
                    except ValueError as exc:
                        raise ClusterError(f"{what}: a watch event is not JSON") from exc
                    if event.get("type") == "ERROR":
                        failed = event.get("object") or {}
                        code = failed.get("code")
                        raise _failure(code if isinstance(code, int) else None, what,
                                       f"the watch ended with an error ({failed.get('message', '')})")
                    yield event
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _failure(None, what, f"the watch broke ({type(exc).__name__}: {exc})") from exc
        finally:
            if hasattr(raw, "release_conn"):
                raw.release_conn()

    def ping(self, timeout: float) -> str | None:
        """None when the API server answers ``/version`` within ``timeout`` s, else why not. No retries."""
        try:
            self._request("GET", "/version", what="check the API server", timeout=timeout)
        except ClusterError as exc:
            if exc.status is None or isinstance(exc, (ServerError, ForbiddenError)):
                return str(exc)
            return None  # it answered: reachable, whatever it thinks of /version
        return None


# urllib3 by default re-sends a GET answered "slow down" or "unavailable" with Retry-After, sleeping in
# real time outside our bounded, clock-injected policy. Keep only quick
# connection retries (nothing reached the server) at the transport level.
TRANSPORT_RETRIES = urllib3.Retry(
    total=2,
    connect=2,
    read=0,
    status=0,
    other=0,
    redirect=0,
    respect_retry_after_header=False,
    raise_on_status=False,
    backoff_factor=0,
)


def _own_the_retries(api_client: ApiClient) -> None:
    pool = getattr(getattr(api_client, "rest_client", None), "pool_manager", None)
    if pool is not None and hasattr(pool, "connection_pool_kw"):
        pool.connection_pool_kw["retries"] = TRANSPORT_RETRIES
        pool.clear()  # pools created earlier would keep the old setting


def _items(answer: Any, what: str) -> list[dict[str, Any]]:
    items = answer.get("items") if isinstance(answer, dict) else None
    if not isinstance(items, list):
        raise ClusterError(f"{what}: the API server answered without an items list")
    return items


def _failure(status: int | None, what: str, reason: str) -> ClusterError:
    """The typed error of a request that failed with ``reason`` (and the answer's ``status``, if any)."""
    return api_error(status, what, reason=reason) or ClusterError(f"{what}: {reason}", status=status)


def path_segment(value: str) -> str:
    """``value`` quoted as one segment of a URL path (a name, a namespace)."""
    return quote(str(value), safe="")

"""Read metrics from Prometheus's HTTP API, and say plainly when the answer cannot be trusted.

The known way autoscalers go wrong on Prometheus is to read "no answer" as
"no demand": an empty result, a NaN, a frozen exporter or a partial response
turned into 0 and the workload scaled to zero. Here none of those becomes a
number: :meth:`PrometheusSource.scalar_now` returns a :class:`DemandSample`
whose value is NaN with the reason it is missing, or raises
:class:`~predictive_scaler.errors.SourceError` (the reconciler holds either way).

Which call goes through what:

- **prometheus-api-client** (``PrometheusConnect``, built on this source's
  ``requests`` session, its urllib3 retries off) for range pulls
  (``custom_query_range``: the retraining job's and ``backtest --prometheus``'s
  history). The client returns only ``data.result``, so a response hook on the
  session keeps each answer: its ``warnings`` (partial data), result type and
  Prometheus's error are read from it exactly as on the raw path. Range results
  go onto the model grid as numpy arrays, not the client's long-format
  ``MetricRangeDataFrame`` (it would be pivoted straight back). No label look-ups
  are made anywhere.
- **raw ``requests``** for instant queries (``query``/``instant``/``scalar_now``):
  the controller decides on them every period and must see ``warnings``,
  ``errorType`` and a non-JSON body as such, which the client's
  ``custom_query`` hides (it returns ``data.result`` or raises on a status).

Credentials, TLS and headers (:mod:`.prometheus_auth`: bearer token and basic auth from files,
a CA bundle, a client certificate, tenant headers, AWS SigV4, Google credentials) go the same way
on both paths: one ``requests`` auth handed to the client and to the raw calls, and the session's
``verify``/``cert``. A 401 names the credential flags, a 403 the tenant header, a certificate that
does not verify ``--prometheus-ca-file``; no credential is ever shown (:meth:`PrometheusSource.hide_secrets`).

Retries are one tenacity policy for both paths (``PrometheusRetry``: bounded attempts,
backoff 0.5·2^k s capped, at most 30 s in all on the injected clock), sleeping with
the injected ``sleep``.

Facts this relies on (measured on Prometheus 2.42):

- a range query returns at most 11,000 points per series, counted as
  ``(end - start) / step``; longer ranges are split into chunks, the next one
  starting at the previous end + step;
- an instant query returns the evaluation time, not the sample's time; the
  sample's own time comes from ``timestamp(<selector>)``, which is how
  staleness is checked (``freshness_query``);
- 400 ``bad_data`` / 422 ``execution`` are the query's fault (do not retry);
  503 ``timeout``, other 5xx, 429 and connection failures are retried.

Every value is checked as a trace's is (:func:`impossible_value`): a negative value, ±Inf or one
above :data:`MAX_PLAUSIBLE_VALUE` is refused with :class:`ImpossibleValueError`, naming the query,
the sample's time and what is wrong with it. NaN is not refused: Prometheus itself answers NaN
for 0/0 (a ratio over no requests) and for a series with too few samples in its range, so a NaN
sample is *missing*, never 0 — a gap in a history, a held decision in the controller — and the
messages about missing data say how many samples were NaN. A malformed answer (values that are not
numbers, duplicate or unordered timestamps, samples outside the asked range) is a SourceError.
"""

from __future__ import annotations

import logging
import math
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial, wraps
from types import MappingProxyType
from typing import Any, Literal, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

import numpy as np
import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from tenacity import RetryCallState, Retrying, retry_if_exception_type
from urllib3.exceptions import NameResolutionError, ReadTimeoutError
from urllib3.util.retry import Retry

from predictive_scaler.clock import Clock, SystemClock
from predictive_scaler.core.values import DemandSample
from predictive_scaler.errors import DataError, SourceError
from predictive_scaler.sources.prometheus_auth import CREDENTIAL_HINT, FLAGS, PrometheusAuth

log = logging.getLogger(__name__)

#: When an instant query is empty, look this far back once: data there hints at clock skew.
SKEW_PROBE = timedelta(minutes=15)

#: Prometheus refuses range queries of more than this many points per series.
MAX_POINTS_PER_SERIES = 11_000

#: Largest value a demand or GPU query may answer. No workload serves 10^15 requests a second or
#: holds 10^15 GPUs, and beyond 2^53 (about 9e15) a float64 no longer holds every whole number, so
#: sums and squares of such values lose their units; a larger value is a unit mix-up (bytes read
#: as requests) or a corrupt answer, and training on it would scale to the maximum for nothing.
MAX_PLAUSIBLE_VALUE = 1e15

#: A range answer with more series than this is refused before its samples are read: every caller
#: wants one number (or sums a handful), and a query that fans out into thousands of series is the
#: wrong query — reading it would only cost the memory and time to say so.
MAX_SERIES = 1_000

Combine = Literal["error", "sum"]


class PartialDataError(SourceError):
    """Prometheus answered with ``warnings``: the data may be incomplete (e.g. a remote store failed).

    ``warnings`` holds Prometheus's messages; ``samples`` what came back anyway.
    """

    def __init__(self, message: str, *, warnings: Sequence[str], samples: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.warnings = tuple(warnings)
        self.samples = tuple(samples)


class DuplicateSeriesError(SourceError):
    """A query meant to give one number returned several series."""


class ImpossibleValueError(SourceError, DataError):
    """Prometheus answered a value no demand or GPU count can have: negative, ±Inf, or above
    :data:`MAX_PLAUSIBLE_VALUE`.

    Bad data, refused as a trace's bad value is (a DataError), that came from the source (a
    SourceError): the controller's reconcile treats it as missing data and keeps running, the
    retraining job as a failed scaler, never as something to train on.
    """


class NaNAnswerError(SourceError, DataError):
    """Prometheus answered NaN (its 0/0) for so much of a history that what is left cannot be trained
    on: the query, not the history, is what to fix — refused as a failing source, never as short history."""


@dataclass(frozen=True)
class Sample:
    """One element of an instant vector (or the single value of a scalar result)."""

    labels: Mapping[str, str]
    value: float
    timestamp: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))


@dataclass(frozen=True)
class RangeSeries:
    """One series of a range query: evaluation times (epoch seconds) and values (NaN kept)."""

    labels: Mapping[str, str]
    timestamps: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))
        for name in ("timestamps", "values"):
            arr = np.array(getattr(self, name), dtype=float, copy=True)
            arr.flags.writeable = False
            object.__setattr__(self, name, arr)


@dataclass(frozen=True)
class QueryResult:
    """What a query returned, with Prometheus's warnings (non-empty means partial data)."""

    samples: tuple[Any, ...]
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class PrometheusRetry:
    """Attempts for one HTTP call: ``retries`` more after the first, waiting backoff·2^k (capped).

    No retry starts once it would end more than ``max_elapsed_seconds`` after the first
    attempt began, read on the source's injected clock (so a call never outlives a period).
    """

    retries: int = 3
    backoff_seconds: float = 0.5
    max_backoff_seconds: float = 8.0
    max_elapsed_seconds: float = 30.0

    def __post_init__(self) -> None:
        if (self.retries < 0 or self.backoff_seconds < 0 or self.max_backoff_seconds < 0
                or self.max_elapsed_seconds < 0):
            raise SourceError("retry settings must not be negative; use retries=0 to disable retries")

    def delay(self, attempt: int) -> float:
        return float(min(self.max_backoff_seconds, self.backoff_seconds * (2**attempt)))


class _Retryable(Exception):
    """Internal: a failure worth another attempt. ``summary`` says what happened ("timed out after
    2 s"), ``advice`` what to do once no attempt is left."""

    def __init__(self, summary: str, advice: str) -> None:
        super().__init__(summary)
        self.summary = summary
        self.advice = advice


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _hiding_secrets(method: _Method) -> _Method:
    """``method`` of a :class:`PrometheusSource`, its SourceErrors' messages passed through
    :meth:`PrometheusSource.hide_secrets` (they may quote what the server wrote)."""
    @wraps(method)
    def wrapper(self: PrometheusSource, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except SourceError as exc:
            exc.args = tuple(self.hide_secrets(a) if isinstance(a, str) else a for a in exc.args)
            raise

    return wrapper  # type: ignore[return-value]


@dataclass
class PrometheusSource:
    """A Prometheus HTTP API endpoint (``url`` like ``http://prometheus:9090``).

    ``timeout`` bounds one HTTP call and is also sent as the query's server-side
    timeout; ``retries``/``backoff_seconds`` decide how often a connection
    error, timeout, 429 or 5xx is retried; ``sleep`` and ``clock`` are injected
    so tests neither wait nor depend on the wall clock.
    """

    url: str
    timeout: float = 10.0
    retries: int = 3
    backoff_seconds: float = 0.5
    max_points_per_series: int = MAX_POINTS_PER_SERIES
    headers: Mapping[str, str] = field(default_factory=dict)
    clock: Clock = field(default_factory=SystemClock)
    sleep: Callable[[float], None] = time.sleep
    session: requests.Session = field(default_factory=requests.Session)
    #: No retry starts that would end later than this after the first attempt (on ``clock``).
    retry_budget_seconds: float = 30.0
    #: What the user sets the timeout with (a command's ``--timeout``), named when a call times out.
    timeout_setting: str = "the Prometheus timeout"
    #: Credentials, CA and client certificate, custom headers (:mod:`.prometheus_auth`); None: none.
    auth: PrometheusAuth | None = None

    def __post_init__(self) -> None:
        _check_url(self.url)
        self.url = self.url.rstrip("/")
        #: The URL as every message shows it: credentials in it never printed.
        self.shown = redact_url(self.url)
        self._secrets = _secrets_of(self.url)
        auth = self.auth or PrometheusAuth()
        # One set of request settings for both paths: prometheus-api-client passes the session's
        # verify and cert and its own auth to every call; the raw path passes the same explicitly
        # (an explicit verify also keeps $REQUESTS_CA_BUNDLE from replacing the CA given here).
        self._auth = auth.requests_auth()
        self._verify = auth.verify
        self._cert = auth.cert
        self.session.verify = self._verify
        self.session.cert = self._cert
        if not (self.timeout > 0 and math.isfinite(self.timeout)):
            raise SourceError(f"{self.timeout_setting} must be a positive number of seconds, got {self.timeout!r}; "
                              "e.g. 30")
        if not 2 <= self.max_points_per_series <= MAX_POINTS_PER_SERIES:
            raise SourceError(f"max_points_per_series must be in 2..{MAX_POINTS_PER_SERIES}, "
                              f"got {self.max_points_per_series}")
        self._retry = PrometheusRetry(retries=self.retries, backoff_seconds=self.backoff_seconds,
                                  max_elapsed_seconds=self.retry_budget_seconds)
        #: HTTP calls made (attempts included) — for tests and benchmarks.
        self.requests_made = 0
        self._clients: dict[float, PrometheusConnect] = {}
        if _refuse_redirect not in self.session.hooks["response"]:
            # First: a redirect is refused before requests follows it (hooks run on each answer first).
            self.session.hooks["response"].insert(0, _refuse_redirect)
        if _keep_response not in self.session.hooks["response"]:
            self.session.hooks["response"].append(_keep_response)

    def hide_secrets(self, text: str) -> str:
        """``text`` with the URL's user and password replaced by ``***``: for text a server wrote, which
        may echo them back (an error quoting the request, a redirect's Location)."""
        for secret in (*self._secrets, *(self._auth.secrets() if self._auth is not None else ())):
            text = text.replace(secret, "***")
        return text

    # -- connection check -------------------------------------------------------------------------
    def client(self, timeout: float | None = None) -> PrometheusConnect:
        """prometheus-api-client on this source's session and headers, with its urllib3 retries off
        (our retry policy owns retries: bounded attempts, injected sleep)."""
        timeout = self.timeout if timeout is None else timeout
        client = self._clients.get(timeout)
        if client is None:
            # read=False: a read timeout is raised as itself, so requests reports a ReadTimeout
            # (with read unset, urllib3 wraps it in MaxRetryError and requests calls that a
            # ConnectionError: a slow Prometheus would read as one that cannot be reached).
            client = PrometheusConnect(url=self.url, headers=dict(self.headers) or None, session=self.session,
                                       retry=Retry(total=0, read=False, raise_on_status=False),
                                       auth=self._auth, timeout=timeout)  # type: ignore[arg-type]
            self._clients[timeout] = client
        return client

    def check_connection(self, timeout: float) -> str | None:
        """None when Prometheus answers a query within ``timeout`` s, else why not (one try; /readyz's probe).

        It asks the query API, not the root page: Prometheus answers ``/`` with a redirect to its UI,
        and no redirect is followed."""
        problem = self._check_connection(timeout)
        return None if problem is None else self.hide_secrets(problem)

    def _check_connection(self, timeout: float) -> str | None:
        try:
            resp = self.session.get(f"{self.url}/api/v1/query", params={"query": "1"},
                                    headers=dict(self.headers), timeout=timeout, auth=self._auth,
                                    verify=self._verify, cert=self._cert)
        except requests.RequestException as exc:
            failure = _transport_error(exc, self.shown, timeout, self.timeout_setting)
            what = failure.summary if isinstance(failure, _Retryable) else type(exc).__name__
            return f"Prometheus at {self.shown} unreachable ({what})"
        except SourceError as exc:
            return str(exc)
        if resp.ok:
            return None
        verdict = _status_verdict(resp.status_code)
        if verdict in ("credentials", "permission"):
            return f"Prometheus at {self.shown} {_REFUSALS[verdict].format(status=resp.status_code, base=self.shown)}"
        return f"Prometheus at {self.shown} answered with an error status"

    # -- queries --------------------------------------------------------------------------------
    @_hiding_secrets
    def query(self, query: str, at: datetime | None = None) -> QueryResult:
        """Instant query at ``at`` (default: the clock's now); warnings are returned, not raised."""
        at = self.clock.now() if at is None else at
        data, warns = self._get("query", {"query": query, "time": _epoch(at)}, query)
        result_type = data.get("resultType")
        result = data.get("result")
        if result_type == "vector":
            samples = tuple(_instant_sample(item, query) for item in _as_list(result, query))
        elif result_type == "scalar":
            samples = (_sample_from_pair({}, result, query),)
        else:
            raise SourceError(f"query {query!r} returned a {result_type!r}, not a number or an instant "
                              "vector; write a query that yields numbers, e.g. sum(rate(x[5m]))")
        return QueryResult(samples=samples, warnings=warns)

    def instant(self, query: str, at: datetime | None = None, *, allow_partial: bool = False) -> list[Sample]:
        """Instant vector at ``at``; raises :class:`PartialDataError` on warnings unless ``allow_partial``."""
        res = self.query(query, at)
        _check_partial(res, query, allow_partial)
        return list(res.samples)

    @_hiding_secrets
    def range(self, query: str, start: datetime, end: datetime, step: timedelta | int,
              *, allow_partial: bool = False) -> list[RangeSeries]:
        """Range query over [start, end], split into chunks of at most ``max_points_per_series`` points.

        Series are merged across chunks by label set, in order of first appearance. Each chunk is one
        ``custom_query_range`` of prometheus-api-client, which sends start and end in whole seconds.
        Values are demand or GPU figures: an impossible one raises :class:`ImpossibleValueError`
        (NaN stays, as missing); a malformed answer raises SourceError (see the module doc).
        """
        step_s = _step_seconds(step)
        t0, t1 = _epoch(start), _epoch(end)
        if t1 < t0:
            raise SourceError(f"range query {query!r}: end {end} is before start {start}; swap them")
        span = (self.max_points_per_series - 1) * step_s
        merged: dict[tuple[tuple[str, str], ...], tuple[list[np.ndarray], list[np.ndarray]]] = {}
        labels_of: dict[tuple[tuple[str, str], ...], Mapping[str, str]] = {}
        warns: list[str] = []
        chunk_start = t0
        while chunk_start <= t1:
            chunk_end = min(t1, chunk_start + span)
            data, w = self._attempts("query_range", query,
                                     partial(self._range_once, query, chunk_start, chunk_end, step_s))
            warns.extend(w)
            if data.get("resultType") != "matrix":
                raise SourceError(f"range query {query!r} returned a {data.get('resultType')!r}, not a "
                                  "matrix; write a query that yields an instant vector")
            result = _as_list(data.get("result"), query)
            if len(result) > MAX_SERIES:
                raise DuplicateSeriesError(
                    f"range query {query!r} returned {len(result)} series (more than {MAX_SERIES}, refused before "
                    "reading them); a demand query yields one number: aggregate them in the query with sum(…)")
            in_chunk: set[tuple[tuple[str, str], ...]] = set()
            for item in result:
                labels, ts, vals = _range_item(item, query, chunk_start, chunk_end)
                key = tuple(sorted(labels.items()))
                if key in in_chunk:
                    raise SourceError(f"Prometheus answered {query!r} with the series {_format_labels(labels)} twice "
                                      f"in one answer (duplicate timestamps), {_NOT_PROMETHEUS}")
                in_chunk.add(key)
                labels_of.setdefault(key, labels)
                parts = merged.setdefault(key, ([], []))
                parts[0].append(ts)
                parts[1].append(vals)
            chunk_start = chunk_end + step_s
        series = [RangeSeries(labels=labels_of[k], timestamps=np.concatenate(t), values=np.concatenate(v))
                  for k, (t, v) in merged.items()]
        for one in series:
            _check_order(one.timestamps, query)
        _check_partial(QueryResult(tuple(series), tuple(dict.fromkeys(warns))), query, allow_partial)
        return series

    @_hiding_secrets
    def scalar_now(
        self,
        query: str,
        now: datetime | None,
        max_age: timedelta,
        *,
        freshness_query: str | None = None,
        combine: Combine = "error",
    ) -> DemandSample:
        """One number for ``now`` (None: the clock's now), or a DemandSample marked missing — never 0 for no data.

        - no series → missing ("no data"); NaN → missing (Prometheus's 0/0); a negative value, ±Inf or
          one above :data:`MAX_PLAUSIBLE_VALUE` → missing, with the reason it is refused (the
          controller must keep running, and must not act on it);
        - several series → :class:`DuplicateSeriesError` (aggregate in PromQL with ``sum(…)`` or
          ``sum by (…)``), unless ``combine="sum"`` asks for their sum; a NaN in any series
          makes the sum missing, since a partial sum would read as a drop in demand;
        - ``warnings`` in the response → :class:`PartialDataError` (a SourceError);
        - ``freshness_query`` (e.g. ``min(timestamp(DCGM_FI_DEV_GPU_UTIL{…}))``) gives the
          age of the oldest sample behind the value; older than ``max_age`` → missing
          (stale, e.g. a frozen exporter). Without it, staleness is only what Prometheus
          enforces itself (5-minute lookback) and ``observed_at`` is ``now``.
        """
        if max_age <= timedelta(0):
            raise SourceError(f"max_age must be positive, got {max_age}; e.g. 2 minutes")
        now = self.clock.now() if now is None else now
        res = self.query(query, now)
        _check_partial(res, query, allow_partial=False)
        samples: tuple[Sample, ...] = res.samples
        if not samples:
            return DemandSample.absent(self._no_series_reason(query, now))
        if len(samples) > 1 and combine != "sum":
            shown = "; ".join(_format_labels(s.labels) for s in samples[:4])
            raise DuplicateSeriesError(
                f"query {query!r} returned {len(samples)} series ({shown}) where one number was "
                "expected; aggregate them in the query with sum(…) or sum by (…), or ask for their sum")
        values = [s.value for s in samples]
        at = iso_utc(_epoch(now))
        for v in values:
            problem = impossible_value(v)
            if problem is not None:
                return DemandSample.absent(
                    f"query {query!r} returned an impossible value at {at}: {problem}; refused and treated as "
                    "missing data (nothing is scaled on it) — fix the query or the exporter")
        if any(math.isnan(v) for v in values):
            return DemandSample.absent(
                f"query {query!r} returned NaN at {at}: Prometheus's answer for 0/0 (a ratio over no "
                "requests) or a rate over fewer than two samples; NaN is missing data, never 0 — check "
                "that the scrape target is up and that the range (e.g. [2m]) covers at least two scrapes")
        value = float(sum(values))
        observed_at = _utc(now)
        if freshness_query is not None:
            fresh = self.query(freshness_query, now)
            _check_partial(fresh, freshness_query, allow_partial=False)
            stamps = [s.value for s in fresh.samples if math.isfinite(s.value)]
            if not stamps:
                return DemandSample.absent(
                    f"freshness query {freshness_query!r} returned no sample time at {now.isoformat()}")
            if not _plausible_time(min(stamps)):
                return DemandSample.absent(
                    f"freshness query {freshness_query!r} returned {min(stamps):g}, not a sample time (seconds "
                    "since 1970); it must yield timestamp(…) of the demand's series — fix the query")
            observed_at = datetime.fromtimestamp(min(stamps), UTC)
        age = _utc(now) - observed_at
        if age > max_age:
            return DemandSample.absent(
                f"query {query!r}: newest data is {age.total_seconds():.0f}s old (> {max_age.total_seconds():.0f}s); "
                "the exporter or scrape may be stuck — check its targets page", observed_at=observed_at)
        return DemandSample(value=value, observed_at=observed_at)

    def _no_series_reason(self, query: str, now: datetime) -> str:
        """Why ``query`` is empty at ``now``; names possible clock skew when it had data a little earlier.

        One extra query, and only when the demand is missing anyway: a clock running ahead of
        Prometheus's asks for a time that has no samples yet, which reads like a dead series.
        """
        reason = f"query {query!r} returned no series at {now.isoformat()}"
        earlier = now - SKEW_PROBE
        try:
            probe = self.query(query, earlier)
        except SourceError:
            probe = None
        if probe is not None and any(math.isfinite(s.value) for s in probe.samples):
            minutes = SKEW_PROBE.total_seconds() / 60
            return (f"{reason}, but it has data at {earlier.isoformat()}: possible clock skew (this "
                    "controller's clock ahead of Prometheus's — compare both hosts' NTP time), or the series "
                    f"stopped within the last {minutes:g} minutes — check the scrape target")
        return f"{reason}; check the query and that its scrape target is up"

    # -- HTTP -----------------------------------------------------------------------------------
    def _get(self, endpoint: str, params: dict[str, Any], query: str) -> tuple[dict[str, Any], tuple[str, ...]]:
        url = f"{self.url}/api/v1/{endpoint}"
        params = {**params, "timeout": f"{self.timeout:g}s"}
        return self._attempts(endpoint, query, lambda: self._get_once(url, params, query))

    def _attempts(self, endpoint: str, query: str, attempt: Callable[[], _Answer]) -> _Answer:
        """``attempt`` under the retry policy: a tenacity ``Retrying`` that sleeps with the injected ``sleep``."""
        tries = self._retry.retries + 1
        started = self.clock.now()

        def stop(state: RetryCallState) -> bool:
            # tenacity computes the wait first, so the coming sleep counts against the bound.
            elapsed = (self.clock.now() - started).total_seconds()
            return state.attempt_number >= tries or elapsed + state.upcoming_sleep > self._retry.max_elapsed_seconds

        def note(state: RetryCallState) -> None:
            log.warning("prometheus %s attempt %d/%d failed: %s", endpoint, state.attempt_number, tries,
                        state.outcome.exception() if state.outcome else "?")

        def give_up(state: RetryCallState) -> _Answer:
            last = state.outcome.exception() if state.outcome else None
            summary, advice = ((last.summary, last.advice) if isinstance(last, _Retryable) else
                               (str(last), "check that it is up and reachable (its /-/ready endpoint)"))
            raise SourceError(
                f"Prometheus at {self.shown}: {summary} — {state.attempt_number} attempt(s) failed for "
                f"{query!r}; {advice}") from (last.__cause__ or last) if last else None

        def pause(seconds: float) -> None:
            self.sleep(seconds)

        retrying = Retrying(sleep=pause, stop=stop,
                            wait=lambda state: self._retry.delay(state.attempt_number - 1),
                            retry=retry_if_exception_type(_Retryable), after=note, retry_error_callback=give_up)
        return retrying(attempt)

    def _get_once(self, url: str, params: dict[str, Any], query: str) -> _Answer:
        """One raw GET: the instant queries the controller decides on, whose ``warnings`` must be read."""
        self.requests_made += 1
        try:
            resp = self.session.get(url, params=params, headers=dict(self.headers), timeout=self.timeout,
                                    auth=self._auth, verify=self._verify, cert=self._cert)
        except requests.RequestException as exc:
            raise _transport_error(exc, self.shown, self.timeout, self.timeout_setting) from exc
        return self._answer(resp, query)

    def _range_once(self, query: str, start: float, end: float, step_s: int) -> _Answer:
        """One range chunk through prometheus-api-client's ``custom_query_range``.

        The client returns only ``data.result``; this session's response hook keeps the
        response itself, so ``warnings`` (partial data), the result type and Prometheus's
        own error answer are read from it exactly as on the raw path.
        """
        self.requests_made += 1
        _CAPTURE.responses = []
        try:
            result = self.client().custom_query_range(
                query, start_time=datetime.fromtimestamp(start, UTC), end_time=datetime.fromtimestamp(end, UTC),
                step=str(step_s), params={"timeout": f"{self.timeout:g}s"})
        except (requests.Timeout, requests.ConnectionError) as exc:
            raise _transport_error(exc, self.shown, self.timeout, self.timeout_setting) from exc
        except (PrometheusApiClientException, ValueError, KeyError, TypeError) as exc:  # incl. a JSON decode error
            answered = _CAPTURE.responses[-1] if _CAPTURE.responses else None
            if answered is not None:
                self._answer(answered, query)  # raises what the raw path raises for this answer
            if isinstance(exc, requests.RequestException):  # e.g. InvalidURL, also a ValueError
                raise _transport_error(exc, self.shown, self.timeout, self.timeout_setting) from exc
            # The exception's text may quote the server's body: shown escaped and cut short.
            raise SourceError(f"Prometheus answered {query!r} badly ({_quoted(str(exc))}); is {self.shown} "
                              "Prometheus?") from exc
        except requests.RequestException as exc:
            raise _transport_error(exc, self.shown, self.timeout, self.timeout_setting) from exc
        finally:
            responses, _CAPTURE.responses = _CAPTURE.responses, None
        data, warns = self._answer(responses[-1], query)
        return {**data, "result": result}, warns

    def _answer(self, resp: requests.Response, query: str) -> _Answer:
        """Prometheus's JSON answer as (data, warnings), or the error it means.

        Text the server wrote (its error, its warnings, its body) is shown escaped and cut short:
        whatever answers at the URL must not write control characters or pages into our messages."""
        url = redact_url(resp.url.split("?", 1)[0])
        body = _json_body(resp)
        status = resp.status_code
        verdict = _status_verdict(status)
        if verdict == "retry":
            reason = (body or {}).get("error") or resp.reason
            raise _Retryable(f"answered HTTP {status} ({_escaped(str(reason), 80)})",
                             "it is throttling (429) or failing (5xx): check its logs and its /-/ready endpoint, "
                             "then run again")
        if verdict not in ("ok", "refused"):
            raise SourceError(f"{url} {_REFUSALS[verdict].format(status=status, base=self.shown)}")
        if body is None:
            page = _looks_like_html(resp)
            raise SourceError(
                f"{url} answered HTTP {status} with {'an HTML page' if page else 'a body that is not Prometheus JSON'} "
                f"({_quoted(resp.text, 120)}); check that the URL points at Prometheus's own address, not "
                f"{'a login page, Grafana or another UI' if page else 'a proxy or another service'}")
        if body.get("status") not in ("success", "error"):
            raise SourceError(f"{url} answered with status {_quoted(str(body.get('status')), 40)}, neither "
                              f"'success' nor 'error'; is {self.shown} Prometheus?")
        if verdict == "refused" or body.get("status") != "success":
            kind = _escaped(str(body.get("errorType", f"HTTP {status}")), 40)
            error = _escaped(str(body.get("error", resp.reason)), 300)
            raise SourceError(f"Prometheus refused {query!r}: {kind}: {error}; fix the query (try it in the "
                              "Prometheus UI)")
        data = body.get("data")
        if not isinstance(data, dict):
            raise SourceError(f"Prometheus answered {query!r} without a data object; is {self.shown} Prometheus?")
        warns = body.get("warnings") or []
        if not isinstance(warns, list):
            raise SourceError(f"Prometheus answered {query!r} with warnings that are not a list; is {self.shown} "
                              "Prometheus?")
        return data, tuple(_escaped(str(w), 200) for w in warns[:5]) + (
            (f"… and {len(warns) - 5} more warning(s)",) if len(warns) > 5 else ())


_Answer = tuple[dict[str, Any], tuple[str, ...]]


Verdict = Literal["ok", "retry", "refused", "redirect", "credentials", "permission", "no-api"]


def _status_verdict(status: int) -> Verdict:
    """What the HTTP status of a Prometheus answer says on its own, the one place that reads it:
    ``retry`` (throttled, or a server error: it may work later); ``redirect`` (one without a
    Location; those with one are refused by :func:`_refuse_redirect` before this); ``credentials``
    (401: who is asking is not accepted); ``permission`` (403: accepted, not allowed); ``no-api``
    (404: no Prometheus API at that path — Prometheus answers a bad query with 400/422, never 404);
    ``refused`` (any other answer but OK: the query's fault, the body says why); ``ok``."""
    if status == 429 or status >= 500:
        return "retry"
    if 300 <= status < 400:
        return "redirect"
    by_status: dict[int, Verdict] = {200: "ok", 401: "credentials", 403: "permission", 404: "no-api"}
    return by_status.get(status, "refused")


#: What each refusing verdict tells the user (``{status}``, ``{base}``: the URL, credentials hidden).
_REFUSALS: dict[str, str] = {
    "redirect": ("answered a redirect (HTTP {status}) without a Location; redirects are never followed: use "
                 "the address Prometheus answers at directly"),
    "credentials": ("refused the credentials (HTTP {status} Unauthorized): a proxy or Prometheus in front "
                    "asks for credentials; give them with " + CREDENTIAL_HINT.replace("{", "{{").replace("}", "}}")
                    + ", or put the user and password in the URL (http://user:password@host:9090); if some are "
                    "given, check that they are current"),
    "permission": ("denied permission (HTTP {status} Forbidden): the credentials were accepted but may not "
                   "query Prometheus (or this tenant); grant them read access to Prometheus's query API, check "
                   f"the tenant header ({FLAGS['headers']} X-Scope-OrgID=TENANT), or use other credentials"),
    "no-api": ("does not exist (HTTP {status} Not Found): no Prometheus query API at that path; give "
               "Prometheus's base URL — with its path prefix if it is served under one (--web.route-prefix, "
               "e.g. {base}/prometheus)"),
}


class _Capture(threading.local):
    responses: list[requests.Response] | None = None


#: Responses seen by the session hook while a client call runs on this thread.
_CAPTURE = _Capture()


def _keep_response(resp: requests.Response, *args: Any, **kwargs: Any) -> requests.Response:
    if _CAPTURE.responses is not None:
        _CAPTURE.responses.append(resp)
        # The client decodes the body for ``data.result`` and _answer again for warnings: decode once.
        resp.json = _decoded_once(resp.json)  # type: ignore[method-assign]
    return resp


def _decoded_once(decode: Callable[..., Any]) -> Callable[..., Any]:
    kept: list[Any] = []

    def json(**kwargs: Any) -> Any:
        if not kept:
            kept.append(decode(**kwargs))
        return kept[0]

    return json


def redact_url(url: str) -> str:
    """``url`` with any password (and user) in it replaced by ``***``: the form every message,
    log line and report shows (``http://user:secret@host`` -> ``http://***@host``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<a URL that cannot be parsed>"
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def _refuse_redirect(resp: requests.Response, *args: Any, **kwargs: Any) -> requests.Response:
    """Refuse every redirect Prometheus (or what answers in its place) sends.

    Following one could send the query, and any credentials or headers, to another scheme, host or
    port, and train and promote a model on that host's data; none is followed, not even to the same
    host (point the URL at the final address instead)."""
    if resp.is_redirect:
        target = redact_url(resp.headers.get("Location", "?"))[:200]
        raise SourceError(
            f"{redact_url(resp.url.split('?', 1)[0])} answered a redirect (HTTP {resp.status_code}) to "
            f"{target!r}; redirects are never followed (they could send queries and credentials to "
            "another host): use the address Prometheus answers at directly")
    return resp


def _transport_error(exc: requests.RequestException, shown: str, timeout: float, setting: str) -> Exception:
    """What a failed request means, by the types of the exception and its causes (never its text,
    which may hold the URL with its credentials): a :class:`_Retryable` for a timeout or a failed
    connection, a SourceError otherwise."""
    causes = list(_causes(exc))
    if isinstance(exc, requests.exceptions.SSLError):
        if any(isinstance(c, ssl.SSLCertVerificationError) for c in causes):
            return SourceError(f"TLS with Prometheus at {shown} failed: its certificate could not be verified "
                               f"(certificate verify failed); give the CA bundle that signed it with "
                               f"{FLAGS['ca_file']} FILE (PREDICTIVE_SCALER_PROMETHEUS_CA_FILE)")
        return SourceError(f"TLS with Prometheus at {shown} failed ({type(causes[-1]).__name__}): if it serves plain "
                           "HTTP, give an http:// URL; if it asks for a client certificate (mTLS), give "
                           f"{FLAGS['cert_file']} and {FLAGS['key_file']}; else check its certificate")
    if any(isinstance(c, NameResolutionError | socket.gaierror) for c in causes):
        host = urlsplit(shown).hostname or "?"
        return _Retryable(f"cannot connect (the host name {host!r} does not resolve)",
                          "check the host name in the URL (in a cluster: <service>.<namespace>.svc) and this "
                          "machine's DNS")
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        return _Retryable("cannot connect (connection refused)",
                          "check the host and port in the URL and that Prometheus is running there (its /-/ready "
                          "endpoint)")
    if isinstance(exc, requests.ReadTimeout) or any(isinstance(c, ReadTimeoutError) for c in causes):
        return _Retryable(f"timed out after {timeout:g} s",
                          f"it took the connection but sent no answer in time: raise {setting} (now {timeout:g} s) "
                          "if it is only slow, or check its load and the query's cost (try it in the Prometheus UI)")
    if isinstance(exc, requests.Timeout):  # ConnectTimeout: nothing answered the connection itself
        return _Retryable(f"cannot connect (no answer to the connection within {timeout:g} s)",
                          "check the host and port in the URL and any firewall or network policy between here "
                          f"and Prometheus; raise {setting} (now {timeout:g} s) if the network is that slow")
    if isinstance(exc, requests.ConnectionError):
        return _Retryable(f"cannot connect ({type(causes[-1]).__name__})",
                          "check that the URL points at Prometheus and that nothing between here and it closes "
                          "the connection")
    return SourceError(f"a request to Prometheus at {shown} failed ({type(exc).__name__}); check the Prometheus URL")


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps (causes, contexts, urllib3's ``reason``, exceptions in ``args``),
    outermost first; the innermost is last."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        one = todo.pop(0)
        if id(one) in seen:
            continue
        seen.add(id(one))
        yield one
        inner = (one.__cause__, one.__context__, getattr(one, "reason", None), *one.args)
        todo.extend(e for e in inner if isinstance(e, BaseException))


def _check_url(url: str) -> None:
    """Refuse a Prometheus URL requests would fail on later, with a message showing it without credentials
    (requests' own errors quote the whole URL, password included)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError when the port is not a number in 0..65535
    except ValueError:
        raise SourceError(f"Prometheus URL {redact_url(url)!r} cannot be parsed (check the host and the port); "
                          "give e.g. http://prometheus-operated.monitoring:9090") from None
    bare = redact_url(urlunsplit(parts._replace(query="", fragment="")))
    if parts.scheme not in ("http", "https"):
        raise SourceError(f"Prometheus URL {bare!r} must start with http:// or https://, "
                          "e.g. http://prometheus-operated.monitoring:9090")
    if not parts.hostname:
        raise SourceError(f"Prometheus URL {bare!r} has no host; give e.g. http://prometheus-operated.monitoring:9090")
    if parts.query or parts.fragment:
        # Shown without them: a query string is where a careless URL carries a token.
        raise SourceError(f"Prometheus URL {bare!r} has a query string or fragment ('?…' or '#…'); give "
                          "Prometheus's base URL only, with credentials as http://user:password@host if needed")
    if parts.path.rstrip("/").endswith("/api/v1"):
        raise SourceError(f"Prometheus URL {bare!r} ends in /api/v1; give Prometheus's base URL (without "
                          "/api/v1: the API path is added to it)")


def _secrets_of(url: str) -> tuple[str, ...]:
    """The user and password in ``url``, as written and decoded, longest first. One shorter than 3
    characters is left out: replacing it everywhere would garble every message, and it is never
    printed from here (:func:`redact_url`), only if a server echoes it."""
    parts = urlsplit(url)
    found = {text for raw in (parts.username, parts.password) if raw for text in (raw, unquote(raw))}
    return tuple(sorted((t for t in found if len(t) >= 3), key=len, reverse=True))


def _quoted(text: str, limit: int = 200) -> str:
    """``text`` as a quoted, escaped literal of at most ``limit`` characters: text a server wrote, shown
    in a message without its control characters (no terminal escapes, no forged log lines)."""
    cut = text[:limit]
    more = f" … ({len(text) - limit} more characters)" if len(text) > limit else ""
    return repr(cut) + more


def _escaped(text: str, limit: int = 200) -> str:
    """:func:`_quoted` without the quotes, for text that reads as part of a sentence (an error)."""
    cut = text[:limit]
    more = f" … ({len(text) - limit} more characters)" if len(text) > limit else ""
    return repr(cut)[1:-1] + more


def _looks_like_html(resp: requests.Response) -> bool:
    kind = resp.headers.get("Content-Type", "").lower()
    return "html" in kind or resp.text.lstrip()[:1] == "<"


def iso_utc(epoch: float) -> str:
    """``2026-01-05T00:01:00Z``: a sample's time as messages show it."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def impossible_value(value: float, raw: object = None) -> str | None:
    """Why ``value`` cannot be a demand or GPU figure (negative, ±Inf, above
    :data:`MAX_PLAUSIBLE_VALUE`), or None when it can be (NaN can: it is missing). ``raw`` is the
    text Prometheus wrote, named when it overflowed a float."""
    if math.isnan(value):
        return None
    if value == math.inf:
        if isinstance(raw, str) and raw.strip().lstrip("+").lower() not in ("inf", "infinity"):
            return f"{raw[:40]!r}, a number too large for a float (read as +Inf)"
        return "+Inf (a division by zero in the query, x / 0)"
    if value == -math.inf:
        return "-Inf (a negative number divided by zero in the query)"
    if value < 0:
        return (f"{value:g}, a negative value (demand and GPU counts are never below 0: a counter read without "
                "rate(), a subtraction in the query, or a broken exporter)")
    if value > MAX_PLAUSIBLE_VALUE:
        return (f"{value:g}, above {MAX_PLAUSIBLE_VALUE:g}, more than any workload's demand (a unit mix-up, "
                "e.g. bytes read as requests, or a corrupt exporter)")
    return None


def _plausible_time(epoch: float) -> bool:
    """A sample time (epoch seconds) a datetime can hold: 1970 to the year 9999."""
    return math.isfinite(epoch) and 0 <= epoch <= 253_402_300_799


# -- helpers ------------------------------------------------------------------------------------
def _json_body(resp: requests.Response) -> dict[str, Any] | None:
    try:
        body = resp.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _check_partial(res: QueryResult, query: str, allow_partial: bool) -> None:
    if res.warnings and not allow_partial:
        raise PartialDataError(
            f"Prometheus answered {query!r} with warnings, so the data may be partial: "
            f"{'; '.join(res.warnings)}; fix the failing store or pass allow_partial=True to accept it",
            warnings=res.warnings, samples=res.samples)
    if res.warnings:
        log.warning("partial data for %r: %s", query, "; ".join(res.warnings))


def _as_list(result: Any, query: str) -> list[Any]:
    if not isinstance(result, list):
        raise SourceError(f"Prometheus answered {query!r} with a malformed result; is this Prometheus?")
    return result


_NOT_PROMETHEUS = "which no Prometheus writes; check that the URL points at Prometheus itself, not a proxy or another API"


def _parse_value(raw: Any, query: str) -> float:
    # Prometheus writes values as strings ("1.5", "NaN", "+Inf"); a JSON number is read too, but not
    # true/false or null, which float() and numpy would read as 1, 0 and NaN.
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise SourceError(f"Prometheus answered {query!r} with a non-numeric value {_quoted(repr(raw), 60)}, "
                          f"{_NOT_PROMETHEUS}")
    try:
        return float(raw)  # Prometheus writes "NaN", "+Inf", "-Inf" — float() reads them all
    except ValueError as exc:
        raise SourceError(f"Prometheus answered {query!r} with a non-numeric value {_quoted(str(raw), 60)}, "
                          f"{_NOT_PROMETHEUS}") from exc


def _parse_time(raw: Any, query: str) -> float:
    epoch = _parse_value(raw, query)
    if not _plausible_time(epoch):
        raise SourceError(f"Prometheus answered {query!r} with a sample time {_quoted(str(raw), 40)}, not a time "
                          f"between 1970 and 9999, {_NOT_PROMETHEUS}")
    return epoch


def _labels(item: dict[str, Any], query: str) -> dict[str, str]:
    metric = item.get("metric") or {}
    if not isinstance(metric, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
        raise SourceError(f"Prometheus answered {query!r} with labels that are not names and strings, "
                          f"{_NOT_PROMETHEUS}")
    return metric


def _sample_from_pair(labels: Mapping[str, str], pair: Any, query: str) -> Sample:
    if not isinstance(pair, list | tuple) or len(pair) != 2:
        raise SourceError(f"Prometheus answered {query!r} with a malformed sample {_quoted(repr(pair), 80)} "
                          f"(expected [time, \"value\"]), {_NOT_PROMETHEUS}")
    ts = datetime.fromtimestamp(_parse_time(pair[0], query), UTC)
    return Sample(labels=labels, value=_parse_value(pair[1], query), timestamp=ts)


def _instant_sample(item: Any, query: str) -> Sample:
    if not isinstance(item, dict) or "value" not in item:
        raise SourceError(f"Prometheus answered {query!r} with a malformed vector element "
                          "(native histograms are not supported; query a float series)")
    return _sample_from_pair(_labels(item, query), item["value"], query)


def _range_item(item: Any, query: str, first: float, last: float) -> tuple[dict[str, str], np.ndarray, np.ndarray]:
    """One series of a range answer for [first, last] (epoch s): its labels, times and values, each checked."""
    if not isinstance(item, dict) or not isinstance(item.get("values"), list):
        raise SourceError(f"Prometheus answered {query!r} with a malformed matrix element "
                          "(native histograms are not supported; query a float series)")
    labels = _labels(item, query)
    pairs = item["values"]
    if not all(type(p) is list and len(p) == 2 for p in pairs):
        bad = next(p for p in pairs if type(p) is not list or len(p) != 2)
        raise SourceError(f"Prometheus answered {query!r} with a malformed sample {_quoted(repr(bad), 80)} "
                          f"(expected [time, \"value\"]), {_NOT_PROMETHEUS}")
    raw_ts = [p[0] for p in pairs]
    raw_vals = [p[1] for p in pairs]
    # One conversion per column once every element is a number or a string (numpy would read
    # true as 1 and null as NaN); the slow path finds the bad element and names it.
    if not all(type(t) in (int, float) for t in raw_ts) or not all(type(v) is str for v in raw_vals):
        for t, v in zip(raw_ts, raw_vals, strict=True):
            _parse_time(t, query)
            _parse_value(v, query)
    try:
        ts = np.array(raw_ts, dtype=float)
        vals = np.array(raw_vals, dtype=float)
    except (TypeError, ValueError):
        for v in raw_vals:  # numpy reads strings float() reads, but say which one it did not
            _parse_value(v, query)
        raise SourceError(f"Prometheus answered {query!r} with a matrix numpy cannot read, {_NOT_PROMETHEUS}") from None
    if not np.isfinite(ts).all():
        _parse_time(raw_ts[int(np.argmin(np.isfinite(ts)))], query)  # raises, naming it
    # prometheus-api-client sends start and end in whole seconds: a second of slack either side.
    outside = (ts < first - 1) | (ts > last + 1)
    if outside.any():
        at = raw_ts[int(np.argmax(outside))]
        raise SourceError(f"Prometheus answered {query!r} with a sample at {_quoted(str(at), 40)}, outside the "
                          f"asked range {iso_utc(first)} → {iso_utc(last)}, {_NOT_PROMETHEUS}")
    bad = ~np.isnan(vals) & ((vals < 0) | np.isinf(vals) | (vals > MAX_PLAUSIBLE_VALUE))
    if bad.any():
        i = int(np.argmax(bad))
        problem = impossible_value(float(vals[i]), raw_vals[i])
        raise ImpossibleValueError(
            f"Prometheus answered {query!r} with an impossible value at {iso_utc(float(ts[i]))}: {problem}; "
            f"refused ({int(bad.sum())} such sample(s) in this answer, the first named here): nothing is "
            "trained or promoted on it — fix the query or the exporter (look at that time in the Prometheus UI)")
    return labels, ts, vals


def _check_order(ts: np.ndarray, query: str) -> None:
    """Samples of one series strictly in time order: Prometheus answers each evaluation time once."""
    steps = np.diff(ts)
    if not (steps <= 0).any():
        return
    i = int(np.argmax(steps <= 0))
    if steps[i] == 0:
        raise SourceError(f"Prometheus answered {query!r} with two samples of one series at {iso_utc(float(ts[i]))} "
                          f"(duplicate timestamps, or one series twice), {_NOT_PROMETHEUS}")
    raise SourceError(f"Prometheus answered {query!r} with samples out of time order ({iso_utc(float(ts[i + 1]))} "
                      f"after {iso_utc(float(ts[i]))}), {_NOT_PROMETHEUS}")


def _format_labels(labels: Mapping[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _utc(when: datetime) -> datetime:
    if when.tzinfo is None:
        raise SourceError(f"time {when!r} has no timezone; pass timezone-aware UTC times")
    return when.astimezone(UTC)


def _epoch(when: datetime) -> float:
    return _utc(when).timestamp()


def _step_seconds(step: timedelta | int) -> int:
    secs = step.total_seconds() if isinstance(step, timedelta) else float(step)
    if not (secs >= 1 and secs == int(secs)):
        raise SourceError(f"query step {step!r} must be a whole number of seconds ≥ 1, e.g. 60 or 300")
    return int(secs)

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
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from types import MappingProxyType
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from tenacity import RetryCallState, Retrying, retry_if_exception_type
from urllib3.util.retry import Retry

from predictive_scaler.clock import Clock, SystemClock
from predictive_scaler.core.values import DemandSample
from predictive_scaler.errors import SourceError

log = logging.getLogger(__name__)

#: When an instant query is empty, look this far back once: data there hints at clock skew.
SKEW_PROBE = timedelta(minutes=15)

#: Prometheus refuses range queries of more than this many points per series.
MAX_POINTS_PER_SERIES = 11_000

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
    """Internal: a failure worth another attempt."""


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

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise SourceError(f"Prometheus URL {redact_url(self.url)!r} must start with http:// or https://, "
                              "e.g. http://prometheus-operated.monitoring:9090")
        self.url = self.url.rstrip("/")
        #: The URL as every message shows it: credentials in it never printed.
        self.shown = redact_url(self.url)
        if not (self.timeout > 0 and math.isfinite(self.timeout)):
            raise SourceError(f"Prometheus timeout must be a positive number of seconds, got {self.timeout!r}")
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

    # -- connection check -------------------------------------------------------------------------
    def client(self, timeout: float | None = None) -> PrometheusConnect:
        """prometheus-api-client on this source's session and headers, with its urllib3 retries off
        (our retry policy owns retries: bounded attempts, injected sleep)."""
        timeout = self.timeout if timeout is None else timeout
        client = self._clients.get(timeout)
        if client is None:
            client = PrometheusConnect(url=self.url, headers=dict(self.headers) or None, session=self.session,
                                       retry=Retry(total=0, raise_on_status=False),
                                       timeout=timeout)  # type: ignore[arg-type]
            self._clients[timeout] = client
        return client

    def check_connection(self, timeout: float) -> str | None:
        """None when Prometheus answers a query within ``timeout`` s, else why not (one try; /readyz's probe).

        It asks the query API, not the root page: Prometheus answers ``/`` with a redirect to its UI,
        and no redirect is followed."""
        try:
            resp = self.session.get(f"{self.url}/api/v1/query", params={"query": "1"},
                                    headers=dict(self.headers), timeout=timeout)
        except requests.RequestException as exc:
            return f"Prometheus at {self.shown} unreachable ({type(exc).__name__})"
        except SourceError as exc:
            return str(exc)
        return None if resp.ok else f"Prometheus at {self.shown} answered with an error status"

    # -- queries --------------------------------------------------------------------------------
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

    def range(self, query: str, start: datetime, end: datetime, step: timedelta | int,
              *, allow_partial: bool = False) -> list[RangeSeries]:
        """Range query over [start, end], split into chunks of at most ``max_points_per_series`` points.

        Series are merged across chunks by label set, in order of first appearance. Each chunk is one
        ``custom_query_range`` of prometheus-api-client, which sends start and end in whole seconds.
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
            for item in _as_list(data.get("result"), query):
                labels, ts, vals = _range_item(item, query)
                key = tuple(sorted(labels.items()))
                labels_of.setdefault(key, labels)
                parts = merged.setdefault(key, ([], []))
                parts[0].append(ts)
                parts[1].append(vals)
            chunk_start = chunk_end + step_s
        series = [RangeSeries(labels=labels_of[k], timestamps=np.concatenate(t), values=np.concatenate(v))
                  for k, (t, v) in merged.items()]
        _check_partial(QueryResult(tuple(series), tuple(dict.fromkeys(warns))), query, allow_partial)
        return series

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

        - no series → missing ("no data"), NaN or ±Inf → missing;
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
        if not all(math.isfinite(v) for v in values):
            return DemandSample.absent(
                f"query {query!r} returned a non-finite value {values} at {now.isoformat()}; a rate or "
                "ratio over no samples is NaN — check that the scrape target is up and that the range "
                "(e.g. [2m]) covers at least two scrapes")
        value = float(sum(values))
        observed_at = _utc(now)
        if freshness_query is not None:
            fresh = self.query(freshness_query, now)
            _check_partial(fresh, freshness_query, allow_partial=False)
            stamps = [s.value for s in fresh.samples if math.isfinite(s.value)]
            if not stamps:
                return DemandSample.absent(
                    f"freshness query {freshness_query!r} returned no sample time at {now.isoformat()}")
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
            raise SourceError(
                f"Prometheus at {self.shown} failed {state.attempt_number} times for {query!r}: {last}; "
                "check that it is up and reachable (its /-/ready endpoint), or raise the timeout"
            ) from (last.__cause__ or last) if last else None

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
            resp = self.session.get(url, params=params, headers=dict(self.headers), timeout=self.timeout)
        except requests.RequestException as exc:
            raise _transport_error(exc, redact_url(url), self.timeout) from exc
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
            raise _transport_error(exc, f"{self.shown}/api/v1/query_range", self.timeout) from exc
        except (PrometheusApiClientException, ValueError, KeyError, TypeError) as exc:  # incl. a JSON decode error
            answered = _CAPTURE.responses[-1] if _CAPTURE.responses else None
            if answered is not None:
                self._answer(answered, query)  # raises what the raw path raises for this answer
            raise SourceError(f"Prometheus answered {query!r} badly ({exc}); is {self.shown} Prometheus?") from exc
        except requests.RequestException as exc:
            raise _transport_error(exc, f"{self.shown}/api/v1/query_range", self.timeout) from exc
        finally:
            responses, _CAPTURE.responses = _CAPTURE.responses, None
        data, warns = self._answer(responses[-1], query)
        return {**data, "result": result}, warns

    def _answer(self, resp: requests.Response, query: str) -> _Answer:
        """Prometheus's JSON answer as (data, warnings), or the error it means."""
        url = redact_url(resp.url.split("?", 1)[0])
        body = _json_body(resp)
        verdict = _status_verdict(resp.status_code)
        if verdict == "retry":
            reason = (body or {}).get("error") or resp.reason
            raise _Retryable(f"HTTP {resp.status_code} ({reason})")
        if body is None:
            raise SourceError(
                f"{url} answered HTTP {resp.status_code} with a body that is not Prometheus JSON "
                f"({resp.text[:120]!r}); check that the URL points at Prometheus, not a proxy or UI")
        if verdict == "refused" or body.get("status") != "success":
            kind = body.get("errorType", f"HTTP {resp.status_code}")
            raise SourceError(f"Prometheus refused {query!r}: {kind}: {body.get('error', resp.reason)}; "
                              "fix the query (try it in the Prometheus UI)")
        data = body.get("data")
        if not isinstance(data, dict):
            raise SourceError(f"Prometheus answered {query!r} without a data object; is {self.shown} Prometheus?")
        warns = body.get("warnings") or []
        return data, tuple(str(w) for w in warns)


_Answer = tuple[dict[str, Any], tuple[str, ...]]


def _status_verdict(status: int) -> Literal["ok", "retry", "refused"]:
    """What the HTTP status of a Prometheus answer says on its own, the one place that reads it:
    ``retry`` (throttled, or a server error: it may work later), ``refused`` (any other answer but
    OK: the query's fault, the body says why), ``ok``."""
    if status == 429 or status >= 500:
        return "retry"
    return "ok" if status == 200 else "refused"


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


def _transport_error(exc: requests.RequestException, url: str, timeout: float) -> Exception:
    if isinstance(exc, requests.Timeout):
        return _Retryable(f"no answer within {timeout:g}s")
    if isinstance(exc, requests.ConnectionError):
        return _Retryable(f"cannot connect ({type(exc).__name__})")
    return SourceError(f"request to {url} failed: {exc}; check the Prometheus URL")


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


def _parse_value(raw: Any, query: str) -> float:
    try:
        return float(raw)  # Prometheus writes "NaN", "+Inf", "-Inf" — float() reads them all
    except (TypeError, ValueError) as exc:
        raise SourceError(f"Prometheus answered {query!r} with a non-numeric value {raw!r}, which no "
                          "Prometheus writes; check that the URL points at Prometheus itself, not a proxy "
                          "or another API") from exc


def _sample_from_pair(labels: Mapping[str, str], pair: Any, query: str) -> Sample:
    if not isinstance(pair, list | tuple) or len(pair) != 2:
        raise SourceError(f"Prometheus answered {query!r} with a malformed sample {pair!r} (expected "
                          "[time, \"value\"]); check that the URL points at Prometheus itself, not a proxy "
                          "or another API")
    ts = datetime.fromtimestamp(_parse_value(pair[0], query), UTC)
    return Sample(labels=labels, value=_parse_value(pair[1], query), timestamp=ts)


def _instant_sample(item: Any, query: str) -> Sample:
    if not isinstance(item, dict) or "value" not in item:
        raise SourceError(f"Prometheus answered {query!r} with a malformed vector element "
                          "(native histograms are not supported; query a float series)")
    return _sample_from_pair(dict(item.get("metric") or {}), item["value"], query)


def _range_item(item: Any, query: str) -> tuple[dict[str, str], np.ndarray, np.ndarray]:
    if not isinstance(item, dict) or not isinstance(item.get("values"), list):
        raise SourceError(f"Prometheus answered {query!r} with a malformed matrix element "
                          "(native histograms are not supported; query a float series)")
    pairs = item["values"]
    try:
        # One conversion per column; "NaN", "+Inf" and "-Inf" read as float() reads them.
        ts = np.array([p[0] for p in pairs], dtype=float)
        vals = np.array([p[1] for p in pairs], dtype=float)
    except (TypeError, ValueError, IndexError, KeyError):
        for p in pairs:  # find the bad sample and say what it is
            if not isinstance(p, list | tuple) or len(p) != 2:
                raise SourceError(f"Prometheus answered {query!r} with a malformed sample {p!r} (expected "
                                  "[time, \"value\"]); check that the URL points at Prometheus itself") from None
            _parse_value(p[0], query)
            _parse_value(p[1], query)
        raise SourceError(f"Prometheus answered {query!r} with a matrix numpy cannot read; is this Prometheus?") from None
    return dict(item.get("metric") or {}), ts, vals


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

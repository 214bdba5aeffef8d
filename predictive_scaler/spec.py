"""The PredictiveScaler spec: one frozen settings type, the one source of truth.

Every setting is a dataclass field whose ``metadata`` carries its description,
bounds and allowed values. From those fields come, with no hand-kept copy:

- eager validation (``__post_init__``) raising :class:`ConfigError` whose
  ``field`` is the camelCase path of the offending setting (``spec.minReplicas``);
- :meth:`ScalerSpec.from_dict` / :meth:`ScalerSpec.to_dict` for the camelCase
  shape of the custom resource's ``spec`` (also used by backtest scenarios);
- :func:`spec_json_schema`, the structural OpenAPI v3 schema of the CRD, with
  each section's cross-field rules in CEL (``_cel``, beside its ``_check``) so
  the API server refuses what the controller would.

Durations are whole seconds (``…Seconds``), as in the HPA's own API.
Budget problems raise :class:`BudgetError` (a ConfigError); the planner also
re-checks the budget and fails closed, so a spec built around validation still
cannot buy speculative GPUs it was not allowed.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal

from predictive_scaler.errors import BudgetError, ConfigError, did_you_mean
from predictive_scaler.yaml_input import excerpt

#: Grid the models work on unless a trace is coarser (contract: 5 minutes).
DEFAULT_MODEL_STEP = 300
#: History handed to a model that does not say how much it reads: a week covers weekly seasonality.
DEFAULT_RECENT_WINDOW_SECONDS = 7 * 86400
#: The most recent history a forecast is handed, whether the spec or the served model asks for it.
MAX_RECENT_WINDOW_SECONDS = 30 * 86400

DemandKind = Literal["requests", "dcgm-busy-gpus", "tokens", "concurrency"]
#: Servers whose own metrics fill the demand and serving queries (sources/demand.py).
Preset = Literal["vllm", "tgi", "triton"]
Mode = Literal["forecast-only", "scale", "keda"]
Recurrence = Literal["weekly"]
#: RFC 3339 date-time with an explicit offset (``Z`` or ``±hh:mm``), seconds optional fraction.
RFC3339_PATTERN = r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
_RFC3339 = re.compile(RFC3339_PATTERN)
WEEK = timedelta(days=7)
#: Most scheduled events one scaler may list (each is checked at every reconcile).
MAX_EVENTS = 100

# -- numeric bounds --------------------------------------------------------------------------
# Every number has both bounds, chosen wide enough for any real cluster and narrow enough that
# nothing computed from them (demand ÷ capacity, replicas × GPUs × price) overflows or loses its
# meaning; the CRD schema carries the same minimum and maximum.

#: Most replicas one scaler may ask for. A Deployment's replica count is an int32, but Kubernetes
#: is tested up to 150,000 pods in a cluster of 5,000 nodes: no GPU workload has 100,000 replicas.
#: What a backtest can simulate is bounded apart (backtest/runner.py MAX_SIMULATION_WORK): a cap
#: this high costs nothing there unless the replicas are really run.
MAX_REPLICAS = 100_000
#: Most GPUs on one node, so also in one replica (the largest GPU nodes hold 8 to 16 today).
MAX_GPUS_PER_NODE = 64
#: Most speculative GPUs a budget may allow: every replica of the largest scaler with the most GPUs.
MAX_GPUS = MAX_REPLICAS * MAX_GPUS_PER_NODE
#: Highest price of a GPU-hour in any currency: an H100 hour costs about 3 USD, 450 JPY or 75,000 VND.
MAX_PRICE_PER_GPU_HOUR = 1e7
#: Highest speculative cost per hour a budget may allow: the largest budget at the highest price.
MAX_COST_PER_HOUR = MAX_GPUS * MAX_PRICE_PER_GPU_HOUR
#: Demand one replica serves, in the demand query's unit: from one request in eleven days to a
#: billion a second. Below it demand ÷ capacity overflows to infinity; above it every demand
#: rounds up to one replica.
MIN_REQUESTS_PER_REPLICA = 1e-6
MAX_REQUESTS_PER_REPLICA = 1e9


def _m(
    description: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    exclusive_maximum: bool = False,
    min_length: int | None = None,
    schema: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A field's metadata; ``schema`` adds OpenAPI keywords the API server checks (the Python
    check of the same rule lives in the section's ``_check`` or the value's parser)."""
    return {
        "schema": schema or {},
        "description": description,
        "minimum": minimum,
        "maximum": maximum,
        "exclusive_minimum": exclusive_minimum,
        "exclusive_maximum": exclusive_maximum,
        "min_length": min_length,
    }


def field_bounds(cls: type, name: str) -> tuple[float, float]:
    """(minimum, maximum) of a section's numeric field (every one has both), for code that must stay
    within what the spec allows."""
    md = next(f.metadata for f in dataclasses.fields(cls) if f.name == name)  # type: ignore[arg-type]
    return float(md["minimum"]), float(md["maximum"])


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


# -- generic field machinery ---------------------------------------------------------------

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = hints
    return hints


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


@dataclass(frozen=True)
class CelRule:
    """A section's cross-field rule in CEL, for the CRD's ``x-kubernetes-validations``.

    The API server (1.25+) evaluates ``rule`` with ``self`` bound to the section's
    object after defaulting, so a bad spec is refused before it is stored; the
    section's ``_check`` enforces the same rule in Python (servers without CEL,
    backtest scenarios). tests/test_crd_validation.py runs both on the same specs.
    """

    rule: str
    message: str


class _Settings:
    """Mixin: validates every field from its type and metadata, then runs ``_check``."""

    #: Error type raised for this section's problems (the budget uses BudgetError).
    _error: ClassVar[type[ConfigError]] = ConfigError
    #: ``_check``'s rules in CEL (the CRD's copy of them); every ``_check`` needs some.
    _cel: ClassVar[tuple[CelRule, ...]] = ()

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            new = _validate_value(type(self), f, value)
            if new is not value:
                object.__setattr__(self, f.name, new)
        self._check()

    def _check(self) -> None:
        """Cross-field rules (min ≤ max …); override in sections that have some."""

    def _fail(self, name: str, detail: str) -> typing.NoReturn:
        key = ".".join(camel(part) for part in name.split("."))
        raise self._error(f"{key}: {detail}", field=key)


def _validate_value(cls: type, f: dataclasses.Field[Any], value: Any) -> Any:
    err = getattr(cls, "_error", ConfigError)
    key = camel(f.name)
    tp, optional = _unwrap_optional(_hints(cls)[f.name])

    def fail(detail: str) -> typing.NoReturn:
        raise err(f"{key}: {detail}", field=key)

    if value is None:
        if optional:
            return None
        fail("is required; set it (see the description in the CRD schema)")
    if tp in (bool, int, float, str):
        return _validate_scalar(tp, f, value, fail)
    return _validate_compound(cls, f, tp, value, fail)


def _validate_scalar(tp: type, f: dataclasses.Field[Any], value: Any,
                     fail: typing.Callable[[str], typing.NoReturn]) -> Any:
    """A bool, int, float or str field's value (a whole float is an int; numbers within their bounds)."""
    md = f.metadata
    if tp is bool:
        if not isinstance(value, bool):
            fail(f"must be true or false, got {excerpt(value)}")
        return value
    if tp is int:
        given = value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            fail(f"must be a whole number, got {excerpt(value)}; write e.g. {f.default if isinstance(f.default, int) else 1}")
        _check_bounds(md, value, fail, given if isinstance(given, float) and given else None)
        return value
    if tp is float:
        if not _is_number(value):
            fail(f"must be a number, got {excerpt(value)}")
        given = value
        try:
            value = float(value) + 0.0  # + 0.0: a negative zero is zero (it would print as -0)
        except OverflowError:  # a whole number too large for a float
            value = math.inf if value > 0 else -math.inf
        if not math.isfinite(value):
            fail(f"must be a finite number, got {number_text(given)}")
        _check_bounds(md, value, fail, given if isinstance(given, int) else None)
        return value
    if tp is str:
        if not isinstance(value, str):
            fail(f"must be a string, got {excerpt(value)}")
        if md.get("min_length") and len(value) < md["min_length"]:
            fail("must not be empty")
        return value
    raise AssertionError(f"not a scalar type: {tp!r}")  # pragma: no cover - _validate_value checks


def _validate_compound(cls: type, f: dataclasses.Field[Any], tp: Any, value: Any,
                       fail: typing.Callable[[str], typing.NoReturn]) -> Any:
    """A Literal, section, list or string map field's value."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            fail(f"must be one of {', '.join(map(repr, allowed))}, got {excerpt(value)}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, tp):  # type: ignore[arg-type]
            fail(f"must be a {tp.__name__} section, got {type(value).__name__}")  # type: ignore[union-attr]
        return value
    if origin is tuple:
        item = typing.get_args(tp)[0]
        if not isinstance(value, tuple | list):
            fail(f"must be a list, got {excerpt(value)}")
        if dataclasses.is_dataclass(item) and not all(isinstance(v, item) for v in value):  # type: ignore[arg-type]
            fail(f"every entry must be a {item.__name__}")  # type: ignore[union-attr]
        return tuple(value)
    if origin is dict:
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            fail(f"must map strings to strings, got {excerpt(value)}")
        return dict(value)
    raise TypeError(f"spec field {cls.__name__}.{f.name} has an unsupported type {tp!r}")


def number_text(value: Any) -> str:
    """A number as a message shows it: a whole number too long for a float (or a line) by its length."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        n = abs(value)
        digits = int(n.bit_length() * math.log10(2)) + 1  # str() of a huge int is refused, and slow
        digits -= n < 10 ** (digits - 1)
        return f"a {digits:,}-digit number" if digits > 20 else f"{value:,}"
    if isinstance(value, float | int):
        return f"{value:g}"
    return repr(value)


def _bound(limit: float) -> str:
    """A bound as a message shows it: whole ones in full (6400000, not 6.4e+06)."""
    return str(int(limit)) if float(limit).is_integer() and abs(limit) < 1e16 else f"{limit:g}"


def _check_bounds(md: Mapping[str, Any], value: float, fail: typing.Callable[[str], typing.NoReturn],
                  given: Any = None) -> None:
    """``value`` within the field's bounds; ``given`` is what the user wrote, when it shows better."""
    lo, hi = md.get("minimum"), md.get("maximum")
    shown = number_text(value if given is None else given)
    if lo is not None:
        if md.get("exclusive_minimum") and not value > lo:
            fail(f"must be greater than {_bound(lo)}, got {shown}; use a larger value")
        if not md.get("exclusive_minimum") and value < lo:
            if 0 < lo < 1 and value <= 0:  # a fractional minimum (a smallest capacity) is first of all "positive"
                fail(f"must be greater than 0 (at least {_bound(lo)}), got {shown}; use a larger value "
                     f"({_bound(lo)} or more)")
            fail(f"must be at least {_bound(lo)}, got {shown}; use a value of {_bound(lo)} or more")
    if hi is not None:
        if md.get("exclusive_maximum") and not value < hi:
            fail(f"must be less than {_bound(hi)}, got {shown}; use a smaller value")
        if not md.get("exclusive_maximum") and value > hi:
            fail(f"must be at most {_bound(hi)}, got {shown}; use a value of {_bound(hi)} or less")


# -- the sections ----------------------------------------------------------------------------

@dataclass(frozen=True)
class TargetRef(_Settings):
    name: str = field(metadata=_m("Name of the workload to scale (in the scaler's namespace); it must have a /scale subresource.", min_length=1))
    api_version: str = field(default="apps/v1", metadata=_m("API version of the target. Default: apps/v1.", min_length=1))
    kind: str = field(default="Deployment", metadata=_m("Kind of the target (Deployment, StatefulSet, or any resource with /scale). Default: Deployment.", min_length=1))


@dataclass(frozen=True)
class DemandSignal(_Settings):
    kind: DemandKind = field(default="requests", metadata=_m(
        "What demand is measured in: 'requests' (a PromQL request rate, e.g. sum(rate(...[2m]))) or "
        "'dcgm-busy-gpus' (sum of DCGM_FI_DEV_GPU_UTIL/100 over the target's pods). Default: requests."))
    query: str | None = field(default=None, metadata=_m(
        "PromQL query returning one series: total demand of the target. Required for kind 'requests'; "
        "for 'dcgm-busy-gpus' it defaults to the DCGM busy-GPU sum over the target's pods.", min_length=1))
    utilization_query: str | None = field(default=None, metadata=_m(
        "Optional PromQL query of the target's mean GPU utilisation (0-100), used to learn capacity.", min_length=1))
    max_age_seconds: int = field(default=180, metadata=_m(
        "An observation older than this is stale and treated as missing (a frozen exporter must not look healthy). Default: 180.",
        minimum=15, maximum=3600))
    intra_step_peak_factor: float = field(default=1.0, metadata=_m(
        "The forecast is of each model step's mean, but demand is served minute by minute: predictive sizing "
        "multiplies the forecast by this factor to cover the peaks inside a step. Learn it from history as a high "
        "quantile of (demand at the control period ÷ its model-step mean), e.g. `predictive-scaler backtest` "
        "estimates it from the training window. 1 = no allowance. Default: 1.", minimum=1, maximum=10))

    preset: Preset | None = field(default=None, metadata=_m(
        "The inference server whose own metrics fill the queries for the target's pods (selected by namespace and "
        "pod name): 'vllm', 'tgi' or 'triton'. It gives the demand query of kinds requests, tokens and "
        "concurrency when query is not set, and the served rate, latency and running batch that capacity is "
        "learned from (capacity.slo) and that the dcgm-busy-gpus guard reads. Triton exports no token counters."))
    served_query: str | None = field(default=None, metadata=_m(
        "PromQL of what the whole target served per second (requests, or tokens for kind tokens), for learning "
        "capacity; '$window' is replaced by capacity.slo.windowSeconds (e.g. sum(rate(x_total[$window]))). "
        "Default: from the preset.", min_length=1))
    latency_query: str | None = field(default=None, metadata=_m(
        "PromQL of the target's mean request latency in seconds (histogram sum ÷ count over '$window'), for "
        "learning capacity. Default: from the preset.", min_length=1))
    latency_quantile_query: str | None = field(default=None, metadata=_m(
        "PromQL of the latency quantile capacity.slo.latencyP95Ms bounds, in seconds (e.g. histogram_quantile(0.95, "
        "sum by (le) (rate(x_bucket[$window])))). Default: from the preset.", min_length=1))
    running_query: str | None = field(default=None, metadata=_m(
        "PromQL of the requests running in the target's batches (summed over its pods), for learning capacity; "
        "optional (latency alone finds the knee of a one-at-a-time server). Default: from the preset.",
        min_length=1))

    _cel = (CelRule("self.kind == 'dcgm-busy-gpus' || has(self.query) || has(self.preset)",
                    "query (or preset) is required when demand.kind is 'requests', 'tokens' or 'concurrency'; give "
                    "the PromQL demand query or a preset"),
            CelRule("self.kind != 'tokens' || has(self.query) || !has(self.preset) || self.preset != 'triton'",
                    "preset 'triton' exports no token counters; give demand.query for kind 'tokens'"))

    def _check(self) -> None:
        if self.kind != "dcgm-busy-gpus" and self.query is None and self.preset is None:
            self._fail("query", f"is required when demand.kind is {self.kind!r}; give the PromQL demand query, "
                       "e.g. sum(rate(http_requests_total{service=\"llm\"}[2m])), or a preset (vllm, tgi, triton)")
        if self.kind == "tokens" and self.query is None and self.preset == "triton":
            self._fail("preset", "'triton' exports no token counters; give demand.query for kind 'tokens' (or use "
                       "kind requests)")


@dataclass(frozen=True)
class CapacitySlo(_Settings):
    latency_p95_ms: float | None = field(default=None, metadata=_m(
        "Serve within p95 latency ≤ this many milliseconds: capacity is the highest served rate whose windows met "
        "it.", minimum=0.001, maximum=3_600_000))
    no_waiting: bool = field(default=False, metadata=_m(
        "Serve with no requests waiting beyond the running batch: capacity is the knee, where the served rate stops "
        "growing and requests queue. Default: false."))
    window_seconds: int = field(default=60, metadata=_m(
        "Range of the rate() windows capacity is learned over ('$window' in the serving queries); at least four "
        "scrape intervals. Default: 60.", minimum=5, maximum=900))
    history_hours: int = field(default=168, metadata=_m(
        "Recent serving history the retraining job learns capacity from. Default: 168 (a week).",
        minimum=1, maximum=720))

    _cel = (CelRule("has(self.latencyP95Ms) != (has(self.noWaiting) && self.noWaiting)",
                    "give exactly one of latencyP95Ms and noWaiting: true"),)

    def _check(self) -> None:
        if (self.latency_p95_ms is None) == (not self.no_waiting):
            self._fail("latency_p95_ms", "and noWaiting: give exactly one of them (a p95 latency bound, or "
                       "noWaiting: true for the knee)")


@dataclass(frozen=True)
class Capacity(_Settings):
    requests_per_replica: float | None = field(default=None, metadata=_m(
        "Demand one replica serves within its latency SLO, in the demand's unit: requests/s (kind requests), "
        "tokens/s (tokens), requests in flight (concurrency). Required unless demand.kind is 'dcgm-busy-gpus'.", minimum=MIN_REQUESTS_PER_REPLICA,
        maximum=MAX_REQUESTS_PER_REPLICA))
    gpu_utilization_target: float = field(default=0.7, metadata=_m(
        "Target busy fraction of each GPU when demand.kind is 'dcgm-busy-gpus': replicas = busy GPUs / "
        "target / gpusPerReplica. The useful band is 0.6-0.8. Default: 0.7.", minimum=0.6, maximum=0.8))
    slo: CapacitySlo | None = field(default=None, metadata=_m(
        "The SLO at which the retraining job learns what one replica serves, from the served rate, latency and "
        "running batch (demand.preset, or demand.servedQuery and demand.latencyQuery); it reports the value, a "
        "point or a lower bound, in status.retrain.learnedCapacity."))
    learned: Literal["report", "serve"] = field(default="report", metadata=_m(
        "'report': the learned capacity is only reported. 'serve': the controller plans on it instead of "
        "requestsPerReplica, moving at most x2 or /2 per retrain and never below requestsPerReplica on a lower "
        "bound (requestsPerReplica is then the start value and the floor). Needs slo. Default: report."))

    _cel = (CelRule("self.learned != 'serve' || has(self.slo)",
                    "learned: serve needs capacity.slo (the SLO the capacity is learned at)"),)

    def _check(self) -> None:
        if self.learned == "serve" and self.slo is None:
            self._fail("learned", "is 'serve' without capacity.slo; give the SLO the capacity is learned at (e.g. "
                       "slo: {noWaiting: true})")


@dataclass(frozen=True)
class LeadTimes(_Settings):
    pod_start_seconds: int = field(default=90, metadata=_m(
        "Time from scaling up to a ready replica on a warm node (scheduling + model load). Default: 90.",
        minimum=0, maximum=3600))
    node_start_seconds: int = field(default=400, metadata=_m(
        "Time to a ready replica on a cold node: node provisioning (45-60 s Karpenter, 3-5 min Cluster "
        "Autoscaler) + image pull (3-8 min for 5-15 GB) + model load. Default: 400.", minimum=0, maximum=7200))

    _cel = (CelRule("self.nodeStartSeconds >= self.podStartSeconds",
                    "nodeStartSeconds is shorter than podStartSeconds; a cold node cannot be faster than a warm one"),)

    def _check(self) -> None:
        if self.node_start_seconds < self.pod_start_seconds:
            self._fail("node_start_seconds", f"({self.node_start_seconds}) is shorter than podStartSeconds "
                       f"({self.pod_start_seconds}); a cold node cannot be faster than a warm one — raise it")


@dataclass(frozen=True)
class ReactiveBehavior(_Settings):
    tolerance: float = field(default=0.1, metadata=_m(
        "No scaling while demand/capacity is within this fraction of 1 (HPA tolerance). Default: 0.1.",
        minimum=0, maximum=1, exclusive_maximum=True))
    scale_down_stabilization_seconds: int = field(default=300, metadata=_m(
        "Scale down only to the highest recommendation of this window (HPA). Default: 300.", minimum=0, maximum=3600))
    scale_up_stabilization_seconds: int = field(default=0, metadata=_m(
        "Scale up only to the lowest recommendation of this window (HPA). Default: 0.", minimum=0, maximum=3600))
    scale_up_percent: int = field(default=100, metadata=_m(
        "Scale-up policy: add at most this percentage of the replicas per period. Default: 100.", minimum=0, maximum=10000))
    scale_up_pods: int = field(default=4, metadata=_m(
        "Scale-up policy: or add at most this many replicas per period, whichever allows more. Default: 4.", minimum=0, maximum=10000))
    scale_up_period_seconds: int = field(default=15, metadata=_m(
        "Period of the scale-up policies. Default: 15.", minimum=1, maximum=1800))
    scale_down_percent: int = field(default=100, metadata=_m(
        "Scale-down policy: remove at most this percentage of the replicas per period. Default: 100.", minimum=0, maximum=100))
    scale_down_period_seconds: int = field(default=15, metadata=_m(
        "Period of the scale-down policy. Default: 15.", minimum=1, maximum=1800))
    target_utilization: float = field(default=1.0, metadata=_m(
        "Share of a replica's capacity the reactive rule (the fallback, and the counterfactual the prewarm budget "
        "is measured from) plans on, as an HPA target below 100 % leaves room for its reaction time; predictive "
        "sizing plans on the full capacity (its headroom is the forecast quantile and the intra-step peak "
        "factor). Default: 1.", minimum=0.1, maximum=1))

    _cel = (CelRule("self.scaleUpPercent > 0 || self.scaleUpPods > 0",
                    "scaleUpPercent and scaleUpPods are both 0, so the workload could never scale up"),)

    def _check(self) -> None:
        if self.scale_up_percent == 0 and self.scale_up_pods == 0:
            self._fail("scale_up_pods", "and scaleUpPercent are both 0, so the workload could never scale up; "
                       "allow at least one of them (HPA defaults: 100 % or 4 pods)")


@dataclass(frozen=True)
class DriftSettings(_Settings):
    fast_periods: int = field(default=3, metadata=_m(
        "Drift when this many consecutive observations are far outside the forecast (above P95 by farAboveMargin, "
        "or below P50 by farBelowRatio) beyond their usual spread around their model step's mean for at least "
        "fastSeconds, or this many consecutive completed model steps' means are. Default: 3.", minimum=1,
        maximum=100))
    window_periods: int = field(default=30, metadata=_m(
        "Completed model steps in the rolling window for the slower share-based checks (each step's mean is "
        "judged against the forecast for it). Default: 30.", minimum=2, maximum=500))
    min_window_periods: int = field(default=10, metadata=_m(
        "Completed model steps the window needs before its shares are judged. Default: 10.", minimum=1, maximum=500))
    max_above_fraction: float = field(default=0.3, metadata=_m(
        "Under-forecast drift when more than this share of the window's step means is above the P95 (a good P95 "
        "is exceeded "
        "about 5 % of the time). Default: 0.3.", minimum=0.05, maximum=1))
    far_above_margin: float = field(default=0.1, metadata=_m(
        "'Far above' means above P95 x (1 + this). Default: 0.1.", minimum=0, maximum=10))
    far_below_ratio: float = field(default=0.8, metadata=_m(
        "'Far below' means below P50 x this. Default: 0.8.", minimum=0, maximum=1, exclusive_maximum=True))
    max_far_below_fraction: float = field(default=0.5, metadata=_m(
        "Over-forecast drift when more than this share of the window's step means is far below the P50 "
        "(wasted money). "
        "Default: 0.5.", minimum=0.05, maximum=1))
    recovery_seconds: int = field(default=900, metadata=_m(
        "After drift, return to predictive only once the forecast has been good this long (hysteresis). Default: 900.",
        minimum=0, maximum=86400))
    fast_seconds: int = field(default=120, metadata=_m(
        "Drift from single observations also needs them far off for at least this long (time, whatever the "
        "control period: at 15 s a run of fastPeriods observations spans only 30 s). Default: 120 (3 "
        "observations at the 60 s default period).", minimum=0, maximum=3600))
    signal_lag_seconds: int = field(default=180, metadata=_m(
        "How long after a change in demand the observed demand shows it in full: the demand query's range "
        "(e.g. [2m]) plus the scrape interval plus the metric delay. From the time replicas or placeholders are "
        "placed for a predicted rise until this long after its onset (the first model step whose P50 exceeds the "
        "demand observed before it by one replica's capacity) has been observed, neither over-forecast drift "
        "nor the lowering of a forecast above the observed level releases them. Default: 180 ([2m] scraped "
        "every 30 s, 30 s late).", minimum=0, maximum=7200))

    _cel = (CelRule("self.minWindowPeriods <= self.windowPeriods",
                    "minWindowPeriods exceeds windowPeriods; lower it or enlarge the window"),)

    def _check(self) -> None:
        if self.min_window_periods > self.window_periods:
            self._fail("min_window_periods", f"({self.min_window_periods}) exceeds windowPeriods "
                       f"({self.window_periods}); lower it or enlarge the window")


@dataclass(frozen=True)
class ServiceTracking(_Settings):
    """Headroom widened while the ready replicas leave demand unserved (the forecast is noisy, not biased)."""

    enabled: bool = field(default=False, metadata=_m(
        "Widen the predictive plan while demand goes unserved: for services with short bursts at random times "
        "that a forecast of step means cannot see, at a cost (make bench-bursty measures both sides). Default: "
        "false."))
    target: float = field(default=0.99, metadata=_m(
        "Share of demand the ready replicas should serve. While the share left unserved (demand above what the ready "
        "replicas serve; not counted at maxReplicas, while demand in the release window reached what maxReplicas "
        "serve, while no replica is ready, or once replicas stayed unready longer than the lead times) runs above "
        "1 - target, the predictive strategy "
        "plans on its quantile times a headroom multiplier that grows; while it runs below, the multiplier shrinks "
        "back towards 1 (never below). Speculation it buys stays within the prewarm budget. Default: 0.99.",
        minimum=0.5, maximum=1, exclusive_maximum=True))
    gain_per_hour: float = field(default=4.0, metadata=_m(
        "How fast the multiplier moves: its logarithm rises by this per hour of demand left wholly unserved "
        "(and falls by this x (1 - target) per hour). Default: 4.",
        minimum=0, maximum=100))
    max_multiplier: float = field(default=4.0, metadata=_m(
        "Largest headroom multiplier. Default: 4.", minimum=1, maximum=10))


@dataclass(frozen=True)
class Budget(_Settings):
    _error: ClassVar[type[ConfigError]] = BudgetError

    max_gpus: int | None = field(default=None, metadata=_m(
        "Most speculative GPUs at any time: replicas above the reactive need plus whole nodes kept warm by "
        "placeholders. Unset with maxCostPerHour unset means no speculation at all.", minimum=0, maximum=MAX_GPUS))
    max_cost_per_hour: float | None = field(default=None, metadata=_m(
        "Most speculative cost per hour (needs pricePerGpuHour).", minimum=0, maximum=MAX_COST_PER_HOUR))
    price_per_gpu_hour: float | None = field(default=None, metadata=_m(
        "Price of one GPU-hour, for cost limits and reports.", minimum=0, maximum=MAX_PRICE_PER_GPU_HOUR))
    currency: str = field(default="USD", metadata=_m("Currency of the prices. Default: USD.", min_length=1))

    _cel = (CelRule("!has(self.maxCostPerHour) || has(self.pricePerGpuHour)",
                    "pricePerGpuHour is required when maxCostPerHour is set"),)

    def _check(self) -> None:
        if self.max_cost_per_hour is not None and self.price_per_gpu_hour is None:
            self._fail("price_per_gpu_hour", "is required when maxCostPerHour is set; give the price of one "
                       "GPU-hour so the cost can be bounded")


@dataclass(frozen=True)
class Toleration(_Settings):
    key: str | None = field(default=None, metadata=_m("Taint key the placeholder pods tolerate."))
    operator: Literal["Exists", "Equal"] = field(default="Exists", metadata=_m("Exists or Equal. Default: Exists."))
    value: str | None = field(default=None, metadata=_m("Taint value (with operator Equal)."))
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute", ""] = field(default="", metadata=_m(
        "Taint effect; empty matches all. Default: empty."))


#: A Kubernetes label key: an optional DNS-subdomain prefix and '/', then a name of at most 63 characters.
LABEL_KEY_PATTERN = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                     r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
#: A Kubernetes label value (what a node selector requirement compares with): at most 63 characters.
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
#: A NodePool name as Karpenter labels its nodes with it (karpenter.sh/nodepool): a label value that is a DNS name.
NODE_POOL_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$"
#: The label Karpenter puts on every node it launches, naming the NodePool that launched it.
KARPENTER_NODEPOOL_LABEL = "karpenter.sh/nodepool"
_LABEL_KEY, _LABEL_VALUE = re.compile(LABEL_KEY_PATTERN), re.compile(LABEL_VALUE_PATTERN)
_INTEGER = re.compile(r"^-?[0-9]+$")


@dataclass(frozen=True)
class NodeSelectorRequirement(_Settings):
    """One expression of a node selector term (core/v1 NodeSelectorRequirement)."""

    key: str = field(metadata=_m("Node label key, e.g. karpenter.sh/nodepool or nvidia.com/gpu.product.", min_length=1,
                                 schema={"pattern": LABEL_KEY_PATTERN, "maxLength": 317}))
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = field(metadata=_m(
        "In, NotIn, Exists, DoesNotExist, Gt or Lt, as in a pod's node affinity."))
    values: tuple[str, ...] = field(default=(), metadata=_m(
        "Label values: one or more with In and NotIn, none with Exists and DoesNotExist, one integer with Gt and Lt.",
        schema={"maxItems": 64, "items": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN}}))

    _cel = (
        CelRule("self.operator in ['Exists', 'DoesNotExist'] ? (!has(self.values) || size(self.values) == 0) "
                ": (has(self.values) && size(self.values) > 0)",
                "values must be empty with operator Exists or DoesNotExist, and given with In, NotIn, Gt or Lt"),
        CelRule("!(self.operator in ['Gt', 'Lt']) || !has(self.values) || size(self.values) == 0 || "
                "(size(self.values) == 1 && self.values[0].matches('^-?[0-9]+$'))",
                "operator Gt or Lt takes exactly one value, an integer"),
    )

    def _check(self) -> None:
        if not _LABEL_KEY.match(self.key) or len(self.key) > 317:
            self._fail("key", f"{excerpt(self.key)} is not a label key; write e.g. karpenter.sh/nodepool (an optional "
                       "DNS prefix and '/', then at most 63 letters, digits, '-', '_' or '.')")
        for i, value in enumerate(self.values):
            if not isinstance(value, str) or not _LABEL_VALUE.match(value):
                self._fail("values", f"[{i}] {excerpt(value)} is not a label value; write a string of at most 63 "
                           "letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            self._fail("values", f"must be empty with operator {self.operator} (it tests only that the label is "
                       "there); drop the values or use In / NotIn")
        if self.operator not in ("Exists", "DoesNotExist") and not self.values:
            self._fail("values", f"are required with operator {self.operator}; list the label values to compare with")
        if self.operator in ("Gt", "Lt") and (len(self.values) != 1 or not _INTEGER.match(self.values[0])):
            self._fail("values", f"with operator {self.operator} must be exactly one integer, e.g. ['3'], "
                       f"got {list(self.values)!r}")


@dataclass(frozen=True)
class NodeSelectorTerm(_Settings):
    """Expressions that must all match (core/v1 NodeSelectorTerm; matchFields is not supported)."""

    match_expressions: tuple[NodeSelectorRequirement, ...] = field(metadata=_m(
        "Node label requirements, all of which must match.", schema={"maxItems": 16}))

    _cel = (CelRule("size(self.matchExpressions) > 0",
                    "matchExpressions is empty; a term without expressions matches no node"),)

    def _check(self) -> None:
        if not self.match_expressions:
            self._fail("match_expressions", "is empty; a term without expressions matches no node (as a required "
                       "term, no node at all) — give at least one expression")


@dataclass(frozen=True)
class NodeSelector(_Settings):
    """Terms of which at least one must match (core/v1 NodeSelector)."""

    node_selector_terms: tuple[NodeSelectorTerm, ...] = field(metadata=_m(
        "Terms, any one of which a node must match.", schema={"maxItems": 8}))

    _cel = (CelRule("size(self.nodeSelectorTerms) > 0",
                    "nodeSelectorTerms is empty; give at least one term (a node must match one of them)"),)

    def _check(self) -> None:
        if not self.node_selector_terms:
            self._fail("node_selector_terms", "is empty; give at least one term (a node must match one of them)")


@dataclass(frozen=True)
class PreferredSchedulingTerm(_Settings):
    weight: int = field(metadata=_m("Weight of the preference, 1-100.", minimum=1, maximum=100))
    preference: NodeSelectorTerm = field(metadata=_m("The node label requirements preferred."))


@dataclass(frozen=True)
class NodeAffinity(_Settings):
    """The node affinity of the placeholder pods (core/v1 NodeAffinity, without matchFields)."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = field(default=None, metadata=_m(
        "Nodes the placeholder pods may only run on."))
    preferred_during_scheduling_ignored_during_execution: tuple[PreferredSchedulingTerm, ...] = field(
        default=(), metadata=_m("Nodes the placeholder pods prefer.", schema={"maxItems": 8}))


@dataclass(frozen=True)
class Prewarm(_Settings):
    enabled: bool = field(default=False, metadata=_m(
        "Keep GPU nodes warm with negative-priority placeholder pods ahead of forecast demand. Default: false."))
    gpus_per_node: int = field(default=8, metadata=_m(
        "GPUs on one node of the target's node pool; a placeholder that needs a new node pays for all of them. Default: 8.",
        minimum=1, maximum=MAX_GPUS_PER_NODE))
    priority_class_name: str = field(default="predictive-scaler-placeholder", metadata=_m(
        "PriorityClass (negative value) of the placeholder pods, so real pods preempt them. "
        "Default: predictive-scaler-placeholder.", min_length=1))
    image: str | None = field(default=None, metadata=_m(
        "Image the placeholder pods run, to pull the inference image ahead; unset uses a pause image.", min_length=1))
    node_selector: dict[str, str] = field(default_factory=dict, metadata=_m(
        "Node selector of the placeholder pods (match the inference pods)."))
    tolerations: tuple[Toleration, ...] = field(default=(), metadata=_m(
        "Tolerations of the placeholder pods (match the inference pods)."))
    affinity: NodeAffinity | None = field(default=None, metadata=_m(
        "Node affinity of the placeholder pods (a Kubernetes NodeAffinity; match the inference pods' so the "
        "nodes warmed are nodes they can use). With Karpenter, select the NodePool here or with nodePool."))
    node_pool: str | None = field(default=None, metadata=_m(
        "Karpenter NodePool the placeholder pods ask for: adds the requirement karpenter.sh/nodepool In [nodePool] "
        "to every required term of affinity. Give the NodePool here or in affinity, not both.", min_length=1,
        schema={"pattern": NODE_POOL_PATTERN, "maxLength": 63}))
    do_not_disrupt: bool = field(default=False, metadata=_m(
        "Annotate the placeholder pods karpenter.sh/do-not-disrupt: \"true\", so Karpenter neither consolidates "
        "nor (without a NodeClaim terminationGracePeriod) drift-replaces a node while a placeholder runs on it; it "
        "also pins the real pods sharing that node. Expiration still applies. Default: false (tune the NodePool's "
        "consolidateAfter and disruption budgets first; docs/install.md#karpenter)."))
    budget: Budget = field(default_factory=Budget, metadata=_m(
        "Hard bound on speculative capacity (all GPUs that exist only because of the forecast, whether or "
        "not placeholders are enabled). An empty budget allows no speculation."))
    replicas_ahead: bool = field(default=False, metadata=_m(
        "Start replicas, not only placeholders, for the forecast one node lead time ahead: on GPU nodes billed "
        "whole, a replica started early costs what a placeholder does and serves as soon as it is ready. The "
        "forecast is then the stabilisation: the predictive strategy releases capacity as soon as the forecast "
        "over the node lead time and the demand observed now allow (never below the replicas observed demand "
        "needs), not after the reactive rule's scale-down window. Applies whether or not placeholders are "
        "enabled; bounded by the budget. Default: false."))
    fill_nodes: bool = field(default=False, metadata=_m(
        "Run a replica on every GPU of the whole nodes the plan needs (up to maxReplicas): a billed GPU costs "
        "the same idle or serving. Only for node pools the target has to itself. The extra replicas count as "
        "speculative GPUs above the reactive counterfactual, within the budget. Default: false."))

    _cel = (CelRule(
        "!has(self.nodePool) || !has(self.affinity) || "
        "!has(self.affinity.requiredDuringSchedulingIgnoredDuringExecution) || "
        "self.affinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms.all(t, "
        f"t.matchExpressions.all(e, e.key != '{KARPENTER_NODEPOOL_LABEL}'))",
        f"nodePool is set and affinity also requires {KARPENTER_NODEPOOL_LABEL}; give the NodePool in one place"),)

    def _check(self) -> None:
        if self.node_pool is not None and (len(self.node_pool) > 63 or not re.match(NODE_POOL_PATTERN, self.node_pool)):
            self._fail("node_pool", f"{excerpt(self.node_pool)} is not a NodePool name; use at most 63 lower-case "
                       "letters, digits, '-' and '.', starting and ending with a letter or digit")
        required = self.affinity.required_during_scheduling_ignored_during_execution if self.affinity else None
        if self.node_pool is not None and required is not None and any(
                e.key == KARPENTER_NODEPOOL_LABEL for term in required.node_selector_terms
                for e in term.match_expressions):
            self._fail("node_pool", f"is set and affinity also requires {KARPENTER_NODEPOOL_LABEL}; give the "
                       "NodePool in one place (nodePool, or the affinity expression)")


@dataclass(frozen=True)
class ModelRef(_Settings):
    name: str | None = field(default=None, metadata=_m(
        "Name of the model in the model store; unset uses the scaler's own name.", min_length=1))
    version: str | None = field(default=None, metadata=_m(
        "Model version to serve; unset follows the store's serving pointer.", min_length=1))
    step_seconds: int = field(default=DEFAULT_MODEL_STEP, metadata=_m(
        "Grid step of the model. Default: 300.", minimum=60, maximum=3600))
    recent_window_seconds: int | None = field(default=None, metadata=_m(
        "Recent history handed to the model at each forecast. Unset: the window the served model reads "
        "(e.g. a week for a weekly seasonal model), or 7 days when the model does not say.",
        minimum=600, maximum=MAX_RECENT_WINDOW_SECONDS))


def parse_rfc3339(text: str, key: str) -> datetime:
    """An RFC 3339 time with its offset (``2025-11-28T09:00:00+01:00``); ConfigError naming ``key`` otherwise."""
    if not isinstance(text, str) or not _RFC3339.match(text):
        raise ConfigError(f"{key}: {excerpt(text)} is not an RFC 3339 time with an offset; write e.g. "
                          "2025-11-28T09:00:00+01:00 or 2025-11-28T08:00:00Z", field=key)
    try:
        return datetime.fromisoformat(text.replace("z", "Z").replace("t", "T"))
    except ValueError as exc:
        raise ConfigError(f"{key}: {excerpt(text)} is not a valid date and time ({exc})", field=key) from exc


@dataclass(frozen=True)
class ScheduledEvent(_Settings):
    name: str = field(metadata=_m("Name shown in the status and reasons, e.g. 'black-friday'.", min_length=1))
    start: str = field(metadata=_m(
        "Start of the window, RFC 3339 with an offset, e.g. 2025-11-28T09:00:00+01:00. The plan is raised from "
        "leadTimes.nodeStartSeconds + controlPeriodSeconds before it, so the capacity is ready at the start.",
        min_length=1, schema={"pattern": RFC3339_PATTERN}))
    end: str = field(metadata=_m("End of the window (exclusive), RFC 3339 with an offset; after start.", min_length=1,
                                 schema={"pattern": RFC3339_PATTERN}))
    min_replicas: int | None = field(default=None, metadata=_m(
        "At least this many replicas during the window (and its lead time). Give this or demandMultiplier.",
        minimum=0, maximum=MAX_REPLICAS))
    demand_multiplier: float | None = field(default=None, metadata=_m(
        "Plan for the demand (forecast, or demand now when reactive) times this during the window. "
        "Give this or minReplicas.", minimum=1, maximum=100))
    recurrence: Recurrence | None = field(default=None, metadata=_m(
        "'weekly' repeats the window every 7 days from start; unset: once."))

    _cel = (
        CelRule("timestamp(self.end) > timestamp(self.start)", "end is not after start; give an end after the start"),
        CelRule("has(self.minReplicas) != has(self.demandMultiplier)",
                "give exactly one of minReplicas and demandMultiplier"),
        CelRule("!has(self.recurrence) || timestamp(self.end) - timestamp(self.start) <= duration('168h')",
                "a weekly event lasts at most 7 days"),
    )

    def _check(self) -> None:
        start, end = self.start_time, self.end_time
        if end <= start:
            self._fail("end", f"({self.end}) is not after start ({self.start}); give an end after the start")
        if (self.min_replicas is None) == (self.demand_multiplier is None):
            self._fail("min_replicas", "and demandMultiplier: give exactly one of them (a replica floor, or a "
                       "factor on the planned demand)")
        if self.recurrence == "weekly" and end - start > WEEK:
            self._fail("end", f"makes the window {end - start} long; a weekly event lasts at most 7 days")

    @property
    def start_time(self) -> datetime:
        return parse_rfc3339(self.start, "start")

    @property
    def end_time(self) -> datetime:
        return parse_rfc3339(self.end, "end")


@dataclass(frozen=True)
class ScalerSpec(_Settings):
    """Everything one PredictiveScaler needs; see each field's description."""

    target: TargetRef = field(metadata=_m("The workload to scale."))
    demand: DemandSignal = field(metadata=_m("Where demand is measured."))
    capacity: Capacity = field(default_factory=Capacity, metadata=_m("What one replica can serve."))
    gpus_per_replica: int = field(default=1, metadata=_m("GPUs each replica requests. Default: 1.", minimum=1,
                                                          maximum=MAX_GPUS_PER_NODE))
    min_replicas: int = field(default=1, metadata=_m(
        "Fewest replicas; 0 allows scaling to zero (never done on missing data). Default: 1.", minimum=0,
        maximum=MAX_REPLICAS))
    max_replicas: int = field(default=10, metadata=_m("Most replicas. Default: 10.", minimum=1, maximum=MAX_REPLICAS))
    quantile: float = field(default=0.95, metadata=_m(
        "Forecast quantile capacity is planned on (0.95 = P95). Default: 0.95.", minimum=0, maximum=1,
        exclusive_minimum=True, exclusive_maximum=True))
    horizon_seconds: int = field(default=1800, metadata=_m(
        "How far ahead to forecast, 5-60 min. Default: 1800.", minimum=300, maximum=3600))
    control_period_seconds: int = field(default=60, metadata=_m(
        "Time between reconciles. Default: 60.", minimum=5, maximum=600))
    missing_data_periods: int = field(default=3, metadata=_m(
        "Control periods of missing or stale demand held before falling back to reactive. Default: 3.",
        minimum=0, maximum=1000))
    lead_times: LeadTimes = field(default_factory=LeadTimes, metadata=_m("How long capacity takes to arrive."))
    reactive: ReactiveBehavior = field(default_factory=ReactiveBehavior, metadata=_m(
        "HPA-compatible behaviour used as the floor and as the fallback."))
    drift: DriftSettings = field(default_factory=DriftSettings, metadata=_m(
        "When the forecast counts as wrong, and how long it must be right again."))
    service: ServiceTracking = field(default_factory=ServiceTracking, metadata=_m(
        "Headroom the predictive strategy adds while demand goes unserved (short bursts a forecast of step means "
        "cannot see); off unless enabled."))
    prewarm: Prewarm = field(default_factory=Prewarm, metadata=_m("Placeholder pods and the speculative budget."))
    model: ModelRef = field(default_factory=ModelRef, metadata=_m("Which forecasting model to use."))
    mode: Mode = field(default="forecast-only", metadata=_m(
        "'forecast-only' computes and reports but touches nothing (the safe way to try it); 'scale' acts; "
        "'keda' writes nothing and serves the decision to a KEDA ScaledObject through the external scaler "
        "gRPC API (trigger type external, scalerName: this scaler's name). Default: forecast-only."))
    events: tuple[ScheduledEvent, ...] = field(default=(), metadata=_m(
        "Known windows (a launch, a sale) that raise the plan: a replica floor or a demand multiplier, from the "
        "node lead time (plus one control period) before start until end. Asked for by the user, so not speculative and not charged to "
        "the prewarm budget; never above maxReplicas.",
        schema={"maxItems": MAX_EVENTS, "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}))

    _cel = (
        CelRule("self.minReplicas <= self.maxReplicas",
                "minReplicas is greater than maxReplicas; lower minReplicas or raise maxReplicas"),
        CelRule("self.demand.kind == 'dcgm-busy-gpus' || (has(self.capacity) && has(self.capacity.requestsPerReplica))",
                "capacity.requestsPerReplica is required unless demand.kind is 'dcgm-busy-gpus'"),
        CelRule("!has(self.prewarm) || !self.prewarm.enabled || self.gpusPerReplica <= self.prewarm.gpusPerNode",
                "gpusPerReplica exceeds prewarm.gpusPerNode; a replica must fit on one node"),
        # An absent model section is the default one (and its default step).
        CelRule(f"self.horizonSeconds % (has(self.model) ? self.model.stepSeconds : {DEFAULT_MODEL_STEP}) == 0",
                "horizonSeconds is not a multiple of model.stepSeconds"),
        # Unique event names and at most MAX_EVENTS are the schema's (list-map keys, maxItems).
        CelRule("!has(self.events) || self.events.all(e, !has(e.minReplicas) || e.minReplicas <= self.maxReplicas)",
                "an event's minReplicas is greater than maxReplicas; lower it or raise maxReplicas"),
        CelRule("self.mode != 'keda' || !has(self.prewarm) || !self.prewarm.enabled",
                "prewarm.enabled is true with mode 'keda'; placeholder pods are managed only in mode 'scale'"),
        CelRule("!has(self.capacity) || !has(self.capacity.slo) || (self.demand.kind != 'concurrency' && "
                "self.demand.kind != 'dcgm-busy-gpus' && (has(self.demand.preset) || "
                "(has(self.demand.servedQuery) && has(self.demand.latencyQuery))))",
                "capacity.slo needs demand.kind requests or tokens and demand.preset (or servedQuery and "
                "latencyQuery)"),
    )

    def _check(self) -> None:
        if self.min_replicas > self.max_replicas:
            self._fail("min_replicas", f"({self.min_replicas}) is greater than maxReplicas ({self.max_replicas}); "
                       "lower minReplicas or raise maxReplicas")
        if self.demand.kind != "dcgm-busy-gpus" and self.capacity.requests_per_replica is None:
            self._fail("capacity.requests_per_replica", f"is required when demand.kind is {self.demand.kind!r}; "
                       f"give the {self.demand_unit} one replica serves within its SLO")
        if self.capacity.slo is not None:
            self._check_learning()
        if self.prewarm.enabled and self.gpus_per_replica > self.prewarm.gpus_per_node:
            self._fail("gpus_per_replica", f"({self.gpus_per_replica}) exceeds prewarm.gpusPerNode "
                       f"({self.prewarm.gpus_per_node}); a replica must fit on one node")
        if len(self.events) > MAX_EVENTS:
            self._fail("events", f"has {len(self.events)} entries; at most {MAX_EVENTS} — use recurrence: weekly "
                       "for repeating windows, and drop the ones that are over")
        for i, ev in enumerate(self.events):
            if ev.min_replicas is not None and ev.min_replicas > self.max_replicas:
                self._fail(f"events[{i}].min_replicas", f"({ev.min_replicas}) of event {excerpt(ev.name)} is greater "
                           f"than maxReplicas ({self.max_replicas}); lower it or raise maxReplicas")
            if ev.name in {e.name for e in self.events[:i]}:
                self._fail(f"events[{i}].name", f"{excerpt(ev.name)} is used by two events; give each a unique name")
        if self.mode == "keda" and self.prewarm.enabled:
            self._fail("prewarm.enabled", "is true with mode 'keda'; placeholder pods are managed only in mode "
                       "'scale' (KEDA scales the replicas) — set prewarm.enabled to false or mode to 'scale'")
        if self.horizon_seconds % self.model.step_seconds:
            self._fail("horizon_seconds", f"({self.horizon_seconds}) is not a multiple of model.stepSeconds "
                       f"({self.model.step_seconds}); choose e.g. {self.model.step_seconds * 6}")

    def _check_learning(self) -> None:
        d = self.demand
        if d.kind in ("concurrency", "dcgm-busy-gpus"):
            self._fail("capacity.slo", f"cannot be learned for demand.kind {d.kind!r}: capacity is learned as a "
                       "served rate (kind requests or tokens); set capacity.requestsPerReplica yourself")
        if d.preset is None and (d.served_query is None or d.latency_query is None):
            self._fail("capacity.slo", "needs the serving history: give demand.preset (vllm, tgi, triton), or "
                       "demand.servedQuery and demand.latencyQuery")
        if self.capacity.slo is not None and self.capacity.slo.latency_p95_ms is not None and \
                d.preset is None and d.latency_quantile_query is None:
            self._fail("capacity.slo.latency_p95_ms", "needs the latency quantile: give demand.latencyQuantileQuery "
                       "or a preset")

    def advisories(self) -> tuple[str, ...]:
        """Valid settings that defeat part of their own purpose: said (backtest notes), not refused.

        A lead time longer than the horizon is one: the forecast ends before the capacity it
        would order arrives, so the plan covers only the horizon's share of the lead time. It is
        not refused, since the horizon still helps and the spec's own bounds allow a node lead
        time (up to 2 h) longer than any horizon (up to 1 h).
        """
        out = []
        pod, node, horizon = (self.lead_times.pod_start_seconds, self.lead_times.node_start_seconds,
                              self.horizon_seconds)
        if pod > horizon:
            out.append(f"spec.leadTimes.podStartSeconds ({pod}) is longer than spec.horizonSeconds ({horizon}): "
                       f"the forecast ends {pod - horizon} s before a replica started now is ready, so replicas "
                       "are planned only on the horizon's forecast; raise horizonSeconds to cover the lead time")
        if node > horizon and (self.prewarm.enabled or self.prewarm.replicas_ahead):
            out.append(f"spec.leadTimes.nodeStartSeconds ({node}) is longer than spec.horizonSeconds ({horizon}): "
                       f"prewarming cannot be ahead of the node lead time — nodes ordered for the forecast arrive "
                       f"up to {node - horizon} s after the demand they were for; raise horizonSeconds (at most "
                       "3600) or check the node lead time")
        return tuple(out)

    # -- derived ---------------------------------------------------------------------------
    @property
    def capacity_per_replica(self) -> float:
        """Demand one replica serves, in the demand's own unit."""
        if self.demand.kind == "dcgm-busy-gpus":
            return self.capacity.gpu_utilization_target * self.gpus_per_replica
        assert self.capacity.requests_per_replica is not None  # checked in _check
        return self.capacity.requests_per_replica

    @property
    def demand_unit(self) -> str:
        return {"dcgm-busy-gpus": "busy GPUs", "tokens": "tokens/s",
                "concurrency": "requests in flight"}.get(self.demand.kind, "req/s")

    # -- dict shape ------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, path: str = "spec") -> ScalerSpec:
        """Build from the camelCase CRD ``spec``; errors name the field, e.g. ``spec.minReplicas``."""
        return _from_dict(cls, data, path)

    def to_dict(self) -> dict[str, Any]:
        """The camelCase shape; ``from_dict(to_dict())`` gives an equal spec. Unset options are left out."""
        return _to_dict(self)


def _from_dict(cls: Any, data: Any, path: str) -> Any:
    err = getattr(cls, "_error", ConfigError)
    if not isinstance(data, Mapping):
        raise err(f"{path}: must be an object (mapping), got {type(data).__name__}", field=path)
    fields = {camel(f.name): f for f in dataclasses.fields(cls)}
    unknown = sorted(set(map(str, data)) - set(fields))
    if unknown:
        raise err(f"{path}.{unknown[0]}: unknown field; {did_you_mean(unknown[0], fields)}known fields here: "
                  f"{', '.join(sorted(fields))}",
                  field=f"{path}.{unknown[0]}")
    kwargs: dict[str, Any] = {}
    for key, f in fields.items():
        if key not in data:
            continue
        value = data[key]
        tp, _ = _unwrap_optional(_hints(cls)[f.name])
        if value is not None and dataclasses.is_dataclass(tp):
            value = _from_dict(tp, value, f"{path}.{key}")
        elif value is not None and typing.get_origin(tp) is tuple:
            item = typing.get_args(tp)[0]
            if isinstance(value, list | tuple) and dataclasses.is_dataclass(item):
                value = tuple(_from_dict(item, v, f"{path}.{key}[{i}]") for i, v in enumerate(value))
        kwargs[f.name] = value
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        where = f"{path}.{exc.field}" if exc.field else path
        message = str(exc)
        if exc.field and message.startswith(exc.field):
            message = where + message[len(exc.field):]
        raise type(exc)(message, field=where) from exc
    except TypeError as exc:  # a required section missing entirely
        missing = [camel(f.name) for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                   and camel(f.name) not in data]
        where = f"{path}.{missing[0]}" if missing else path
        raise err(f"{where}: is required; add it", field=where) from exc


def _to_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is None:
                continue
            out[camel(f.name)] = _to_dict(value)
        return out
    if isinstance(obj, tuple | list):
        return [_to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return dict(obj)
    return obj


# -- schema ----------------------------------------------------------------------------------

def spec_json_schema() -> dict[str, Any]:
    """Structural OpenAPI v3 schema of the CRD ``spec`` (apiextensions.k8s.io/v1), from the dataclasses."""
    return _schema_of(ScalerSpec)


def _schema_of(cls: Any) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        key = camel(f.name)
        tp, optional = _unwrap_optional(_hints(cls)[f.name])
        prop = _schema_of_type(tp)
        md = f.metadata
        if md.get("description"):
            prop["description"] = md["description"]
        for ours, theirs in (("minimum", "minimum"), ("maximum", "maximum")):
            if md.get(ours) is not None:
                prop[theirs] = md[ours]
        if md.get("exclusive_minimum"):
            prop["exclusiveMinimum"] = True
        if md.get("exclusive_maximum"):
            prop["exclusiveMaximum"] = True
        if md.get("min_length"):
            prop["minLength"] = md["min_length"]
        prop.update(md.get("schema") or {})
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        if not has_default and not optional:
            required.append(key)
        elif f.default is not dataclasses.MISSING and f.default is not None and not dataclasses.is_dataclass(tp):
            prop["default"] = f.default
        properties[key] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if cls.__doc__ and cls is ScalerSpec:
        schema["description"] = cls.__doc__.strip().splitlines()[0]
    if required:
        schema["required"] = required
    rules: tuple[CelRule, ...] = getattr(cls, "_cel", ())
    if rules:
        schema["x-kubernetes-validations"] = [{"rule": r.rule, "message": r.message} for r in rules]
    return schema


def _schema_of_type(tp: Any) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if origin is Literal:
        return {"type": "string", "enum": list(typing.get_args(tp))}
    if dataclasses.is_dataclass(tp):
        return _schema_of(tp)
    if origin is tuple:
        return {"type": "array", "items": _schema_of_type(typing.get_args(tp)[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": {"type": "string"}}
    raise TypeError(f"no schema for spec type {tp!r}")

"""The fault matrix as data: one row per scenario — the one source of docs/reliability.md.

Each row says what is injected, what the controller does, and what the test asserts
beyond the invariants every scenario checks (see :data:`COMMON_INVARIANTS`). The tests
run the rows (``test_matrix.py`` and the named special tests); ``render_doc.py``
renders them, and ``test_doc.py`` fails when docs/reliability.md differs.

Periods are control periods of 60 s on an injected clock; ``fault`` is the half-open
range of periods during which the fault is present.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Signals:
    """What must appear within one period of the fault (None: nothing can be written/posted)."""

    condition: str | None  # "Type=Status"
    event: str | None  # Event reason
    metric: str | None  # metric name{label=value}


@dataclass(frozen=True)
class Scenario:
    id: str
    title: str
    kind: str  # metrics | model | api | process | clock | forecast | cluster
    happens: str
    asserts: str
    periods: int = 40
    fault: tuple[int, int] = (5, 15)
    #: Strategy expected in each fault period, by offset from the fault start (last entry repeats);
    #: None: no decision is expected (the step fails before planning).
    during: tuple[str | None, ...] = ()
    #: Periods after the fault ends until ``predictive`` again (exact).
    recovery: int | None = 0
    signals: Signals = Signals(None, None, None)
    #: When the signals are due (each within one period of it): at the first period whose strategy
    #: is not predictive ("change"); at the first faulted period ("fault"); or, for an API outage
    #: during which nothing can be written, the condition and the Event at the first period after
    #: the fault ends and the metric (in-process) at the first faulted period ("fault-end"); or at
    #: the first period in which an API call was answered 409/429/5xx and retried ("first-retry": a
    #: retry of the status write itself can only be reported by the next period's write).
    signals_at: str = "change"
    #: The test that runs it (``test_matrix.py::test_scenario`` unless special).
    test: str = "test_matrix.py::test_scenario"


COMMON_INVARIANTS = (
    "desired replicas never above maxReplicas, on the decision and on the target's /scale",
    "speculative GPUs (decision) and placeholder GPUs (the placeholder Deployment) never above the "
    "prewarm budget",
    "no scale-down in a period whose demand was missing",
    "the placeholder Deployment holds exactly what the last applied decision asked for (none when "
    "reactive), so no stale placeholder survives a period",
    "every request to the API server is one of kube/api_calls.API_CALLS (the RBAC source)",
)

HOLD_THEN_REACTIVE = ("hold", "hold", "hold", "reactive")
METRICS_SIGNALS = Signals("MetricsUnavailable=True", "StrategyChanged",
                          'predictive_scaler_reconcile_errors_total{kind="metrics"}')
MODEL_SIGNALS = Signals("ModelInvalid=True", "StrategyChanged",
                        'predictive_scaler_reconcile_errors_total{kind="model"}')
API_EVENT = "ClusterApiErrors"

SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "baseline", "No fault (control run)", "metrics",
        "demand from the real Prometheus, forecast by the served model; predictive all along",
        "predictive in every period; placeholders appear at least once (so their removal is tested elsewhere)",
        fault=(0, 0), recovery=None),
    Scenario(
        "prometheus-down-10m", "Prometheus down 10 minutes", "metrics",
        "connection refused: hold (no scale-down, no new prewarm), reactive fallback after "
        "missingDataPeriods=3, predictive in the first period after Prometheus is back",
        "hold ×3 then reactive during the outage; predictive 0 periods after",
        during=HOLD_THEN_REACTIVE, signals=METRICS_SIGNALS),
    Scenario(
        "prometheus-503", "Prometheus answering 503", "metrics",
        "each query retried once with backoff on the injected clock, then missing data: hold, then reactive",
        "hold ×3 then reactive; predictive 0 periods after; the proxy saw every retry",
        during=HOLD_THEN_REACTIVE, signals=METRICS_SIGNALS),
    Scenario(
        "prometheus-timeout", "Prometheus timing out", "metrics",
        "no answer within the client timeout (scaled to 0.25 s): retried once, then missing data",
        "hold ×3 then reactive; predictive 0 periods after",
        during=HOLD_THEN_REACTIVE, signals=METRICS_SIGNALS),
    Scenario(
        "prometheus-slow", "Prometheus slower than the control period", "metrics",
        "answers arrive after the client gave up (timeout): a late answer never reaches a decision; "
        "each reconcile stays bounded by attempts × timeout",
        "hold ×3 then reactive; every faulted reconcile took < 2 s of real time",
        during=HOLD_THEN_REACTIVE, signals=METRICS_SIGNALS),
    Scenario(
        "prometheus-empty", "Empty results", "metrics",
        "an empty vector is missing data, never zero demand",
        "hold ×3 then reactive; no period with demand 0",
        during=HOLD_THEN_REACTIVE, signals=METRICS_SIGNALS),
    Scenario(
        "prometheus-duplicated", "Duplicated series", "metrics",
        "two series where one number is expected: refused (aggregate with sum), treated as missing",
        "hold ×3 then reactive; the condition message says to aggregate",
        during=HOLD_THEN_REACTIVE, signals=METRICS_SIGNALS),
    Scenario(
        "prometheus-nan", "NaN samples", "metrics",
        "a NaN sample is missing data, never a number",
        "hold ×3 then reactive",
        during=HOLD_THEN_REACTIVE, signals=METRICS_SIGNALS),
    Scenario(
        "counter-resets", "Counter resets", "metrics",
        "a pod's request counter restarts from 0 inside the window; sum(rate(…)) absorbs it",
        "predictive in every period; demand equals the trace except at the reset, where it is at "
        "most one pod's half scrape low (never zero, never missing)",
        fault=(0, 40), during=("predictive",), recovery=None),
    Scenario(
        "frozen-dcgm", "Frozen DCGM values (sample age)", "metrics",
        "the DCGM exporter keeps answering its last value with old timestamps: stale after "
        "maxAgeSeconds, so missing data",
        "predictive while the newest sample is younger than 180 s, then hold ×3 then reactive; the "
        "condition says the data is old; predictive 0 periods after",
        during=("predictive", *HOLD_THEN_REACTIVE), signals=METRICS_SIGNALS),
    Scenario(
        "api-5xx-2m", "API server 5xx for 2 minutes", "api",
        "every call answers 503: retried with exponential backoff, then kopf.TemporaryError; "
        "the planner never sees it, so the strategy is unchanged",
        "backoff delays grow; the handler asks kopf to retry; strategy in the status before = after; "
        "the ApiDegraded condition counts the 2 failed reconciles and names the 503; "
        "reconcile_errors_total{kind=\"cluster\"} rose; ApiDegraded=False again by the end",
        fault=(5, 7), during=(None,), signals_at="fault-end",
        signals=Signals("ApiDegraded=True", API_EVENT, 'predictive_scaler_api_retries_total{kind="server-error"}')),
    Scenario(
        "api-409-every-2nd", "409 on every second patch", "api",
        "each conflicting write re-reads and retries within the reconcile",
        "every period completes; conflicts were answered and retried; predictive all along; "
        "ApiDegraded=True (RetriesAbsorbed) while they last, False again by the end",
        fault=(5, 35), during=("predictive",), signals_at="first-retry",
        signals=Signals("ApiDegraded=True", API_EVENT, 'predictive_scaler_api_retries_total{kind="conflict"}')),
    Scenario(
        "api-429", "429 throttling", "api",
        "the Retry-After is honoured on the injected clock, then the call succeeds",
        "every period completes; a Retry-After wait was slept; predictive all along; "
        "ApiDegraded=True (RetriesAbsorbed) while it lasts, False again by the end",
        fault=(5, 35), during=("predictive",), signals_at="first-retry",
        signals=Signals("ApiDegraded=True", API_EVENT, 'predictive_scaler_api_retries_total{kind="throttled"}')),
    Scenario(
        "sigkill-20", "Controller killed with SIGKILL mid-reconcile, 20 times", "process",
        "a forked controller is killed between two API writes (scale patched, status not yet); "
        "restarted from the status, it re-decides the same period",
        "after 20 kills the target, placeholder and planner state equal an uninterrupted run's; "
        "invariants hold after every restart",
        periods=30, fault=(0, 30), recovery=None, test="test_processes.py::test_sigkill_mid_reconcile"),
    Scenario(
        "two-replicas", "Two controller replicas", "process",
        "two controllers reconcile the same scaler, interleaved between observe and apply; the "
        "/scale resourceVersion precondition turns the stale write into a 409 that is re-read",
        "no decision above max or the budget; conflicts were raised; the status converges to one "
        "decision", periods=30, fault=(0, 30), recovery=None,
        test="test_processes.py::test_two_replicas"),
    Scenario(
        "corrupt-model", "A corrupt model", "model",
        "the serving model file is truncated on disk: refused (hash), reactive until a good "
        "version is published",
        "reactive from the first faulted period; predictive in the first period after the fix",
        during=("reactive",), signals=MODEL_SIGNALS),
    Scenario(
        "tampered-model", "A tampered model (hash mismatch)", "model",
        "a parameter is changed in place (valid JSON): the sha256 differs from the manifest, refused",
        "reactive from the first faulted period; the condition names the hash; predictive after the fix",
        during=("reactive",), signals=MODEL_SIGNALS),
    Scenario(
        "bad-new-version", "A damaged new version is made serving", "model",
        "the serving pointer moves to a version whose file is damaged: refused, the verified "
        "previous model keeps serving",
        "predictive all along; ModelInvalid=False with reason PreviousVersionKept; a ModelVersionRefused Event",
        during=("predictive",), signals=Signals("ModelInvalid=False", "ModelVersionRefused",
                                                 'predictive_scaler_strategy{strategy="predictive"}')),
    Scenario(
        "clock-ahead-10m", "Clock skew +10 minutes", "clock",
        "the controller's clock runs 10 min ahead of Prometheus: no sample within the lookback, "
        "so missing data — hold, then reactive; predictive once the clocks agree. The empty answer "
        "costs one more query 15 min earlier, which has data, so the reason says possible clock skew",
        "hold ×3 then reactive; predictive 0 periods after; MetricsUnavailable names possible clock "
        "skew in every faulted period",
        during=HOLD_THEN_REACTIVE, signals=METRICS_SIGNALS),
    Scenario(
        "clock-behind-10m", "Clock skew −10 minutes", "clock",
        "the controller's clock jumps 10 min back (planner state stamped in its future): it "
        "decides on the data of its own time, never holds",
        "no hold and no reactive fallback; invariants hold across both jumps",
        during=("predictive",)),
    Scenario(
        "forecast-100x", "A forecast 100× the historical peak", "forecast",
        "the served model forecasts 100× the peak: replicas clamped at maxReplicas, speculation "
        "cut at the budget; the over-forecast drift detector then falls back to reactive",
        "clamped and budget-limited while predictive; reactive (over-forecast drift) before the "
        "fault ends; predictive again within the drift recovery after a good model is back",
        fault=(5, 20), during=("predictive", "predictive", "reactive"), recovery=None,
        signals=Signals("BudgetLimited=True", "BudgetLimited", 'predictive_scaler_budget_limited'),
        signals_at="fault"),
    Scenario(
        "placeholders-pending", "Placeholder pods stuck Pending forever", "cluster",
        "placeholder pods never schedule (no node arrives): they are not counted as capacity and "
        "never grow past the budget; switching to forecast-only deletes the placeholder",
        "placeholders held ≤ budget while Pending; the Deployment is gone in the period after the switch",
        fault=(0, 30), during=("predictive",), recovery=None,
        signals=Signals("Ready=True", None, "predictive_scaler_placeholder_gpus")),
    Scenario(
        "state-machine", "Random faults and restarts (hypothesis)", "process",
        "random sequences of demand, metrics outages, model damage, API outages and restarts "
        "(state only through the status)",
        "every invariant on every step", periods=0, fault=(0, 0), recovery=None,
        test="test_state_machine.py::test_state_machine"),
)

BY_ID = {s.id: s for s in SCENARIOS}

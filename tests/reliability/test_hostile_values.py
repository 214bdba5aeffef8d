"""Hostile values: numbers at the edge of what a float or an int holds, settings that are each valid
but make no sense together, inputs that used to be refused for the wrong reason, and specs whose
simulation would never end.

- **numeric extremes**: denormal, huge, infinite, negative-zero and thousands-of-digits numbers in
  specs, scenarios and flags are refused by the spec's own bounds (the CRD carries the same), naming
  the field — never an OverflowError, never a value that overflows later.
- **nonsense**: a metrics delay the spec cannot work with, typed Parquet columns that are not
  numbers, setting names that are not text, a lead time longer than the horizon (said, not refused).
- **wrong reasons**: lower-case RFC 3339, RFC 2822 dates, epoch micro- and nanoseconds, swapped
  columns, a Parquet timestamp index, a sizing that overflows maxReplicas: accepted, or refused for
  what they are.
- **unbounded input**: schema-valid specs whose backtest would run for hours are refused before any
  simulation, naming the setting, within 10 s (run as a child process that must end).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from predictive_scaler.spec import MAX_REPLICAS
from tests.reliability.hostile import START, STEP, Case, Ran, check, csv, ids, rows

DAY = 288  # steps of 5 minutes
SHORT = rows(DAY)
LAST = SHORT[-1][0]

SCALER = "backtest --trace {d}/good.csv --scaler {d}/scaler.yaml --no-progress --report {d}/report"
SCENARIO = "backtest --trace {d}/good.csv --scenario {d}/s.yaml --no-progress --report {d}/report"
#: A short backtest of the predictive policy alone: accepted runs that must say something.
SHORT_RUN = " --evaluation 1d --policies predictive"
#: The scenario of a short run: one quick forecaster.
QUICK = "forecasters: [persistence]\n"
PROMETHEUS = "backtest --prometheus http://127.0.0.1:9 --scaler {d}/scaler.yaml --no-progress"
TRAIN = "train --trace {d}/t.csv --out {store} --name web --models persistence"
TRAIN_PQ = "train --trace {d}/t.parquet --out {store} --name web --models persistence"
FORECAST = "forecast --model {store}/web --trace {d}/t.csv --json"
FORECAST_PQ = "forecast --model {store}/web --trace {d}/t.parquet --json"
BASE: dict[str, Any] = {"target": {"name": "web"}, "demand": {"kind": "requests", "query": "sum(rate(x[2m]))"},
                        "capacity": {"requestsPerReplica": 10}}
#: An event inside the evaluated week of good.csv (training is its first 14 days).
EVENT = {"name": "launch", "start": "2024-01-16T00:00:00Z", "end": "2024-01-17T00:00:00Z"}


def manifest(**spec: Any) -> str:
    """A PredictiveScaler ml/web whose spec is BASE with ``spec``'s top-level fields laid over it."""
    return yaml.safe_dump({"apiVersion": "autoscaling.predictive-scaler.io/v1alpha1", "kind": "PredictiveScaler",
                           "metadata": {"name": "web", "namespace": "ml"}, "spec": {**BASE, **spec}})


def raw_manifest(spec_lines: str) -> str:
    """A manifest whose spec is written out by hand (numbers YAML would not dump as written)."""
    return ("apiVersion: autoscaling.predictive-scaler.io/v1alpha1\nkind: PredictiveScaler\n"
            "metadata: {name: web, namespace: ml}\nspec:\n  target: {name: web}\n"
            "  demand: {kind: requests, query: 'sum(rate(x[2m]))'}\n" + spec_lines)


def no_report(ran: Ran, work: Path) -> None:
    assert not (work / "report").exists(), "a refused backtest wrote a report"


def spec_case(id: str, *says: str, text: str | None = None, **fields: Any) -> Case:
    """A --scaler manifest refused when it is read, naming the field."""
    body = raw_manifest(text) if text is not None else manifest(**fields)
    return Case(id, SCALER, 2, ("ml/web has an invalid spec", *says, "fix the manifest"), {"scaler.yaml": body},
                then=no_report)


def scenario_case(id: str, text: str, *says: str) -> Case:
    """A scenario setting refused, naming the file and the setting."""
    return Case(id, SCENARIO, 2, ("s.yaml", *says), {"s.yaml": text}, then=no_report)


def parquet(frame: Callable[[], pd.DataFrame]) -> Callable[[Path], None]:
    return lambda path: frame().to_parquet(path)


def frame(values: Callable[[pd.DatetimeIndex], Any], n: int = DAY) -> pd.DataFrame:
    t = pd.date_range(START, periods=n, freq=f"{STEP}s")
    return pd.DataFrame({"timestamp": t, "value": values(t)})


def issued_at(expected: str) -> Callable[[Ran, Path], None]:
    """The forecast of an accepted trace is issued at the right UTC time."""
    def then(ran: Ran, work: Path) -> None:
        import json

        assert pd.Timestamp(json.loads(ran.out)["issued_at"]) == pd.Timestamp(expected), ran.out
    return then


def in_report(*fragments: str) -> Callable[[Ran, Path], None]:
    def then(ran: Ran, work: Path) -> None:
        report = (work / "report" / "report.md").read_text()
        for f in fragments:
            assert f in report, f"report.md lacks {f!r}"
    return then


def stamped(fmt: Callable[[pd.Timestamp], str], pairs: list[tuple[str, float]] = SHORT) -> list[tuple[str, float]]:
    return [(fmt(pd.Timestamp(t)), v) for t, v in pairs]


NINES = "9" * 5000  # past Python's 4,300-digit limit on reading a whole number from text
LONG = "9" * 4000  # within it: reads, but overflows a float

NUMERIC_EXTREMES: list[Case] = [
    spec_case("capacity-denormal", "spec.capacity.requestsPerReplica", "at least 1e-06", "4.94066e-324",
              capacity={"requestsPerReplica": 5e-324}),
    spec_case("capacity-1e-300", "spec.capacity.requestsPerReplica", "at least 1e-06", "got 1e-300",
              capacity={"requestsPerReplica": 1e-300}),
    spec_case("capacity-1e308", "spec.capacity.requestsPerReplica", "at most 1000000000",
              capacity={"requestsPerReplica": 1e308}),
    spec_case("capacity-negative-zero", "spec.capacity.requestsPerReplica", "greater than 0 (at least 1e-06), got 0;",
              text="  capacity: {requestsPerReplica: -0.0}\n"),
    spec_case("price-1e308", "spec.prewarm.budget.pricePerGpuHour", "at most 10000000", "got 1e+308",
              prewarm={"budget": {"pricePerGpuHour": 1e308}}),
    spec_case("budget-1e300-gpus", "spec.prewarm.budget.maxGpus", "at most 6400000", "got 1e+300",
              text="  capacity: {requestsPerReplica: 10}\n  prewarm: {budget: {maxGpus: 1.0e+300}}\n"),
    spec_case("cost-1e308", "spec.prewarm.budget.maxCostPerHour", "at most 64000000000000",
              prewarm={"budget": {"maxCostPerHour": 1e308, "pricePerGpuHour": 2.5}}),
    scenario_case("spec-4000-digit-max-replicas", f"spec: {{maxReplicas: {LONG}}}\n", "spec.maxReplicas",
                  f"at most {MAX_REPLICAS}", "a 4,000-digit number"),
    scenario_case("scenario-5000-digit-number", f"peak_replicas: {NINES}\n", "holds a number too long to read",
                  "4300 digits"),
    scenario_case("peak-replicas-infinite", "peak_replicas: .inf\n", "peak_replicas must be a whole number, got inf"),
    scenario_case("evaluation-400-digit-seconds", f"evaluation: {'9' * 400}\n", "evaluation",
                  "of a 400-digit number of seconds", "not a usable length of time"),
    scenario_case("capacity-per-replica-1e308", "capacity_per_replica: 1.0e+308\n", "capacity_per_replica must be in",
                  "[1e-06, 1e+09]", "got 1e+308"),
    scenario_case("capacity-per-replica-denormal", "capacity_per_replica: 1.0e-320\n",
                  "capacity_per_replica must be in"),
    scenario_case("cluster-price-1e308", "cluster: {price_per_gpu_hour: 1.0e+308}\n", "cluster.price_per_gpu_hour",
                  "1e+308", "more than the 1e+07"),
    scenario_case("cluster-gpus-per-node-huge", "cluster: {gpus_per_node: 100000000}\n", "cluster.gpus_per_node",
                  "more than the 64 GPUs a node may have"),
    scenario_case("demand-unit-1e308", "demand_unit_seconds: 1.0e+308\n", "demand_unit_seconds 1e+308 is more than a week"),
    scenario_case("cluster-budget-1e300", "cluster_budget: {maxGpus: 1.0e+300}\n", "cluster_budget.maxGpus",
                  "must be at most 6.4e+06"),
    Case("days-infinite", PROMETHEUS + " --days inf", 2, ("--days inf is more than the 3650", "days of history"),
         {"scaler.yaml": manifest()}),
    Case("days-1e9", PROMETHEUS + " --days 1e9", 2, ("--days 1e+09 is more than the 3650",), {"scaler.yaml": manifest()}),
    Case("days-nan", PROMETHEUS + " --days nan", 2, ("--days nan is not a number",), {"scaler.yaml": manifest()}),
    Case("timeout-1e9", PROMETHEUS + " --timeout 1e9", 2, ("--timeout 1e+09 is more than the 3600",),
         {"scaler.yaml": manifest()}),
    Case("evaluate-horizons-infinite", "evaluate --trace {d}/good.csv --models persistence --horizons 10m,inf", 2,
         ("--horizons: duration 'inf' is not a usable length of time",)),
]

NONSENSE: list[Case] = [
    Case("node-lead-time-beyond-horizon", SCALER + " --scenario {d}/s.yaml" + SHORT_RUN, 0,
         ("spec.leadTimes.nodeStartSeconds (7200) is longer than spec.horizonSeconds (300)",
          "prewarming cannot be ahead of the node lead time"),
         {"scaler.yaml": manifest(leadTimes={"nodeStartSeconds": 7200}, horizonSeconds=300), "s.yaml": QUICK},
         then=in_report("is longer than spec.horizonSeconds (300)")),
    Case("pod-lead-time-beyond-horizon", SCENARIO + SHORT_RUN, 0,
         ("spec.leadTimes.podStartSeconds (600) is longer than spec.horizonSeconds (300)",),
         {"s.yaml": QUICK + "spec: {horizonSeconds: 300, leadTimes: {podStartSeconds: 600, nodeStartSeconds: 600}}\n"}),
    scenario_case("metrics-delay-one-day", "cluster: {metrics_delay_s: 1d}\n", "cluster.metrics_delay_s (1d)",
                  "longer than spec.demand.maxAgeSeconds (180 s)", "every demand value the policies see would be stale"),
    scenario_case("metrics-delay-beyond-horizon",
                  "cluster: {metrics_delay_s: 10m}\nspec: {horizonSeconds: 600, demand: {maxAgeSeconds: 3600}}\n",
                  "cluster.metrics_delay_s (10m) is not shorter than spec.horizonSeconds (600 s)",
                  "ends before the time it is made"),
    scenario_case("cold-start-longer-than-a-day", "cluster: {image_pull_s: 1d}\n", "cluster: a cold start",
                  "takes 86520 s", "more than the 7200 s (2h)"),
    scenario_case("capacity-below-a-replica-at-target", "capacity_per_replica: 0.000001\n",
                  "capacity_per_replica 1e-06 planned at a target utilisation of 0.8 is 8e-07",
                  "spec.capacity.requestsPerReplica"),
    scenario_case("setting-name-integer", "1: x\n", "1 (int) is not a setting name", "quote a key"),
    scenario_case("setting-name-boolean", "yes: 3\n", "True (bool) is not a setting name"),
    scenario_case("cluster-key-integer", "cluster: {4: gpus_per_node}\n", "cluster: 4 (int) is not a setting name"),
    scenario_case("measurement-key-null", "measurement: {~: 30s}\n", "measurement: None (NoneType) is not a setting name"),
    spec_case("spec-key-integer", "spec.1: unknown field", text="  capacity: {requestsPerReplica: 10}\n  1: x\n"),
    Case("parquet-boolean-values", TRAIN_PQ, 2,
         ("t.parquet", "the value column is of type bool", "would read as 0/1 demand", "float or integer column"),
         {"t.parquet": parquet(lambda: frame(lambda t: np.arange(len(t)) % 2 == 0))}),
    Case("parquet-datetime-values", TRAIN_PQ, 2, ("t.parquet", "the value column is of type datetime64", "(times)"),
         {"t.parquet": parquet(lambda: frame(lambda t: t))}),
    Case("parquet-duration-values", TRAIN_PQ, 2, ("t.parquet", "of type timedelta64", "(durations)"),
         {"t.parquet": parquet(lambda: frame(lambda t: pd.to_timedelta(np.arange(len(t)), unit="s")))}),
    Case("parquet-category-values", TRAIN_PQ, 2, ("t.parquet", "of type category", "(categories)"),
         {"t.parquet": parquet(lambda: frame(lambda t: pd.Categorical(["low", "high"] * (len(t) // 2))))}),
    Case("parquet-decimal-comma-text", TRAIN_PQ, 2,
         ("t.parquet", "row 1", "value '1,5' is not a number", "the value column holds str values"),
         {"t.parquet": parquet(lambda: frame(lambda t: ["1,5"] * len(t)))}),
]

WRONG_REASONS: list[Case] = [
    Case("rfc3339-lower-case-accepted", FORECAST, 0, ('"issued_at"',),
         {"t.csv": csv(stamped(lambda t: t.strftime("%Y-%m-%dt%H:%M:%Sz")))}, then=issued_at(LAST)),
    Case("rfc3339-lower-case-offset-accepted", FORECAST, 0, ('"issued_at"',),  # +01:00: an hour earlier in UTC
         {"t.csv": csv(stamped(lambda t: t.strftime("%Y-%m-%dt%H:%M:%S+01:00")))},
         then=issued_at(str(pd.Timestamp(LAST) - pd.Timedelta(hours=1)))),
    Case("rfc2822-quoted", TRAIN, 2, ("t.csv", "row 2", "is an RFC 2822 date", "not ISO-8601",
                                      "write ISO-8601 (2024-01-31T12:00:00Z)"),
         {"t.csv": csv(stamped(lambda t: '"' + t.strftime("%a, %d %b %Y %H:%M:%S +0000") + '"'))}),
    Case("rfc2822-unquoted", TRAIN, 2, ("t.csv", "row 2", "'Mon'", "one field more than the 'timestamp,value' header",
                                        "RFC 2822", "write ISO-8601"),
         {"t.csv": csv(stamped(lambda t: t.strftime("%a, %d %b %Y %H:%M:%S GMT")))}),
    Case("day-month-year", TRAIN, 2, ("t.csv", "row 2", "'01/01/2024 00:00' is a date, but not ISO-8601",
                                      "2 January in others"),
         {"t.csv": csv(stamped(lambda t: t.strftime("%d/%m/%Y %H:%M")))}),
    Case("year-ten-thousand", TRAIN, 2, ("t.csv", "row 3", "'10000-01-01T00:00:00Z'", "outside the years 1678–2261"),
         {"t.csv": "timestamp,value\n2024-01-01T00:00:00Z,1\n10000-01-01T00:00:00Z,1\n"}),
    Case("epoch-nanoseconds", TRAIN, 2, ("t.csv", "row 2", "1704067200000000000 looks like epoch nanoseconds",
                                         "divide by 1000000000"),
         {"t.csv": "timestamp,value\n1704067200000000000,1\n1704067500000000000,1\n"}),
    Case("epoch-microseconds", TRAIN, 2, ("t.csv", "row 2", "looks like epoch microseconds", "divide by 1000000"),
         {"t.csv": "timestamp,value\n1704067200000000,1\n1704067500000000,1\n"}),
    Case("epoch-milliseconds-before-1970", TRAIN, 2, ("t.csv", "row 2", "-1000000000000 looks like epoch milliseconds"),
         {"t.csv": "timestamp,value\n-1000000000000,1\n-999999700000,1\n"}),
    Case("epoch-thirty-digits", TRAIN, 2, ("t.csv", "row 2", "'999999999999999999999999999999'",
                                           "outside the years 1678–2261"),
         {"t.csv": "timestamp,value\n" + "9" * 30 + ",1\n" + "9" * 31 + ",1\n"}),
    Case("timestamps-nan-and-inf", TRAIN, 2, ("t.csv", "row 2", "cannot read timestamp 'nan'", "write ISO-8601"),
         {"t.csv": "timestamp,value\nnan,1\ninf,1\n"}),
    Case("value-4000-digits", TRAIN, 2, ("t.csv", "row 2", "(4,000 characters) is infinite (or too large for a number)"),
         {"t.csv": csv([(SHORT[0][0], LONG), *SHORT[1:]])}),
    Case("columns-swapped-accepted", FORECAST, 0, ('"issued_at"',),
         {"t.csv": csv([(v, t) for t, v in SHORT], "value,timestamp")}, then=issued_at(LAST)),
    Case("parquet-timestamp-index-accepted", FORECAST_PQ, 0, ('"issued_at"',),
         {"t.parquet": parquet(lambda: frame(lambda t: 100.0 + np.arange(len(t)) % 7).set_index("timestamp"))},
         then=issued_at(LAST)),
    Case("parquet-value-without-times", TRAIN_PQ, 2, ("t.parquet", "wrong columns ['value']", "no timestamp column",
                                                      "write the timestamps as a 'timestamp' column"),
         {"t.parquet": parquet(lambda: frame(lambda t: np.ones(len(t)))[["value"]])}),
    scenario_case("sized-beyond-max-replicas", "capacity_per_replica: 0.00001\n", "spec.maxReplicas",
                  "max_replicas is unset, so it is 2 × the replicas the training window's P95 needs at "
                  "capacity_per_replica 1e-05", "or set max_replicas"),
]

UNBOUNDED_INPUT: list[Case] = [
    Case("event-floor-of-max-replicas", SCALER, 2,
         ("scaler.yaml", "spec.events[0].minReplicas 100,000", "replica-ticks", "more than the 1e+09"),
         {"scaler.yaml": manifest(maxReplicas=MAX_REPLICAS, events=[{**EVENT, "minReplicas": MAX_REPLICAS}])},
         then=no_report, timeout=10),
    Case("min-replicas-of-max-replicas", SCALER, 2, ("scaler.yaml", "min_replicas 100,000 (spec.minReplicas)",
                                                     "replica-ticks", "run fewer policies (--policies)"),
         {"scaler.yaml": manifest(maxReplicas=MAX_REPLICAS, minReplicas=MAX_REPLICAS)}, then=no_report, timeout=10),
    Case("static-fleet-of-a-tiny-capacity", SCENARIO, 2,
         ("s.yaml", "the static policy", "the training window's peak ÷ capacity_per_replica", "replica-ticks"),
         {"s.yaml": "capacity_per_replica: 0.00002\nmax_replicas: 10\npolicies: [static]\n"},
         then=no_report, timeout=10),
    Case("frontier-up-to-max-replicas", SCENARIO + " --frontier", 2,
         ("s.yaml", "the static frontier's fleet sizes up to max_replicas 100,000", "replica-ticks"),
         {"s.yaml": f"max_replicas: {MAX_REPLICAS}\npolicies: [reactive, static]\n"}, then=no_report, timeout=10),
    # A refusal quotes a short excerpt of what it refuses, never the whole of a huge value.
    Case("a-half-megabyte-mode-is-quoted-short", SCALER, 2, ("mode", "(500,000 characters)"),
         {"scaler.yaml": manifest(mode="x" * 500_000)}, then=lambda ran, work: short_output(ran), timeout=10),
    Case("a-100-kb-models-flag-is-quoted-short", "train --trace {d}/good.csv --out {store} --name web --models "
         + "y" * 100_000, 2, ("unknown model", "(100,000 characters)"), then=lambda ran, work: short_output(ran),
         timeout=10),
    Case("a-huge-scenario-preset-is-quoted-short", SCENARIO, 2, ("unknown preset", "(300,000 characters)"),
         {"s.yaml": "preset: " + "z" * 300_000 + "\n"}, then=lambda ran, work: short_output(ran), timeout=10),
]


def short_output(ran: Ran) -> None:
    assert len(ran.text) < 4000, f"{len(ran.text):,} characters of output: the input was echoed back"

CASES: dict[str, list[Case]] = {
    "numeric extremes": NUMERIC_EXTREMES,
    "nonsense": NONSENSE,
    "wrong reasons": WRONG_REASONS,
    "unbounded input": UNBOUNDED_INPUT,
}
ALL = [c for cases in CASES.values() for c in cases]


@pytest.mark.parametrize("case", ALL, ids=ids(ALL))
def test_hostile_value(case: Case, work: Path) -> None:
    check(case, work)


def test_every_class_is_large_enough() -> None:
    sizes = {name: len(cases) for name, cases in CASES.items()}
    assert all(sizes[name] >= 10 for name in ("numeric extremes", "nonsense", "wrong reasons")), sizes
    assert sizes["unbounded input"] >= 3 and all(c.timeout == 10 for c in UNBOUNDED_INPUT), sizes

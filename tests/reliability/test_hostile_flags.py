"""Hostile scenarios and flags: every numeric setting zero, negative, huge and of the wrong type;
unknown keys and names anywhere, answered with "did you mean". Each is refused before any work
(no report is written, the store is unchanged); the runs that are accepted say what they assumed
("prewarm disabled: no budget", demand over maxReplicas) instead of printing a silent verdict.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from tests.reliability.hostile import BOMB, Case, Ran, check, csv, ids, rows

BACKTEST = "backtest --scenario {d}/s.yaml --trace {d}/good.csv --no-progress --report {d}/report"
FLAGS = "backtest --trace {d}/good.csv --no-progress --report {d}/report"
TRAIN = "train --trace {d}/good.csv --out {store} --name web --models persistence"
EVALUATE = "evaluate --trace {d}/good.csv --models persistence"
FORECAST = "forecast --model {store}/web --trace {d}/good.csv"
#: A kubeconfig that stops the controller before it starts, should a setting slip through.
CONTROLLER = "controller --kubeconfig {d}/kc --prometheus-url http://127.0.0.1:9 --model-store {store}"


def no_report(ran: Ran, work: Path) -> None:
    assert not (work / "report").exists(), "a refused backtest wrote a report"


def scenario(text: str, *says: str, id: str) -> Case:
    """A scenario setting refused: the message names the file, the setting, and where to look."""
    where = ("s.yaml",) if "[[[" in text else ("s.yaml", "fix it in the scenario file")
    return Case(id, BACKTEST, 2, (*where, *says), {"s.yaml": text}, then=no_report)


def flag(id: str, argv: str, *says: str) -> Case:
    return Case(id, argv, 2, says, then=no_report if argv.startswith("backtest") else None)


def says_in_report_and_output(*fragments: str) -> Callable[[Ran, Path], None]:
    def then(ran: Ran, work: Path) -> None:
        report = (work / "report" / "report.md").read_text()
        for f in fragments:
            assert f in report, f"report.md lacks {f!r}"
            assert f in ran.out, f"the CLI output lacks {f!r}"
    return then


def json_notes(*fragments: str) -> Callable[[Ran, Path], None]:
    def then(ran: Ran, work: Path) -> None:
        notes = " ".join(json.loads(ran.out)["scenario"]["notes"])
        for f in fragments:
            assert f in notes, f"--json notes lack {f!r}: {notes}"
    return then


DEEP = "a: " + "[" * 3000 + "]" * 3000 + "\n"

SMALL = "forecasters: [persistence]\npolicies: [predictive, reactive]\nevaluation: 6h\n"

CASES: list[Case] = [
    # -- the examples ---------------------------------------------------------------------
    flag("evaluation-zero", FLAGS + " --evaluation 0", "--evaluation '0' is not a positive duration", "--evaluation 7d"),
    flag("evaluation-negative", FLAGS + " --evaluation=-1d", "--evaluation '-1d' is not a positive duration"),
    scenario("evaluation: -7d\n", "evaluation: '-7d' is not a positive duration", "7d", id="scenario-evaluation-negative"),
    flag("evaluation-unreadable", FLAGS + " --evaluation soon", "--evaluation", "cannot read duration 'soon'", "30s, 10m"),
    scenario("evaluation: 30m\n", "evaluation 30m is too short", "at least 1h", "null to walk forward",
             id="scenario-evaluation-one-minute-ish"),
    scenario("evaluation: 1e400d\n", "evaluation", "not a usable length of time", id="scenario-evaluation-overflow"),
    scenario("evaluation: .inf\n", "evaluation", "finite", id="scenario-evaluation-infinite"),
    scenario("evaluation: true\n", "evaluation", "a duration must be", "got True", id="scenario-evaluation-bool"),
    scenario("forecasters: [persistence, arimaa]\n", "unknown forecaster 'arimaa'", "did you mean 'arima'",
             "choose from", id="scenario-forecaster-misspelt"),
    scenario("forecasters: []\n", "forecasters: none given", "choose from", id="scenario-forecasters-empty"),
    Case("prewarm-disabled-no-budget", BACKTEST, 0, ("prewarm disabled: no budget", "spec.prewarm.budget.maxGpus"),
         {"s.yaml": SMALL + "spec:\n  prewarm:\n    enabled: true\n"}, store_may_change=False,
         then=says_in_report_and_output("prewarm disabled: no budget")),
    Case("prewarm-disabled-budget-zero", BACKTEST.replace("--report {d}/report", "--json"), 0, ('"notes"',),
         {"s.yaml": SMALL + "spec:\n  prewarm:\n    budget:\n      maxGpus: 0\n"},
         then=json_notes("prewarm disabled: no budget (maxGpus is 0)")),
    Case("demand-over-max-replicas", BACKTEST, 0, ("demand never fits under maxReplicas 2", "needs up to", "raise max_replicas"),
         {"s.yaml": SMALL + "max_replicas: 2\nspec:\n  prewarm:\n    budget:\n      maxGpus: 4\n"},
         then=says_in_report_and_output("under maxReplicas 2")),
    # -- scenario numbers: zero, negative, huge, wrong type ----------------------------------------
    scenario("control_period: 0\n", "control_period: 0 is not a positive duration", id="control-period-zero"),
    scenario("control_period: -60s\n", "control_period", "not a positive duration", id="control-period-negative"),
    scenario("control_period: 10h\n", "control_period must be whole seconds in 1s..10m", id="control-period-huge"),
    scenario("control_period: [1]\n", "control_period: a duration must be", id="control-period-list"),
    scenario("peak_replicas: 0\n", "peak_replicas must be ≥ 1, got 0", id="peak-replicas-zero"),
    scenario("peak_replicas: -3\n", "peak_replicas must be ≥ 1", id="peak-replicas-negative"),
    scenario("peak_replicas: 1000000000000\n", "spec.maxReplicas", "at most 100000", id="peak-replicas-huge"),
    scenario("peak_replicas: ten\n", "peak_replicas must be a whole number, got 'ten'", id="peak-replicas-text"),
    scenario("peak_replicas: 2.5\n", "peak_replicas must be a whole number, got 2.5", id="peak-replicas-fraction"),
    scenario("capacity_per_replica: 0\n", "capacity_per_replica must be > 0", id="capacity-zero"),
    scenario("capacity_per_replica: -1\n", "capacity_per_replica must be > 0", id="capacity-negative"),
    scenario("capacity_per_replica: .nan\n", "capacity_per_replica must be a finite number", id="capacity-nan"),
    scenario("capacity_per_replica: lots\n", "capacity_per_replica must be a finite number, got 'lots'",
             id="capacity-text"),
    scenario("max_replicas: 0\n", "max_replicas (0) must be ≥ min_replicas", id="max-replicas-zero"),
    scenario("max_replicas: 100000000000\n", "spec.maxReplicas", "at most 100000", id="max-replicas-huge"),
    scenario("min_replicas: -1\n", "min_replicas must be ≥ 0", id="min-replicas-negative"),
    scenario("min_replicas: 5\nmax_replicas: 2\n", "max_replicas (2) must be ≥ min_replicas (5)", id="min-above-max"),
    scenario("training: 0\n", "training: 0 is not a positive duration", id="training-zero"),
    Case("training-longer-than-trace", BACKTEST, 2, ("100d training window", "a trace of at least 101d",
                                                      "a shorter training window in the scenario"),
         {"s.yaml": "training: 100d\n"}, then=no_report),
    scenario("retrain_every: 0\n", "retrain_every: 0 is not a positive duration", id="retrain-every-zero"),
    scenario("quantile: 1.0\n", "quantile must be in [0.5, 1)", id="quantile-one"),
    scenario("quantile: 0\n", "quantile must be in [0.5, 1)", id="quantile-zero"),
    scenario("quantile: high\n", "quantile must be a finite number, got 'high'", id="quantile-text"),
    scenario("target_utilization: 0\n", "target_utilization must be in [0.1, 1]", id="utilization-zero"),
    scenario("target_utilization: 5\n", "target_utilization must be in [0.1, 1]", id="utilization-huge"),
    scenario("demand_unit_seconds: 0\n", "demand_unit_seconds must be > 0", id="demand-unit-zero"),
    scenario("demand_unit_seconds: -60\n", "demand_unit_seconds must be > 0", id="demand-unit-negative"),
    scenario("horizons: [0]\n", "horizons: 0 is not a positive duration", id="horizon-zero"),
    scenario("horizons: [2h]\n", "horizon 2h is outside 5m..60m", id="horizon-huge"),
    scenario("horizons: 5\n", "horizons must be a list", id="horizons-not-a-list"),
    scenario("cluster: {gpus_per_node: 0}\n", "gpus_per_node must be a whole number ≥ 1, got 0", id="gpus-per-node-zero"),
    scenario("cluster: {gpus_per_node: four}\n", "gpus_per_node must be a whole number ≥ 1, got 'four'",
             id="gpus-per-node-text"),
    scenario("cluster: {image_pull_s: -5m}\n", "cluster.image_pull_s", "not a positive duration", id="image-pull-negative"),
    scenario("cluster: {price_per_gpu_hour: -1}\n", "price_per_gpu_hour must be a finite number ≥ 0",
             id="price-negative"),
    scenario("cluster: 5\n", "cluster must be a mapping", id="cluster-not-a-mapping"),
    # -- unknown keys and names, with did-you-mean ---------------------------------------------------
    scenario("evaluaton: 7d\n", "unknown setting(s) evaluaton", "did you mean 'evaluation'", id="unknown-key-top"),
    scenario("cluster: {gpus_per_nod: 4}\n", "unknown setting(s) gpus_per_nod", "did you mean 'gpus_per_node'",
             id="unknown-key-cluster"),
    scenario("spec: {maxReplica: 3}\n", "spec.maxReplica: unknown field", "did you mean 'maxReplicas'",
             id="unknown-key-spec"),
    scenario("spec: {prewarm: {budgt: {maxGpus: 3}}}\n", "spec.prewarm.budgt: unknown field", "did you mean 'budget'",
             id="unknown-key-spec-nested"),
    scenario("policies: [reactiv]\n", "unknown policy 'reactiv'", "did you mean 'reactive'", id="unknown-policy"),
    scenario("preset: karpentr\n", "unknown preset 'karpentr'", "did you mean 'karpenter'", id="unknown-preset"),
    scenario("spec: {prewarm: {budget: {maxGpus: -1}}}\n", "spec.prewarm.budget.maxGpus", "at least 0",
             id="spec-budget-negative"),
    scenario("spec: {quantile: 2}\n", "spec.quantile", "less than 1", id="spec-quantile-huge"),
    scenario("spec: 3\n", "spec must be a mapping", id="spec-not-a-mapping"),
    # -- the scenario file itself --------------------------------------------------------------------
    scenario("- a\n- b\n", "expected a mapping of settings, got list", id="scenario-is-a-list"),
    scenario("[[[\n", "not valid YAML", "fix the syntax", id="scenario-not-yaml"),
    Case("scenario-alias-bomb", BACKTEST, 2, ("s.yaml", "YAML aliases expand to", "without anchors"),
         {"s.yaml": BOMB + "forecasters: *h\n"}, then=no_report),
    Case("scenario-nested-too-deep", BACKTEST, 2, ("s.yaml", "nested too deeply"), {"s.yaml": DEEP}, then=no_report),
    Case("scenario-binary", BACKTEST, 2, ("s.yaml", "cannot be read as UTF-8"), {"s.yaml": b"\xff\xfe\x00\x01"},
         then=no_report),
    Case("scenario-is-a-directory", BACKTEST.replace("{d}/s.yaml", "{d}"), 2,
         ("is a directory, not a scenario file", "backtests/default.yaml"), then=no_report),
    Case("scenario-missing", BACKTEST.replace("s.yaml", "nope.yaml"), 2, ("nope.yaml", "no such scenario file"),
         then=no_report),
    # -- flags of the other commands -----------------------------------------------------------------------
    flag("peak-replicas-flag-zero", FLAGS + " --peak-replicas 0", "--peak-replicas:", "peak_replicas must be ≥ 1",
         "give another value"),
    flag("capacity-flag-negative", FLAGS + " --capacity-per-replica -1", "--capacity-per-replica:",
         "capacity_per_replica must be > 0"),
    flag("capacity-flag-nan", FLAGS + " --capacity-per-replica nan", "capacity_per_replica must be > 0, got nan"),
    flag("policies-flag-misspelt", FLAGS + " --policies predictive,reactiv", "--policies:", "did you mean 'reactive'"),
    flag("policies-flag-empty", FLAGS + " --policies ,", "no policies"),
    flag("timezone-flag-unknown", FLAGS + " --timezone Mars/Olympus", "--timezone 'Mars/Olympus' is not a time zone"),
    flag("end-without-prometheus", FLAGS + " --end 2024-01-01", "--end applies to --prometheus history only"),
    flag("prometheus-without-scaler", "backtest --prometheus http://127.0.0.1:9 --no-progress",
         "--prometheus needs --scaler FILE.yaml"),
    flag("scaler-file-is-a-directory", "backtest --prometheus http://127.0.0.1:9 --scaler {d} --no-progress",
         "cannot read scalers file", "Is a directory"),
    flag("train-quantile-huge", TRAIN + " --quantile 1.5", "quantile 1.5 must be in [0.5, 1)", "e.g. 0.95"),
    flag("train-quantile-nan", TRAIN + " --quantile nan", "quantile nan must be in [0.5, 1)"),
    flag("train-quantile-negative", TRAIN + " --quantile=-1", "quantile -1.0 must be in [0.5, 1)"),
    flag("train-horizon-zero", TRAIN + " --horizon 0", "horizon 0s is outside 5m–60m"),
    flag("train-horizon-huge", TRAIN + " --horizon 2h", "horizon 2h is outside 5m–60m"),
    flag("train-horizon-negative", TRAIN + " --horizon=-30m", "is outside 5m–60m"),
    flag("train-keep-zero", TRAIN + " --keep 0", "keep at least 1 version", "--keep 1 or more"),
    flag("train-keep-negative", TRAIN + " --keep=-5", "keep at least 1 version"),
    flag("train-min-history-zero", TRAIN + " --min-history 0", "--min-history '0' is not a positive duration"),
    flag("train-min-history-negative", TRAIN + " --min-history=-3d", "--min-history '-3d' is not a positive duration"),
    flag("train-min-history-text", TRAIN + " --min-history long", "--min-history", "cannot read duration 'long'"),
    flag("train-min-history-huge", TRAIN + " --min-history 1000d", "21.0 days < 1000 days required"),
    flag("train-models-misspelt", TRAIN.replace("persistence", "persistence,arimaa"), "unknown model 'arimaa'",
         "did you mean 'arima'"),
    flag("train-models-empty", TRAIN.replace("persistence", ","), "no models given", "choose from"),
    flag("train-name-traversal", TRAIN.replace("--name web", "--name ../evil"), "invalid model name '../evil'"),
    flag("evaluate-horizon-zero", EVALUATE + " --horizons 0", "horizon 0s is outside 5m–60m"),
    flag("evaluate-horizon-text", EVALUATE + " --horizons soon", "cannot read duration 'soon'"),
    flag("evaluate-quantile-low", EVALUATE + " --quantile 0.2", "quantile 0.2 must be in [0.5, 1)"),
    flag("evaluate-min-history-zero", EVALUATE + " --min-history 0", "--min-history '0' is not a positive duration"),
    flag("evaluate-max-missing-negative", EVALUATE + " --max-missing=-0.1", "--max-missing -0.1 is not a share"),
    flag("forecast-horizon-zero", FORECAST + " --horizon 0", "horizon 0s is outside 5m–60m"),
    flag("forecast-horizon-off-step", FORECAST + " --horizon 7m", "not a multiple of the model's 5m step"),
    flag("forecast-quantile-huge", FORECAST + " --quantiles 1.5", "quantile 1.5 is not a probability"),
    flag("forecast-quantiles-text", FORECAST + " --quantiles abc", "--quantiles 'abc'", "0.5,0.95"),
    flag("forecast-at-text", FORECAST + " --at yesterday", "--at 'yesterday' is not a time", "ISO-8601"),
    flag("forecast-at-outside", FORECAST + " --at 1999-01-01T00:00:00Z", "is outside the trace", "inside it"),
    flag("forecast-at-year-99999", FORECAST + " --at 99999-01-01", "--at '99999-01-01' is not a time"),
    Case("forecast-at-in-timezone", FORECAST + " --at 2024-01-01T13:00:00 --timezone Europe/Berlin --json", 0,
         ('"issued_at"',), then=lambda ran, work: None if json.loads(ran.out)["issued_at"].startswith(
             "2024-01-01T12:00:00") else pytest.fail(ran.out)),
    Case("forecast-at-skipped-local-time",
         FORECAST.replace("good.csv", "t.csv") + " --at 2024-03-31T02:30:00 --timezone Europe/Berlin", 2,
         ("--at '2024-03-31T02:30:00' does not exist or happens twice in Europe/Berlin", "UTC offset"),
         {"t.csv": csv(rows(288, start=pd.Timestamp("2024-03-30T12:00:00Z")))}),
    flag("train-series-traversal", TRAIN + " --series ../x", "--series", "invalid series '../x'"),
    *(Case(f"controller-{id}", CONTROLLER + " " + argv, 2, says, {"kc": "clusters: [\n"}, env={"KUBECONFIG": ""})
      for id, argv, says in [
          ("interval-zero", "--interval 0", ("reconcile interval 0.0 s is outside 5–600 s", "default is 60")),
          ("interval-nan", "--interval nan", ("reconcile interval nan s",)),
          ("interval-huge", "--interval 100000", ("outside 5–600 s",)),
          ("metrics-port-huge", "--metrics-port 70000", ("metrics-port 70000 is not a TCP port",)),
          ("metrics-port-negative", "--metrics-port=-1", ("metrics-port -1 is not a TCP port",)),
          ("budget-gpus-negative", "--cluster-budget-gpus=-1", ("cluster budget GPUs must be a whole number ≥ 0",)),
          ("budget-cost-nan", "--cluster-budget-cost-per-hour nan", ("must be a finite number ≥ 0, got nan",)),
      ]),
    Case("controller-prometheus-url-not-a-url", CONTROLLER.replace("http://127.0.0.1:9", "notaurl"), 2,
         ("Prometheus URL 'notaurl' must start with http:// or https://",), {"kc": "clusters: [\n"},
         env={"KUBECONFIG": ""}),
    flag("forecast-series-mismatch", FORECAST + " --series other", "trained for series 'web', not 'other'"),
    flag("forecast-unknown-name", "forecast --model {store} --name nope --trace {d}/good.csv",
         "model 'nope' has no serving version"),
    flag("forecast-misspelt-name", "forecast --model {store} --name wbe --trace {d}/good.csv",
         "model 'wbe' has no serving version", "did you mean 'web'"),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_hostile_flag_or_scenario(case: Case, work: Path) -> None:
    check(case, work)


def test_fourteen_days_flat_is_never_refused_as_fewer_than_fourteen(work: Path) -> None:
    """'14.0 days < 14 days' must never be printed: the figure shown differs from the bar, or it passes."""
    from tests.reliability.hostile import run_cli

    for n in (14 * 288 - 1, 14 * 288, 14 * 288 + 1):
        (work / "t.csv").write_text(csv(rows(n)))
        ran = run_cli(["train", "--trace", str(work / "t.csv"), "--out", str(work / "store"), "--name", "web",
                       "--models", "persistence"])
        assert "14.0 days < 14 days" not in ran.err, ran.err
        assert "Traceback" not in ran.err

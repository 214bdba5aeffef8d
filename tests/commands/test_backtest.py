"""`predictive-scaler backtest` end to end on a small trace file."""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.cli import main
from predictive_scaler.commands.backtest_prometheus import history_csv
from predictive_scaler.series import Series
from tests.support.prometheus import BackfilledPrometheus


@pytest.fixture()
def trace_file(tmp_path: Path) -> Path:
    n = 9 * 288
    t = np.arange(n) * 300
    values = 100 + 60 * np.sin(2 * np.pi * t / 86400) + np.random.default_rng(3).normal(0, 4, n)
    stamps = pd.date_range("2024-01-01", periods=n, freq="300s", tz="UTC").strftime("%Y-%m-%dT%H:%M:%SZ")
    path = tmp_path / "t.csv"
    pd.DataFrame({"timestamp": stamps, "value": np.round(values, 2)}).to_csv(path, index=False)
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: small\nforecasters: [persistence]\nevaluation: 12h\n"
                        "spec:\n  prewarm:\n    budget:\n      maxGpus: 4\n")
    return path


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        (["--json"], "json"),
        (["--peak-replicas", "5"], "table"),
        (["--capacity-per-replica", "20", "--policies", "reactive,oracle", "--json"], "capacity"),
    ],
    ids=["json", "table", "capacity"],
)
def test_backtest_command(trace_file: Path, capsys: pytest.CaptureFixture[str], extra: list[str], check: str) -> None:
    code = main(["backtest", "--trace", str(trace_file), "--scenario", str(trace_file.with_name("s.yaml")),
                 "--no-progress", *extra])
    out = capsys.readouterr().out
    assert code == 0
    if check == "json":
        doc = json.loads(out)
        assert doc["scenario"]["name"] == "small"
        assert 0 <= doc["policies"]["predictive"]["slo_attainment"] <= 1
    elif check == "table":
        assert "scenario: small" in out and "physical bound" in out and "predictive" in out
        assert '"peak_replicas":5' in out
    else:
        doc = json.loads(out)
        assert set(doc["policies"]) == {"reactive", "oracle"}
        assert doc["scenario"]["capacity_per_replica"] == 20


def test_report_is_written_and_self_contained(trace_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "rep"
    code = main(["backtest", "--trace", str(trace_file), "--scenario", str(trace_file.with_name("s.yaml")),
                 "--no-progress", "--report", str(out_dir)])
    assert code == 0
    page = (out_dir / "report.html").read_text()
    pngs = sorted(p.name for p in out_dir.glob("*.png"))
    assert "hard_days.png" in pngs
    assert page.count("data:image/png;base64,") == len(pngs) and "src=\"capacity.png\"" not in page
    md = (out_dir / "report.md").read_text()
    assert "## Scenario" in md and "physical bound" in md and "Wasted prewarm cost (billed)" in md
    _html_carries_the_markdown(md, page)
    assert str(out_dir / "report.html") in capsys.readouterr().out


def _html_carries_the_markdown(md: str, page: str) -> None:
    """Every heading, list item and table cell of the Markdown appears in the HTML."""
    import html as html_lib
    import re

    def plain(x: str) -> str:
        return x.replace("`", "").replace("*", "")

    text = plain(html_lib.unescape(re.sub(r"<[^>]+>", "", page)))
    for line in md.splitlines():
        if line.startswith("#"):
            assert plain(line.lstrip("#").strip()) in text, line
        elif line.startswith("- "):
            assert plain(line[2:]) in text, line
        elif line.startswith("|") and not line.startswith("|---"):
            for cell in line.strip("|").split("|"):
                assert plain(cell.strip()) in text, cell


def test_frontier_json_report_and_plain_progress(trace_file: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "rep"
    code = main(["backtest", "--trace", str(trace_file), "--scenario", str(trace_file.with_name("s.yaml")),
                 "--frontier", "--json", "--report", str(out_dir)])
    assert code == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert set(doc["headline"]) == {"cost_ratio_vs_reactive", "gap_closed_vs_reactive", "unmet_ratio_vs_reactive",
                                    "cost_ratio_vs_holt_winters", "gap_closed_vs_holt_winters"}
    reactive = doc["frontier"]["reactive"]
    knobs = [p["knob"]["target_utilization"] for p in reactive]
    assert knobs[0] == 0.3 and knobs[-1] == 0.95 and all(0 < b - a <= 0.05 + 1e-9 for a, b in zip(knobs, knobs[1:], strict=False))
    for name, points in doc["frontier"].items():
        for p in points:
            assert {"knob", "gpu_hours", "slo_attainment", "unmet_minutes"} <= set(p), name
            assert 0.0 <= p["slo_attainment"] <= 1.0
    assert doc["policies"]["predictive"]["minutes_over_budget"] == 0
    assert doc["policies"]["reactive"]["minutes_over_budget"] is None
    # Piped stderr: plain progress lines, no carriage-return bars.
    assert "\r" not in captured.err and "predictive: 100 %" in captured.err and "frontier:" in captured.err
    md = (out_dir / "report.md").read_text()
    assert "## Cost–service frontiers" in md and "frontier.png" in md
    _html_carries_the_markdown(md, (out_dir / "report.html").read_text())


def test_bad_scenario_is_a_clean_error(tmp_path: Path, trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("preset: gke\n")
    assert main(["backtest", "--trace", str(trace_file), "--scenario", str(bad), "--no-progress"]) == 2
    assert "preset" in capsys.readouterr().err


# -- your own history: --prometheus URL --scaler FILE.yaml -------------------------------------------

#: The standard history's request counters (tests/support/prometheus.py), at the model step.
# Pulled every minute and averaged per model step (sources/demand.py), a [1m] rate over the backfilled
# one-minute samples makes each 5-minute step the mean of its own minutes — the truth's grid.
DEMAND_QUERY = 'sum(rate(requests_total{namespace="ml",job="inference"}[1m]))'
SCALER = """\
apiVersion: predictive-scaler.io/v1alpha1
kind: PredictiveScaler
metadata: {name: llm, namespace: ml}
spec:
  target: {name: llm}
  demand: {query: 'QUERY'}
  capacity: {requestsPerReplica: 200}
  maxReplicas: 14
  quantile: 0.9
  leadTimes: {podStartSeconds: 60, nodeStartSeconds: 300}
  prewarm:
    enabled: true
    gpusPerNode: 2
    budget: {maxGpus: 4, pricePerGpuHour: 3.0}
""".replace("QUERY", DEMAND_QUERY)
#: Small and fast: one cheap forecaster, one evaluated day after the 7-day training window.
SMALL_SCENARIO = "name: own-history\nforecasters: [persistence]\nevaluation: 1d\n"
POLICIES = ("predictive", "reactive", "static", "holt-winters", "oracle")
MEASURES = ("gpu_hours", "cost", "slo_attainment", "unmet_minutes", "prewarm_gpu_hours", "scale_events")


def _run_json(argv: list[str]) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["backtest", *argv, "--json", "--no-progress"])
    assert code == 0
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


@dataclass(frozen=True)
class OwnHistory:
    pulled: dict[str, Any]
    from_export: dict[str, Any]
    from_truth: dict[str, Any]
    export: Path
    truth: Series


@pytest.fixture(scope="module")
def own_history(prometheus_server: BackfilledPrometheus, tmp_path_factory: pytest.TempPathFactory) -> OwnHistory:
    root = tmp_path_factory.mktemp("own-history")
    (root / "scaler.yaml").write_text(SCALER)
    (root / "s.yaml").write_text(SMALL_SCENARIO)
    trace = prometheus_server.history.trace
    common = ["--scaler", str(root / "scaler.yaml"), "--scenario", str(root / "s.yaml")]
    pulled = _run_json(["--prometheus", prometheus_server.url, "--end", trace.end.isoformat(),
                        "--save-history", str(root / "pulled.csv"), *common])
    from_export = _run_json(["--trace", str(root / "pulled.csv"), *common])
    # The backfilled truth on the model grid: each 5-minute step the mean of its minutes.
    per_step = 300 // trace.step_seconds
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the scrape gap: all-NaN steps stay NaN
        means = np.nanmean(trace.values.reshape(-1, per_step), axis=1)
    truth = Series(values=means, start=trace.start, step_seconds=300, name="truth")
    (root / "truth.csv").write_text(history_csv(truth))
    from_truth = _run_json(["--trace", str(root / "truth.csv"), *common])
    return OwnHistory(pulled, from_export, from_truth, root / "pulled.csv", truth)


def test_own_history_runs_every_policy_with_the_manifest_over_the_scenario(own_history: OwnHistory) -> None:
    doc = own_history.pulled
    assert set(doc["policies"]) == set(POLICIES)
    for name in POLICIES:
        assert 0 <= doc["policies"][name]["slo_attainment"] <= 1
        assert doc["policies"][name]["gpu_hours"] > 0
    scenario = doc["scenario"]
    assert scenario["name"] == "own-history"
    assert scenario["capacity_per_replica"] == 200 and scenario["max_replicas"] == 14
    assert scenario["quantile"] == 0.9 and scenario["target_utilization"] == 1.0
    assert scenario["demand_unit_seconds"] == 1.0  # a Prometheus rate is per second
    assert scenario["cluster"]["gpus_per_node"] == 2 and scenario["cluster"]["price_per_gpu_hour"] == 3.0
    cluster = scenario["cluster"]
    assert cluster["pod_start_s"] + cluster["model_load_s"] == pytest.approx(60)
    assert cluster["pod_start_s"] + cluster["model_load_s"] + cluster["node_provision_s"] + cluster["image_pull_s"] \
        == pytest.approx(300)
    assert scenario["spec"]["prewarm"]["budget"] == {"maxGpus": 4, "pricePerGpuHour": 3.0}  # replaced, not merged
    assert "mode" not in scenario["spec"]
    origins = scenario["scaler"]
    assert origins["name"] == "ml/llm"
    assert origins["from_manifest"]["max_replicas"] == "spec.maxReplicas"
    assert "min_replicas" in origins["from_scenario"] and "control_period" in origins["from_scenario"]
    assert any("forecast-only" in note for note in origins["notes"])
    assert DEMAND_QUERY in scenario["trace"]


def test_own_history_is_the_retraining_jobs_pull(own_history: OwnHistory) -> None:
    from predictive_scaler.series import load_trace

    pulled = load_trace(own_history.export, min_history=None)
    assert pulled.step_seconds == 300 and pulled.end == own_history.truth.end
    assert pulled.span >= timedelta(days=14) - timedelta(minutes=5)  # --days 21 trimmed to what exists
    truth = own_history.truth.values[-len(pulled):]
    both = np.isfinite(pulled.values) & np.isfinite(truth)
    assert both.mean() > 0.98  # the hour's scrape gap (and its edges) only
    close = np.isclose(pulled.values[both], truth[both], rtol=0.02)
    assert close.mean() > 0.99  # all but the steps of the counter resets


#: How far a backtest of the pulled history may be from one of the backfilled truth: the pull
#: differs at the steps of the counter resets and the edges of the scrape gap, which move a
#: few decisions by a control period — and, since calibrated P95s track their own coverage
#: over the last day, move the P95 (so placeholders and rescales) for a while after each reset
#: step: prewarm GPU-hours 1.87 vs 1.15 and 124 vs 108 scale events here; GPU-hours, cost and
#: SLO stay within 1 %. (measure → (relative, absolute) tolerance.)
TRUTH_TOLERANCE = {"gpu_hours": (0.01, 0.0), "cost": (0.01, 0.0), "slo_attainment": (0.0, 1e-3),
                   "unmet_minutes": (0.0, 5.0), "prewarm_gpu_hours": (0.0, 1.0), "scale_events": (0.2, 2.0)}
EXACT = dict.fromkeys(MEASURES, (0.0, 1e-9))


@pytest.mark.parametrize(
    ("other", "tolerance"),
    [("from_export", EXACT), ("from_truth", TRUTH_TOLERANCE)],
    ids=["exported-pull-identical", "backfilled-truth-close"],
)
def test_own_history_equals_a_trace_backtest_of_the_same_series(own_history: OwnHistory, other: str,
                                                                tolerance: dict[str, tuple[float, float]]) -> None:
    doc, ref = own_history.pulled, getattr(own_history, other)
    assert doc["scenario"]["evaluation_start"] == ref["scenario"]["evaluation_start"]
    assert doc["scenario"]["capacity_per_replica"] == ref["scenario"]["capacity_per_replica"]
    assert doc["bound"]["gpu_hours"] == pytest.approx(ref["bound"]["gpu_hours"], rel=tolerance["gpu_hours"][0])
    for name in POLICIES:
        got, want = doc["policies"][name], ref["policies"][name]
        for measure in MEASURES:
            rel, abs_ = tolerance[measure]
            assert got[measure] == pytest.approx(want[measure], rel=rel, abs=abs_), (name, measure)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace", "t.csv", "--prometheus", "http://127.0.0.1:9"], "give one"),
        (["--prometheus", "http://127.0.0.1:9"], "--scaler FILE.yaml"),
        (["--prometheus", "http://127.0.0.1:1", "--scaler", "scaler.yaml"], "127.0.0.1:1"),
        (["--scaler", "bad.yaml", "--trace", "t.csv"], "capacity"),
        (["--scaler", "two.yaml", "--trace", "t.csv"], "--name"),
        (["--trace", "t.csv", "--end", "2024-01-01"], "--prometheus"),
    ],
    ids=["both-sources", "no-manifest", "unreachable", "invalid-manifest", "two-scalers", "end-without-prometheus"],
)
def test_own_history_errors_say_what_to_do(tmp_path: Path, trace_file: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scaler.yaml").write_text(SCALER)
    (tmp_path / "bad.yaml").write_text(SCALER.replace("capacity: {requestsPerReplica: 200}", ""))
    (tmp_path / "two.yaml").write_text(SCALER + "---\n" + SCALER.replace("name: llm, namespace", "name: b, namespace"))
    assert main(["backtest", *argv, "--no-progress", "--timeout", "2"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("days", "end_shift", "message"),
    [(10, timedelta(0), "10.0 days < 14 days"), (21, timedelta(days=400), "no data")],
    ids=["short", "empty"],
)
def test_short_or_empty_own_history_is_refused(prometheus_server: BackfilledPrometheus, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str], days: int, end_shift: timedelta,
                                               message: str) -> None:
    (tmp_path / "scaler.yaml").write_text(SCALER)
    end = prometheus_server.history.trace.end + end_shift
    code = main(["backtest", "--prometheus", prometheus_server.url, "--scaler", str(tmp_path / "scaler.yaml"),
                 "--end", end.isoformat(), "--days", str(days), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "ml/llm" in err


BASE_SPEC = {"target": {"name": "llm"}, "demand": {"query": "sum(rate(x[5m]))"}, "capacity": {"requestsPerReplica": 50}}


@pytest.mark.parametrize(
    ("extra", "expect", "from_scenario"),
    [
        ({}, {"capacity_per_replica": 50, "peak_replicas": None, "target_utilization": 1.0, "max_replicas": None,
              "demand_unit_seconds": 60.0}, ("max_replicas", "quantile", "cluster.gpus_per_node")),
        ({"demand": {"kind": "dcgm-busy-gpus"}, "capacity": {"gpuUtilizationTarget": 0.6}, "gpusPerReplica": 2},
         {"capacity_per_replica": 2.0, "target_utilization": 0.6, "cluster.gpus_per_replica": 2}, ("min_replicas",)),
        ({"minReplicas": 2, "maxReplicas": 30, "controlPeriodSeconds": 30, "quantile": 0.99},
         {"min_replicas": 2, "max_replicas": 30, "control_period": "30s", "quantile": 0.99}, ("cluster.gpus_per_node",)),
        ({"leadTimes": {"nodeStartSeconds": 700}},
         {"cluster.pod_start_s": 10.0, "cluster.model_load_s": 60.0, "cluster.node_provision_s": 630 * 50 / 350,
          "cluster.image_pull_s": 630 * 300 / 350}, ("cluster.pod_start_s",)),
        ({"prewarm": {"enabled": False}, "mode": "scale"}, {"spec.prewarm": {"enabled": False, "budget": {"maxGpus": 8}}},
         ("cluster.price_per_gpu_hour",)),
        ({"model": {"stepSeconds": 60, "name": "m"}}, {"spec.model": {"name": "m"}}, ("quantile",)),
    ],
    ids=["defaults-stay-the-scenarios", "busy-gpus", "replicas-period-quantile", "node-lead-time", "prewarm-off",
         "fine-model-step"],
)
def test_the_manifest_is_laid_over_the_scenario(extra: dict[str, Any], expect: dict[str, Any],
                                                from_scenario: tuple[str, ...]) -> None:
    from predictive_scaler.backtest.scenario import Scenario, deep_merge
    from predictive_scaler.commands.backtest_scaler import scenario_for_scaler

    base = Scenario(spec={"prewarm": {"enabled": True, "budget": {"maxGpus": 8}}})
    mapped = scenario_for_scaler(base, deep_merge(BASE_SPEC, extra))
    got = mapped.scenario.to_dict()
    for setting, want in expect.items():
        group, _, name = setting.rpartition(".")
        value = got[group][name] if group else got[setting]
        assert value == (pytest.approx(want) if isinstance(want, float) else want), setting
    assert set(from_scenario) <= set(mapped.from_scenario)
    assert not set(mapped.from_manifest) & set(mapped.from_scenario)
    assert any("mode" in n for n in mapped.notes) == (extra.get("mode") != "scale")


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"leadTimes": {"nodeStartSeconds": 30}}, "spec.leadTimes.nodeStartSeconds"),
        ({"gpusPerReplica": 8}, "gpus_per_replica"),
        ({"capacity": {}}, "spec.capacity.requestsPerReplica"),
    ],
    ids=["node-faster-than-warm", "replica-larger-than-node", "no-capacity"],
)
def test_a_manifest_that_does_not_fit_the_scenario_is_refused(extra: dict[str, Any], field: str) -> None:
    from predictive_scaler.backtest.scenario import Scenario
    from predictive_scaler.commands.backtest_scaler import scenario_for_scaler
    from predictive_scaler.errors import ConfigError

    doc = {**BASE_SPEC, **extra}
    with pytest.raises(ConfigError) as info:
        scenario_for_scaler(Scenario(), doc)
    assert info.value.field == field

"""Alerts are valid PromQL with working thresholds; alerts and dashboard use only exported metrics."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from predictive_scaler.metrics_catalog import RECORDED, exported_series_names
from predictive_scaler.spec import ScalerSpec

from .promql import metric_names
from .support import DEPLOY

RULE_FILE = DEPLOY / "overlays" / "prometheus-operator" / "prometheusrule.yaml"
DASHBOARD_FILE = DEPLOY / "dashboards" / "predictive-scaler.json"

REQUIRED_ALERTS = {
    "PredictiveScalerReactiveFallback", "PredictiveScalerPrewarmBudgetExhausted",
    "PredictiveScalerForecastStale", "PredictiveScalerReconcileErrors",
    "PredictiveScalerWastedPrewarmCostHigh", "PredictiveScalerModelStale",
}


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is required (Debian package `prometheus`); `make tools` installs it"
    return path


def _rules() -> list[dict[str, Any]]:
    spec = yaml.safe_load(RULE_FILE.read_text())["spec"]
    return [rule for group in spec["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    exprs = [(f"panel {p['title']!r}", t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            exprs.append((f"variable {var['name']!r}", _variable_promql(var)))
    return exprs


def _variable_promql(var: dict[str, Any]) -> str:
    """The PromQL inside a Grafana query variable (label_values(expr, label) or query_result(expr))."""
    query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
    if query.startswith("query_result("):
        return query.removeprefix("query_result(").removesuffix(")")
    return query.removeprefix("label_values(").rsplit(",", 1)[0]


def _write_rule_file(tmp_path: Path, *, annotations: bool = True) -> Path:
    groups = yaml.safe_load(RULE_FILE.read_text())["spec"]["groups"]
    if not annotations:  # promtool unit tests compare annotations exactly; we test the logic
        for group in groups:
            for rule in group["rules"]:
                rule.pop("annotations", None)
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    return rules


@pytest.mark.promtool
def test_promtool_accepts_the_rules(tmp_path):
    done = subprocess.run([promtool(), "check", "rules", str(_write_rule_file(tmp_path))],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in done.stdout


@pytest.mark.promtool
def test_promtool_rejects_broken_promql(tmp_path):
    # Guards the check above: promtool really parses the expressions.
    rules = tmp_path / "bad.yaml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"alert": "Broken", "expr": "sum by (namespace (predictive_scaler_desired_replicas)"}]}]}))
    done = subprocess.run([promtool(), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0


def test_the_required_alerts_exist_with_severity_and_help():
    rules = {r["alert"]: r for r in _rules() if "alert" in r}
    assert REQUIRED_ALERTS <= set(rules)
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name


@pytest.mark.parametrize("where, expr",
                         [(f"alert {r['alert']}", r["expr"]) for r in _rules() if "alert" in r] + _dashboard_exprs(),
                         ids=[f"alert-{r['alert']}" for r in _rules() if "alert" in r] + [w for w, _ in _dashboard_exprs()])
def test_queries_use_only_exported_metrics(where, expr):
    names = metric_names(expr)
    assert names, f"{where}: no metric found in {expr!r}"
    known = exported_series_names() | set(RECORDED)  # recording rules (test_finops_rules.py checks theirs)
    assert names <= known, f"{where}: not exported by the controller: {names - known}"


@pytest.mark.parametrize("expr, expected", [
    ('sum by (namespace, scaler) (rate(a_total{kind="x"}[5m])) > 0', {"a_total"}),
    ('time() - max by (ns) (b_seconds) > 2 * 7 * 86400', {"b_seconds"}),
    ('c{quantile!="0.5", scaler="$scaler"} offset 30m', {"c"}),
    ('histogram_quantile(0.95, sum by (le) (rate(d_bucket{x="y"}[$__rate_interval])))', {"d_bucket"}),
    ('e == 1 or on (namespace) f unless bool g', {"e", "f", "g"}),
    ('h:recorded:rate5m / ignoring(kind) i', {"h:recorded:rate5m", "i"}),
], ids=["rate-by", "arith", "offset-vars", "histogram", "set-ops", "recording-rule-names"])
def test_metric_name_extraction(expr, expected):
    assert metric_names(expr) == expected


# promtool unit tests: each alert fires when it should and not before.
MINUTE_ALERT_TESTS = textwrap.dedent("""
    rule_files: [rules.yaml]
    evaluation_interval: 1m
    tests:
      - interval: 1m
        input_series:
          - series: 'predictive_scaler_strategy{namespace="ml", scaler="llm", strategy="reactive"}'
            values: '0 1x40'
          - series: 'predictive_scaler_drift_active{namespace="ml", scaler="llm"}'
            values: '0x40'
        alert_rule_test:
          - {alertname: PredictiveScalerReactiveFallback, eval_time: 29m, exp_alerts: []}
          - alertname: PredictiveScalerReactiveFallback
            eval_time: 32m
            exp_alerts: [{exp_labels: {severity: warning, namespace: ml, scaler: llm}}]
      - interval: 1m
        input_series:
          - series: 'predictive_scaler_strategy{namespace="ml", scaler="llm", strategy="reactive"}'
            values: '0x40'
          - series: 'predictive_scaler_drift_active{namespace="ml", scaler="llm"}'
            values: '1x40'
        alert_rule_test:
          - alertname: PredictiveScalerReactiveFallback
            eval_time: 31m
            exp_alerts: [{exp_labels: {severity: warning, namespace: ml, scaler: llm}}]
      - interval: 1m
        input_series:
          - series: 'predictive_scaler_budget_limited{namespace="ml", scaler="llm"}'
            values: '1x30'
        alert_rule_test:
          - {alertname: PredictiveScalerPrewarmBudgetExhausted, eval_time: 10m, exp_alerts: []}
          - alertname: PredictiveScalerPrewarmBudgetExhausted
            eval_time: 16m
            exp_alerts: [{exp_labels: {severity: info, namespace: ml, scaler: llm}}]
      - interval: 1m
        input_series:
          # Forecasts every minute for 10 minutes, then none (the gauge keeps its last value).
          - series: 'predictive_scaler_last_forecast_timestamp_seconds{namespace="ml", scaler="llm"}'
            values: '0+60x10 600x30'
        alert_rule_test:
          - {alertname: PredictiveScalerForecastStale, eval_time: 20m, exp_alerts: []}
          - alertname: PredictiveScalerForecastStale
            eval_time: 31m
            exp_alerts: [{exp_labels: {severity: warning, namespace: ml, scaler: llm}}]
      - interval: 1m
        input_series:
          - series: 'predictive_scaler_reconcile_errors_total{namespace="ml", scaler="llm", kind="metrics"}'
            values: '0 0 0 0 0 1+1x30'
        alert_rule_test:
          - alertname: PredictiveScalerReconcileErrors
            eval_time: 20m
            exp_alerts: [{exp_labels: {severity: warning, namespace: ml, scaler: llm, kind: metrics}}]
""")

HOUR_ALERT_TESTS = textwrap.dedent("""
    rule_files: [rules.yaml]
    evaluation_interval: 1h
    tests:
      - interval: 1h
        input_series:
          # 5 currency units of waste per hour: 120 a day, above the 50/day threshold after ~10 h.
          - series: 'predictive_scaler_wasted_prewarm_cost_total{namespace="ml", scaler="llm", currency="USD"}'
            values: '0+5x30'
        alert_rule_test:
          - {alertname: PredictiveScalerWastedPrewarmCostHigh, eval_time: 5h, exp_alerts: []}
          - alertname: PredictiveScalerWastedPrewarmCostHigh
            eval_time: 20h
            exp_alerts: [{exp_labels: {severity: info, namespace: ml, scaler: llm, currency: USD}}]
      - interval: 1h
        input_series:
          # Trained at t=0, never again: stale after two weekly periods (+1 h for).
          - series: 'predictive_scaler_model_trained_timestamp_seconds{namespace="ml", scaler="llm"}'
            values: '0x400'
        alert_rule_test:
          - {alertname: PredictiveScalerModelStale, eval_time: 13d, exp_alerts: []}
          - alertname: PredictiveScalerModelStale
            eval_time: 16d
            exp_alerts: [{exp_labels: {severity: warning, namespace: ml, scaler: llm}}]
""")


@pytest.mark.promtool
@pytest.mark.parametrize("tests", [MINUTE_ALERT_TESTS, HOUR_ALERT_TESTS], ids=["minute-alerts", "day-alerts"])
def test_alerts_fire_when_they_should(tmp_path, tests):
    _write_rule_file(tmp_path, annotations=False)
    (tmp_path / "tests.yaml").write_text(tests)
    done = subprocess.run([promtool(), "test", "rules", "tests.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_shows_what_the_issue_asks():
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    used = set().union(*(metric_names(e) for _, e in _dashboard_exprs()))
    for name in ("predictive_scaler_forecast_demand", "predictive_scaler_observed_demand",
                 "predictive_scaler_desired_replicas", "predictive_scaler_current_replicas",
                 "predictive_scaler_placeholder_gpus", "predictive_scaler_mode", "predictive_scaler_strategy",
                 "predictive_scaler_budget_gpus_in_use", "predictive_scaler_prewarm_cost_total",
                 "predictive_scaler_wasted_prewarm_cost_total"):
        assert name in used, name
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


# --- the forecast band follows the scaler's horizon ----------------------------------------

def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_FILE.read_text())


def _horizon_variable() -> dict[str, Any]:
    (var,) = [v for v in _dashboard()["templating"]["list"] if v["name"] == "horizon"]
    return var


def _band_targets() -> list[dict[str, Any]]:
    (panel,) = [p for p in _dashboard()["panels"] if p["title"].startswith("Forecast band")]
    return [t for t in panel["targets"] if "predictive_scaler_forecast_demand" in t["expr"]]


def test_no_panel_hard_codes_a_horizon():
    for where, expr in _dashboard_exprs():
        assert not re.search(r"\boffset\s+[0-9]", expr), f"{where}: a fixed offset in {expr!r}"
    targets = _band_targets()
    assert len(targets) == 2
    for target in targets:
        assert target["expr"].endswith("offset ${horizon}s"), target["expr"]


def test_the_horizon_variable_reads_the_exported_horizon():
    var = _horizon_variable()
    assert var["hide"] == 2, "an internal variable: not a choice for the user"
    assert metric_names(_variable_promql(var)) == {"predictive_scaler_forecast_horizon_seconds"}
    # Before the first forecast: the spec's default horizon (so the panel still parses).
    default = next(f.default for f in dataclasses.fields(ScalerSpec) if f.name == "horizon_seconds")
    assert f"vector({default})" in _variable_promql(var)


def test_the_variable_regex_takes_the_value_out_of_grafanas_query_result_text():
    # Grafana's query_result lists each sample as '<name>{<labels>} <value> <timestamp in ms>'.
    regex = _horizon_variable()["regex"]
    assert regex.startswith("/") and regex.endswith("/")
    pattern = re.compile(regex[1:-1])
    assert pattern.search("{} 3600 1764590400000").group(1) == "3600"
    assert pattern.search('{scaler="x"} 3600 1764590400000') is None


def test_the_telemetry_exports_the_horizon_the_panel_uses():
    assert "predictive_scaler_forecast_horizon_seconds" in exported_series_names()


def _substituted(expr: str, horizon: str = "3600") -> str:
    return (expr.replace("$namespace", "ml").replace("$scaler", "llm").replace("${horizon}", horizon))


@pytest.mark.promtool
def test_promtool_runs_the_variable_and_the_band_on_series(tmp_path):
    # The variable's PromQL gives the exported horizon (or the default without one), and the
    # band shifted by it shows at t + horizon the forecast gauge's value at t.
    var = _substituted(_variable_promql(_horizon_variable()))
    p50, upper = (_substituted(t["expr"]) for t in _band_targets())
    (tmp_path / "rules.yaml").write_text("groups: []\n")
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [
        {"interval": "1m",
         "input_series": [
             {"series": 'predictive_scaler_forecast_horizon_seconds{namespace="ml", scaler="llm"}', "values": "3600x120"},
             {"series": 'predictive_scaler_forecast_demand{namespace="ml", scaler="llm", quantile="0.5"}',
              "values": "0+1x120"},
             {"series": 'predictive_scaler_forecast_demand{namespace="ml", scaler="llm", quantile="0.95"}',
              "values": "10+1x120"}],
         "promql_expr_test": [
             {"expr": var, "eval_time": "90m", "exp_samples": [{"labels": "{}", "value": 3600}]},
             {"expr": p50, "eval_time": "90m", "exp_samples": [
                 {"labels": 'predictive_scaler_forecast_demand{namespace="ml", scaler="llm", quantile="0.5"}',
                  "value": 30}]},
             {"expr": upper, "eval_time": "90m", "exp_samples": [
                 {"labels": 'predictive_scaler_forecast_demand{namespace="ml", scaler="llm", quantile="0.95"}',
                  "value": 40}]}]},
        {"interval": "1m",
         "input_series": [{"series": 'predictive_scaler_forecast_horizon_seconds{namespace="ml", scaler="other"}',
                           "values": "600x10"}],
         "promql_expr_test": [{"expr": var, "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": 1800}]}]},
    ]}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    done = subprocess.run([promtool(), "test", "rules", "tests.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr

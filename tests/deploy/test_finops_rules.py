"""The FinOps recording rules, the team cost alert and the fleet dashboard (docs/finops.md)."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
import yaml

from predictive_scaler.metrics_catalog import RECORDED, exported_series_names

from .promql import metric_names
from .support import DEPLOY

RULE_FILE = DEPLOY / "overlays" / "prometheus-operator" / "prometheusrule.yaml"
FLEET = DEPLOY / "dashboards" / "predictive-scaler-fleet.json"
GROUP = "predictive-scaler-finops"


def _finops_rules() -> list[dict]:
    groups = yaml.safe_load(RULE_FILE.read_text())["spec"]["groups"]
    return next(g for g in groups if g["name"] == GROUP)["rules"]


def _fleet_exprs() -> list[tuple[str, str]]:
    dash = json.loads(FLEET.read_text())
    exprs = [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            exprs.append((var["name"], var["query"]["query"].removeprefix("label_values(").rsplit(",", 1)[0]))
    return exprs


def test_every_recorded_series_is_catalogued_and_recorded_from_exported_metrics_only():
    records = {r["record"]: r["expr"] for r in _finops_rules() if "record" in r}
    assert set(records) == set(RECORDED)
    for name, expr in records.items():
        assert metric_names(expr) <= exported_series_names(), name


@pytest.mark.parametrize(("where", "expr"), [(f"alert {r['alert']}", r["expr"]) for r in _finops_rules()
                                             if "alert" in r] + _fleet_exprs())
def test_the_alert_and_the_fleet_dashboard_read_only_exported_or_recorded_series(where, expr):
    names = metric_names(expr)
    assert names, where
    assert names <= exported_series_names() | set(RECORDED), f"{where}: {names - exported_series_names()}"


def test_the_fleet_dashboard_has_team_and_pool_and_7_and_30_day_trends():
    dash = json.loads(FLEET.read_text())
    assert {v["name"] for v in dash["templating"]["list"]} >= {"team", "node_pool"}
    assert {p.get("timeFrom") for p in dash["panels"]} >= {"7d", "30d"}
    assert dash["uid"] != json.loads((DEPLOY / "dashboards" / "predictive-scaler.json").read_text()).get("uid")


UNIT_TESTS = textwrap.dedent("""
    rule_files: [rules.yaml]
    evaluation_interval: 1h
    tests:
      # A week at 1/h, then a day at 2/h: the day is twice the week's mean.
      - interval: 1h
        input_series:
          - series: 'predictive_scaler_gpu_cost_total{namespace="ml", scaler="llm", team="search", node_pool="h100", currency="USD"}'
            values: '0+1x191 193+2x40'
        alert_rule_test:
          - {alertname: PredictiveScalerTeamDailyCostSpike, eval_time: 193h, exp_alerts: []}
          - alertname: PredictiveScalerTeamDailyCostSpike
            eval_time: 216h
            exp_alerts: [{exp_labels: {severity: info, team: search, currency: USD}}]
      # The same cost every day: no spike.
      - interval: 1h
        input_series:
          - series: 'predictive_scaler_gpu_cost_total{namespace="ml", scaler="llm", team="search", node_pool="h100", currency="USD"}'
            values: '0+1x232'
        alert_rule_test:
          - {alertname: PredictiveScalerTeamDailyCostSpike, eval_time: 216h, exp_alerts: []}
      # Doubled after three days: less than a week of history to compare with, so no alert.
      - interval: 1h
        input_series:
          - series: 'predictive_scaler_gpu_cost_total{namespace="ml", scaler="llm", team="search", node_pool="h100", currency="USD"}'
            values: '0+1x71 73+2x40'
        alert_rule_test:
          - {alertname: PredictiveScalerTeamDailyCostSpike, eval_time: 100h, exp_alerts: []}
      # Cost per used GPU-hour: 2 per hour over 1 used GPU-hour per hour.
      - interval: 1h
        input_series:
          - series: 'predictive_scaler_gpu_cost_total{namespace="ml", scaler="llm", team="search", node_pool="h100", currency="USD"}'
            values: '0+2x48'
          - series: 'predictive_scaler_gpu_hours_used_total{namespace="ml", scaler="llm", team="search", node_pool="h100"}'
            values: '0+1x48'
        promql_expr_test:
          - expr: 'team:predictive_scaler_cost_per_used_gpu_hour:1d'
            eval_time: 48h
            exp_samples:
              - labels: 'team:predictive_scaler_cost_per_used_gpu_hour:1d{team="search", currency="USD"}'
                value: 2
""")


@pytest.mark.promtool
def test_the_team_cost_alert_fires_on_a_spike_and_not_otherwise(tmp_path):
    from .test_alerts_and_dashboard import _write_rule_file, promtool

    _write_rule_file(tmp_path, annotations=False)
    (tmp_path / "tests.yaml").write_text(UNIT_TESTS)
    done = subprocess.run([promtool(), "test", "rules", str(tmp_path / "tests.yaml")], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr

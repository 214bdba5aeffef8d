"""The ServiceMonitor keeps the scaler's own ``namespace`` label when Prometheus Operator scrapes it.

The Operator adds target labels at scrape time — ``namespace`` (of the controller's Service), ``service``,
``pod``, ``container``, ``endpoint``, ``job``, ``instance``. Without ``honorLabels: true`` a clash is
resolved for the target: the controller's ``namespace="ml"`` becomes ``exported_namespace="ml"`` and
every series says ``namespace="predictive-scaler-system"`` — two scalers of one name in two
namespaces collapse into one alert series, and the alert's `kubectl describe -n …` points at the
controller's namespace. The promtool tests below feed the alerts series labelled as they are once
scraped under the rendered ServiceMonitor.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from predictive_scaler import crd

from .support import OVERLAYS, one, render
from .test_alerts_and_dashboard import _write_rule_file, promtool

SERVICE_MONITOR = one(render(OVERLAYS["prometheus-operator"]), "ServiceMonitor")

#: What the Operator's generated scrape config sets on every target of this ServiceMonitor.
OPERATOR_TARGET_LABELS = {
    "namespace": crd.CONTROLLER_NAMESPACE,
    "service": "predictive-scaler-metrics",
    "endpoint": "metrics",
    "job": "predictive-scaler-metrics",
    "pod": "predictive-scaler-controller-7d9f8b6c5-x2k4p",
    "container": "controller",
    "instance": "10.244.1.17:8080",
}


def as_scraped(exposed: dict[str, str], honor_labels: bool) -> dict[str, str]:
    """Labels of a series once scraped: Prometheus' ``honor_labels`` rule for clashing target labels."""
    out = dict(OPERATOR_TARGET_LABELS)
    for name, value in exposed.items():
        if name in out and not honor_labels:
            out[f"exported_{name}"] = value  # the target's label wins; the exposed one is renamed
        else:
            out[name] = value
    return out


def _series(metric: str, labels: dict[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{metric}{{{inner}}}"


def test_the_service_monitor_honours_the_controllers_labels():
    (endpoint,) = SERVICE_MONITOR["spec"]["endpoints"]
    assert endpoint.get("honorLabels") is True, endpoint


@pytest.mark.parametrize("honor", [True, False], ids=["honor", "target-wins"])
def test_the_scraped_label_rule(honor):
    scraped = as_scraped({"namespace": "ml", "scaler": "llm"}, honor)
    assert scraped["namespace"] == ("ml" if honor else crd.CONTROLLER_NAMESPACE)
    assert ("exported_namespace" in scraped) is not honor


@pytest.mark.promtool
def test_alerts_keep_apart_two_scalers_of_one_name_once_scraped(tmp_path: Path):
    honor = bool(SERVICE_MONITOR["spec"]["endpoints"][0].get("honorLabels"))
    series = []
    for namespace in ("ml", "research"):
        labels = as_scraped({"namespace": namespace, "scaler": "llm", "strategy": "reactive"}, honor)
        series.append({"series": _series("predictive_scaler_strategy", labels), "values": "0 1x40"})
        drift = as_scraped({"namespace": namespace, "scaler": "llm"}, honor)
        series.append({"series": _series("predictive_scaler_drift_active", drift), "values": "0x40"})
    tests = {
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": [{
            "alertname": "PredictiveScalerReactiveFallback", "eval_time": "32m",
            "exp_alerts": [{"exp_labels": {"severity": "warning", "namespace": ns, "scaler": "llm"}}
                           for ns in ("ml", "research")]}]}],
    }
    _write_rule_file(tmp_path, annotations=False)
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    done = subprocess.run([promtool(), "test", "rules", "tests.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.promtool
def test_the_alert_points_kubectl_at_the_scalers_namespace(tmp_path: Path):
    honor = bool(SERVICE_MONITOR["spec"]["endpoints"][0].get("honorLabels"))
    labels = as_scraped({"namespace": "ml", "scaler": "llm", "strategy": "reactive"}, honor)
    drift = as_scraped({"namespace": "ml", "scaler": "llm"}, honor)
    _write_rule_file(tmp_path, annotations=True)
    rule = next(r for g in yaml.safe_load((tmp_path / "rules.yaml").read_text())["groups"] for r in g["rules"]
                if r.get("alert") == "PredictiveScalerReactiveFallback")
    tests = textwrap.dedent(f"""
        rule_files: [rules.yaml]
        evaluation_interval: 1m
        tests:
          - interval: 1m
            input_series:
              - {{series: '{_series("predictive_scaler_strategy", labels)}', values: '0 1x40'}}
              - {{series: '{_series("predictive_scaler_drift_active", drift)}', values: '0x40'}}
            alert_rule_test:
              - alertname: PredictiveScalerReactiveFallback
                eval_time: 32m
                exp_alerts:
                  - exp_labels: {{severity: warning, namespace: ml, scaler: llm}}
                    exp_annotations: {yaml.safe_dump(_expanded(rule["annotations"]), default_flow_style=True,
                                                     width=10000).strip()}
    """)
    (tmp_path / "tests.yaml").write_text(tests)
    done = subprocess.run([promtool(), "test", "rules", "tests.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "kubectl describe pscaler -n ml llm" in " ".join(_expanded(rule["annotations"]).values())


def _expanded(annotations: dict[str, str]) -> dict[str, str]:
    """The annotations with this test's labels filled in, as Prometheus' template would render them."""
    out = {}
    for key, text in annotations.items():
        out[key] = (text.replace("{{ $labels.namespace }}", "ml").replace("{{ $labels.scaler }}", "llm"))
    return out

"""JSON log lines (python-json-logger): one object per line, without kopf's settings object."""

from __future__ import annotations

import json
import logging

import kopf

from predictive_scaler.controller.run import JsonFormatter

LIMIT = 500


def _kopf_record() -> logging.LogRecord:
    """What kopf's per-object logger hands the handlers: its whole OperatorSettings rides along."""
    record = logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, "Timer 'reconcile' succeeded.", None, None)
    record.settings = kopf.OperatorSettings()
    record.k8s_skip = False
    record.k8s_ref = {"apiVersion": "autoscaling.predictive-scaler.io/v1alpha1", "kind": "PredictiveScaler",
                      "name": "llm", "uid": "u-1", "namespace": "ml"}
    return record


def test_a_kopf_line_is_short_and_names_its_object() -> None:
    record = _kopf_record()
    assert len(str(record.settings)) > 1500  # what the old formatter copied into every line
    line = JsonFormatter().format(record)
    assert len(line) < LIMIT, line
    out = json.loads(line)
    assert out == {"time": out["time"], "level": "info", "logger": "kopf.objects",
                   "message": "Timer 'reconcile' succeeded.", "object": "ml/llm"}


def test_extra_fields_and_exceptions_are_kept() -> None:
    try:
        raise ValueError("bad")
    except ValueError:
        import sys
        record = logging.LogRecord("predictive_scaler.controller", logging.ERROR, __file__, 1, "reconcile %s", ("x",),
                                   sys.exc_info())
    record.scaler = "ml/llm"
    out = json.loads(JsonFormatter().format(record))
    assert out["message"] == "reconcile x" and out["scaler"] == "ml/llm" and out["level"] == "error"
    assert "ValueError: bad" in "".join(out["exception"])

"""Schemas the rendered objects are checked against, beyond Kubernetes' own.

Kept apart from the test modules so that a module can use them without rendering
deploy/ with kubectl when it is imported (tests/support/markers.py, IMPORT_NEEDS).
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate

K8S_VERSION = kubernetes_validate.utils.latest_version()

#: The monitoring.coreos.com/v1 fields the overlays use (subset of the operator's CRDs).
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_META = {"type": "object", "required": ["name", "namespace"], "properties": {
    "name": {"type": "string"}, "namespace": {"type": "string"},
    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    "annotations": {"type": "object", "additionalProperties": {"type": "string"}}},
    "additionalProperties": False}
#: A RelabelConfig of monitoring.coreos.com/v1 (the actions the operator's CRD accepts, in both spellings).
_ACTIONS = ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod", "labelmap", "LabelMap",
            "labeldrop", "LabelDrop", "labelkeep", "LabelKeep", "lowercase", "Lowercase", "uppercase", "Uppercase",
            "keepequal", "KeepEqual", "dropequal", "DropEqual"]
_RELABEL = {"type": "object", "additionalProperties": False, "properties": {
    "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
    "separator": {"type": "string"}, "targetLabel": {"type": "string"}, "regex": {"type": "string"},
    "modulus": {"type": "integer", "minimum": 0}, "replacement": {"type": "string"},
    "action": {"enum": _ACTIONS}}}
MONITORING_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
        "properties": {
            "apiVersion": {"enum": ["monitoring.coreos.com/v1"]}, "kind": {"enum": ["ServiceMonitor"]},
            "metadata": _META,
            "spec": {"type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
                     "properties": {
                         "selector": {"type": "object", "additionalProperties": False, "properties": {
                             "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}}},
                         "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                             "matchNames": {"type": "array", "items": {"type": "string"}},
                             "any": {"type": "boolean"}}},
                         "endpoints": {"type": "array", "minItems": 1, "items": {
                             "type": "object", "additionalProperties": False, "required": ["port"],
                             "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                            "scheme": {"enum": ["http", "https"]},
                                            "interval": _DURATION, "scrapeTimeout": _DURATION,
                                            "honorLabels": {"type": "boolean"},
                                            "relabelings": {"type": "array", "items": _RELABEL},
                                            "metricRelabelings": {"type": "array", "items": _RELABEL}}}}}}}},
    "PrometheusRule": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
        "properties": {
            "apiVersion": {"enum": ["monitoring.coreos.com/v1"]}, "kind": {"enum": ["PrometheusRule"]},
            "metadata": _META,
            "spec": {"type": "object", "required": ["groups"], "additionalProperties": False, "properties": {
                "groups": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["name", "rules"], "additionalProperties": False,
                    "properties": {"name": {"type": "string", "minLength": 1}, "interval": _DURATION,
                                   "rules": {"type": "array", "minItems": 1, "items": {
                                       "type": "object", "required": ["expr"], "additionalProperties": False,
                                       "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                       "properties": {
                                           "alert": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9_]*$"},
                                           "record": {"type": "string"},
                                           "expr": {"type": "string", "minLength": 1},
                                           "for": _DURATION,
                                           "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                           "annotations": {"type": "object",
                                                           "additionalProperties": {"type": "string"}}}}}}}}}}}},
}


#: The keda.sh/v1alpha1 ScaledObject fields the examples use (a strict subset of KEDA's CRD, >= 2.12).
_INT32 = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
KEDA_SCHEMAS: dict[str, dict[str, Any]] = {
    "ScaledObject": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
        "properties": {
            "apiVersion": {"enum": ["keda.sh/v1alpha1"]}, "kind": {"enum": ["ScaledObject"]},
            "metadata": _META,
            "spec": {"type": "object", "required": ["scaleTargetRef", "triggers"], "additionalProperties": False,
                     "properties": {
                         "scaleTargetRef": {"type": "object", "required": ["name"], "additionalProperties": False,
                                            "properties": {"apiVersion": {"type": "string"},
                                                           "kind": {"type": "string"},
                                                           "name": {"type": "string"}}},
                         "minReplicaCount": _INT32, "maxReplicaCount": _INT32, "pollingInterval": _INT32,
                         "cooldownPeriod": _INT32,
                         "fallback": {"type": "object", "required": ["failureThreshold", "replicas"],
                                      "additionalProperties": False,
                                      "properties": {"failureThreshold": _INT32, "replicas": _INT32}},
                         "triggers": {"type": "array", "minItems": 1, "items": {
                             "type": "object", "required": ["type", "metadata"], "additionalProperties": False,
                             "properties": {
                                 "type": {"type": "string"}, "name": {"type": "string"},
                                 "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                                 "useCachedMetrics": {"type": "boolean"},
                                 "metadata": {"type": "object", "additionalProperties": {"type": "string"}}}}}}}}},
}

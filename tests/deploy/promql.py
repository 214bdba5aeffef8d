"""Metric names referenced by a PromQL expression (enough of PromQL for our alerts and panels).

Not a full parser: it removes what cannot be a metric name (strings, label
matchers, range/subquery brackets, grouping clauses, Grafana variables,
durations after `offset`, numbers), then takes the identifiers that are not
function calls or keywords.
"""

from __future__ import annotations

import re

KEYWORDS = frozenset({
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "inf", "nan", "atan2",
})

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$\w+")
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+")
_NUMBER = re.compile(r"(?<![\w:])[0-9][0-9a-fA-Fx.eE+]*")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    text = _STRING.sub(" ", expr)
    text = _GRAFANA_VAR.sub(" ", text)
    text = _BRACES.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        rest = text[match.end():].lstrip()
        if rest.startswith("("):
            continue  # a function or aggregation
        if match.group().lower() in KEYWORDS:
            continue
        names.add(match.group())
    return names

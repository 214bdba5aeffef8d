"""Bounds on YAML documents read from users (scenarios, scaler manifests, kubeconfigs).

``yaml.safe_load`` builds aliases by reference, so a few hundred bytes of anchors ("billion
laughs") make a document whose expanded size is astronomical: harmless until something walks or
prints it — an error message quoting it, a ``str()`` of a list — and then it hangs. Such documents,
and ones nested deeper than any real file, are refused right after parsing.
"""

from __future__ import annotations

from typing import Any

from predictive_scaler.errors import ConfigError

#: Values (scalars, list items, keys) a document may hold once its aliases are expanded.
MAX_VALUES = 100_000
#: Nesting a document may have (a real manifest has fewer than 15 levels).
MAX_DEPTH = 64


def check_size(doc: Any, where: str, *, field: str | None = None) -> Any:
    """``doc`` unchanged, or ConfigError when its aliases expand past MAX_VALUES or it nests past MAX_DEPTH."""
    memo: dict[int, int] = {}

    def size(node: Any, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise ConfigError(f"{where}: nested more than {MAX_DEPTH} levels deep; this is not a file this tool "
                              "reads — check that it is the right one", field=field)
        if not isinstance(node, dict | list):
            return 1
        key = id(node)
        if key not in memo:
            children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
            memo[key] = 1 + sum(size(child, depth + 1) for child in children)
        return memo[key]

    total = size(doc, 0)
    if total > MAX_VALUES:
        raise ConfigError(f"{where}: its YAML aliases expand to {total:,} values (more than {MAX_VALUES:,}); write "
                          "the settings out without anchors (&) and aliases (*)", field=field)
    return doc

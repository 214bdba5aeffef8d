"""The architecture contract (.importlinter) holds, and a forbidden import breaks it.

`make lint` runs `lint-imports` on the tree; here it runs on a temporary copy of
the package with one import injected, to show each contract can fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "predictive_scaler", tmp_path / "predictive_scaler",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copytree(ROOT / "benchmarks", tmp_path / "benchmarks",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    return tmp_path


def _lint(where: Path) -> subprocess.CompletedProcess[str]:
    assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} missing: run `make install` (import-linter is a test extra)"
    # The copy comes first on the path, ahead of the editable install of the real tree.
    env = {**os.environ, "PYTHONPATH": str(where)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=where, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    done = _lint(_copy(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(("module", "line", "broken"), [
    pytest.param("policy/capacity.py", "import kubernetes", "Only kube/ imports kubernetes", id="kubernetes-in-policy"),
    pytest.param("kube/retry.py", "import kopf", "Only controller/ imports kopf", id="kopf-in-kube"),
    pytest.param("backtest/measures.py", "import prometheus_api_client", "Only sources/ talks to Prometheus",
                 id="prometheus-client-in-backtest"),
    pytest.param("forecasting/metrics.py", "import requests", "do no I/O", id="requests-in-forecasting"),
    pytest.param("policy/budget.py", "import predictive_scaler.sources.prometheus", "do no I/O",
                 id="policy-reaches-a-source"),
    pytest.param("series.py", "import predictive_scaler.forecasting.base", "Parts are layered",
                 id="core-imports-forecasting"),
    pytest.param("sources/dcgm.py", "import predictive_scaler.policy.planner", "Parts are layered",
                 id="sibling-parts-import-each-other"),
    pytest.param("kube/retry.py", "import predictive_scaler.controller.run", "Parts are layered",
                 id="kube-imports-the-controller"),
    pytest.param("retrain/sharding.py", "import predictive_scaler.backtest.runner", "Parts are layered",
                 id="retrain-imports-the-backtest"),
    pytest.param("backtest/simulator.py", "import predictive_scaler.backtest.runner",
                 "No import cycles between the backtest", id="new-backtest-cycle"),
    pytest.param("commands/evaluate.py", "import benchmarks.common", "The product never imports the lab",
                 id="product-imports-a-benchmark"),
    pytest.param("backtest/report.py", "import tests.support.openmetrics", "The product never imports the lab",
                 id="product-imports-a-test-helper"),
])
def test_a_forbidden_import_breaks_a_contract(tmp_path: Path, module: str, line: str, broken: str) -> None:
    where = _copy(tmp_path)
    path = where / "predictive_scaler" / module
    path.write_text(path.read_text() + f"\n{line}  # injected by the test\n")
    done = _lint(where)
    assert done.returncode != 0, f"lint-imports passed with {line!r} in {module}:\n{done.stdout}"
    assert "Broken contracts" in done.stdout, done.stdout
    assert broken in done.stdout.split("Broken contracts", 1)[1], done.stdout


def test_the_wheel_ships_the_product_without_the_lab(tmp_path: Path) -> None:
    """The built wheel holds the package only: no benchmark driver, no test helper."""
    import zipfile

    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "*.egg-info", "__pycache__", "*.pyc", "backtests", "models", "deploy"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "--quiet", "--wheel-dir", str(tmp_path / "dist"), str(source)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp_path / "dist").glob("predictive_scaler-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"predictive_scaler", wheel.name.split("-py3")[0] + ".dist-info"}, tops
    assert "predictive_scaler/reconcile.py" in names
    assert not [n for n in names if "benchmarks" in n or "openmetrics" in n or n.startswith("tests/")]
    metadata = zipfile.ZipFile(wheel).read(
        f"{wheel.name.split('-py3')[0]}.dist-info/METADATA").decode()
    _check_metadata(metadata)


def _check_metadata(metadata: str) -> None:
    """The runtime needs neither pyarrow nor matplotlib; the extras that add them name them; the
    licence is the SPDX expression of PEP 639, with its text shipped."""
    from email.parser import Parser

    from packaging.requirements import Requirement

    headers = Parser().parsestr(metadata, headersonly=True)
    requires = [Requirement(r) for r in headers.get_all("Requires-Dist") or []]
    unconditional = {r.name.lower() for r in requires if r.marker is None}
    assert not unconditional & {"pyarrow", "matplotlib"}, sorted(unconditional)
    assert {"requests", "urllib3", "prophet"} <= unconditional, sorted(unconditional)
    for extra, package in (("parquet", "pyarrow"), ("report", "matplotlib")):
        assert extra in (headers.get_all("Provides-Extra") or []), extra
        gated = [r for r in requires if r.name.lower() == package]
        assert gated and all(r.marker is not None and r.marker.evaluate({"extra": extra}) for r in gated), gated
        assert not any(r.marker.evaluate({"extra": ""}) for r in gated), gated
    assert headers["License-Expression"] == "Apache-2.0", headers["License-Expression"]
    assert headers.get_all("License-File") == ["LICENSE"], headers.get_all("License-File")

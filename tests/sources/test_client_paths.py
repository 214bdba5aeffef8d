"""The history pulls of the retraining job and of `backtest --prometheus` go through prometheus-api-client.

Against the real Prometheus fixture, with a spy on ``PrometheusConnect.custom_query_range``:
every range chunk either pull asks for is one call of the client.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import yaml

from predictive_scaler.cli import main
from predictive_scaler.retrain.history import history_for_scaler
from predictive_scaler.sources.prometheus import PrometheusSource
from predictive_scaler.spec import ScalerSpec
from tests.commands.test_backtest import DEMAND_QUERY, SCALER, SMALL_SCENARIO
from tests.support.prometheus import BackfilledPrometheus


def test_the_retraining_pull_uses_the_client(prometheus_server: BackfilledPrometheus, client_calls: list[str]) -> None:
    spec = ScalerSpec.from_dict(yaml.safe_load(SCALER)["spec"])
    end = prometheus_server.history.trace.end.to_pydatetime()
    source = PrometheusSource(prometheus_server.url)
    got = history_for_scaler(source, spec, end, 7, namespace="ml", min_history=None)
    assert np.isfinite(got.values).mean() > 0.9
    assert client_calls and set(client_calls) == {DEMAND_QUERY} and len(client_calls) == source.requests_made


def test_backtest_prometheus_uses_the_client(prometheus_server: BackfilledPrometheus, client_calls: list[str],
                                             tmp_path: Path) -> None:
    (tmp_path / "scaler.yaml").write_text(SCALER)
    (tmp_path / "s.yaml").write_text(SMALL_SCENARIO)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["backtest", "--prometheus", prometheus_server.url, "--scaler", str(tmp_path / "scaler.yaml"),
                     "--scenario", str(tmp_path / "s.yaml"), "--end", prometheus_server.history.trace.end.isoformat(),
                     "--json", "--no-progress"])
    assert code == 0
    assert client_calls and set(client_calls) == {DEMAND_QUERY}

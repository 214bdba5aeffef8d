"""Two shard processes of `predictive-scaler retrain` against a real Prometheus, writing to one
object store bucket (SeaweedFS on loopback): both shards' models are promoted and `models verify`
passes on the s3:// URL. The histories are test_retrain_cmd's (chat, gappy; two shards split them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml

from predictive_scaler.cli import main
from predictive_scaler.core.sharding import shard_of
from predictive_scaler.forecasting.object_store import ObjectModelStore
from tests.commands.test_retrain_cmd import MODELS, START, histories, scaler
from tests.support.prometheus import PrometheusServer, backfill, running_prometheus
from tests.support.seaweedfs import SeaweedFS

pytestmark = [pytest.mark.prometheus, pytest.mark.objectstore, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("chat", "gappy")


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    root = tmp_path_factory.mktemp("retrain-s3-prometheus")
    counters, gauges = histories()
    counters = [c for c in counters if c.labels["job"] in NAMES]
    backfill(root / "tsdb", root / "work", counters=counters, gauges=gauges, sample_step=60)
    with running_prometheus(root / "tsdb", root / "work") as server:
        yield server


def test_two_shards_write_one_bucket_and_both_promote(prometheus: PrometheusServer, seaweedfs: SeaweedFS,
                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert {shard_of(f"ml/{n}", 2) for n in NAMES} == {0, 1}  # one scaler per shard
    config = tmp_path / "scalers.yaml"
    config.write_text(yaml.safe_dump_all([scaler(n) for n in NAMES]))
    url = seaweedfs.url("retrain-e2e")
    env = {**os.environ, **seaweedfs.env()}
    env.pop("AWS_ENDPOINT_URL_S3")  # given by the flag instead
    args = ["retrain", "--config", str(config), "--prometheus", prometheus.url, "--store", url,
            "--s3-endpoint-url", seaweedfs.endpoint, "--now", (START + pd.Timedelta(days=14)).isoformat(),
            "--run-id", "w1", "--models", MODELS, "--shard-count", "2", "--json"]
    code = "import sys; from predictive_scaler.cli import main; sys.exit(main(sys.argv[1:]))"
    procs = [subprocess.Popen([sys.executable, "-c", code, *args, "--shard-index", str(i)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    results = [p.communicate(timeout=540) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-3000:] for _, err in results]
    reports = [json.loads(out) for out, _ in results]
    promoted = {s["key"]: s["version"] for r in reports for s in r["scalers"] if s["result"] == "promoted"}
    assert set(promoted) == {f"ml/{n}" for n in NAMES}
    assert all(len(r["scalers"]) == 1 for r in reports)

    for key, value in seaweedfs.env().items():
        monkeypatch.setenv(key, value)
    store = ObjectModelStore(url)
    assert store.names() == sorted(NAMES)
    for name in NAMES:
        assert store.pointer(name).version == promoted[f"ml/{name}"]  # type: ignore[union-attr]
        assert store.read_document(name, "retrain", "w1") is not None  # the run record is in the bucket too
    capsys.readouterr()
    assert main(["models", "verify", "--store", url]) == 0, capsys.readouterr().out

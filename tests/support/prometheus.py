"""A real Prometheus for tests: backfill a TSDB with promtool, start the server on a loopback port.

Retention. Backfilled traces are old (NASA 1995, MongoDB 2018) and Prometheus
deletes blocks older than its retention at start-up, so the server runs with
``--storage.tsdb.retention.time=100y`` and the traces keep their real dates
(tests query at the trace's own times with an injected clock).

If ``prometheus`` or ``promtool`` is missing the test FAILS, naming the
package to install: CI installs Debian's ``prometheus``, and a test that
skips there would hide a broken metrics path.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml

from predictive_scaler.series import Series, load_trace
from tests.support.openmetrics import (
    DEFAULT_SAMPLE_STEP_SECONDS,
    CounterFamily,
    GaugeFamily,
    write_openmetrics,
)
from tests.support.processes import stop_process

RETENTION = "100y"
#: Constant gauges need a sample only every few minutes to stay within the 5-minute lookback.
CONSTANT_SAMPLE_STEP = 240
READY_TIMEOUT_SECONDS = 30.0


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"`{name}` is not installed; these tests need a real Prometheus — install Debian's "
            "`prometheus` package (apt-get install prometheus, which brings promtool) or run "
            "`make tools`",
            pytrace=False,
        )
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class BackfillReport:
    samples: int
    write_seconds: float
    promtool_seconds: float


def backfill(
    tsdb_dir: Path,
    work_dir: Path,
    *,
    counters: Sequence[CounterFamily] = (),
    gauges: Sequence[GaugeFamily] = (),
    sample_step: int = DEFAULT_SAMPLE_STEP_SECONDS,
) -> BackfillReport:
    """Write the families as OpenMetrics and load them into ``tsdb_dir`` (before the server starts)."""
    promtool = require_binary("promtool")
    work_dir.mkdir(parents=True, exist_ok=True)
    tsdb_dir.mkdir(parents=True, exist_ok=True)
    om = work_dir / "backfill.om"
    t0 = time.perf_counter()
    samples = write_openmetrics(om, counters=counters, gauges=gauges, sample_step=sample_step)
    t1 = time.perf_counter()
    proc = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb_dir),
         "--max-block-duration=24h"],
        capture_output=True, text=True, check=False,
    )
    t2 = time.perf_counter()
    if proc.returncode != 0:
        pytest.fail(f"promtool backfill failed ({proc.returncode}): {proc.stderr[-2000:]}", pytrace=False)
    om.unlink()  # tens of MB; the blocks are what matters
    return BackfillReport(samples=samples, write_seconds=t1 - t0, promtool_seconds=t2 - t1)


@dataclass
class PrometheusServer:
    url: str
    port: int
    tsdb_dir: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    startup_seconds: float

    def stop(self) -> None:
        stop_process(self.process, grace=10)

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""


@contextlib.contextmanager
def running_prometheus(tsdb_dir: Path, work_dir: Path, *, remote_read_url: str | None = None,
                       scrape_configs: Sequence[dict[str, object]] = ()) -> Iterator[PrometheusServer]:
    """Start ``prometheus`` over ``tsdb_dir`` on a free loopback port; stop it on exit.

    ``remote_read_url``: also read from this remote store; when it fails, Prometheus
    still answers from its own TSDB but adds ``warnings`` (partial data).
    ``scrape_configs``: scrape jobs (Prometheus' own config shape), for tests of live scrapes.
    """
    binary = require_binary("prometheus")
    work_dir.mkdir(parents=True, exist_ok=True)
    config = work_dir / "prometheus.yml"
    # No scrape jobs: the data is all backfilled, and a scrape of nothing keeps the TSDB still.
    text = "global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\n"
    if remote_read_url:
        text += f"remote_read:\n  - url: {remote_read_url}\n    read_recent: true\n    remote_timeout: 2s\n"
    if scrape_configs:
        text += yaml.safe_dump({"scrape_configs": list(scrape_configs)})
    config.write_text(text)
    port = free_port()
    log_path = work_dir / "prometheus.log"
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tsdb_dir}",
             f"--storage.tsdb.retention.time={RETENTION}", f"--web.listen-address=127.0.0.1:{port}",
             "--web.enable-lifecycle", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT,
        )
    server = PrometheusServer(url=f"http://127.0.0.1:{port}", port=port, tsdb_dir=tsdb_dir,
                              process=process, log_path=log_path, startup_seconds=0.0)
    try:
        _wait_ready(server)
        server.startup_seconds = time.perf_counter() - t0
        yield server
    finally:
        server.stop()


def _wait_ready(server: PrometheusServer) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(f"prometheus exited with {server.process.returncode} at start-up:\n"
                        f"{server.log_tail()}", pytrace=False)
        try:
            if requests.get(f"{server.url}/-/ready", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.05)
    server.stop()
    pytest.fail(f"prometheus not ready after {READY_TIMEOUT_SECONDS:.0f}s:\n{server.log_tail()}",
                pytrace=False)


# -- the shared backfilled history ---------------------------------------------------------------
#: The trace every metrics test reads: 14 days of MongoDB query rate (per second, 1-min step).
STANDARD_TRACE = Path(__file__).resolve().parents[2] / "backtests" / "traces" / "ms_mongodb_machine01_rps.csv"


@dataclass(frozen=True)
class StandardHistory:
    """What :func:`standard_history` backfills, so tests can compute the expected answers.

    - ``requests_total{namespace="ml",job="inference",pod=<pods>}``: the trace (req/s)
      split over ``pods``, as counters that restart every ``reset_every`` (staggered),
      with a scrape gap (``gap``) where the trace was blanked;
    - ``DCGM_FI_DEV_GPU_UTIL{namespace="ml",pod=<pods>,gpu="0"}``: each pod's share of
      the trace divided by ``capacity_per_gpu`` (req/s at 100 %), clipped to 0–100;
    - ``DCGM_FI_DEV_GPU_UTIL{namespace="ml",pod="stuck-…"}``: a GPU whose exporter stops
      reporting at ``stuck_stop`` (a frozen/dead exporter);
    - ``DCGM_FI_DEV_GPU_UTIL{namespace="ml",pod=<idle_pods>}``: workload ``idle`` with
      constant utilisation ``idle_utils`` (one GPU idle, one busy);
    - ``DCGM_FI_DEV_GPU_UTIL{namespace="ml",pod=<neighbour_pod>}``: Deployment ``llm-canary``,
      whose pod names start with ``llm-`` too (must not count as ``llm``'s), at 100 %;
    - ``queue_depth{namespace="dup",pod="dup-0",instance="a"|"b"}``: the same pod scraped
      twice (duplicated series), values ``dup_values``.
    """

    trace: Series  # with the gap blanked (NaN), as backfilled
    pods: tuple[str, ...]
    reset_every: timedelta
    gap: tuple[datetime, datetime]
    capacity_per_gpu: float
    stuck_pod: str
    stuck_stop: datetime
    dup_values: tuple[float, float]
    idle_pods: tuple[str, ...]
    idle_utils: tuple[float, ...]
    neighbour_pod: str
    sample_step: int


def standard_history(sample_step: int = DEFAULT_SAMPLE_STEP_SECONDS) -> tuple[StandardHistory, list[CounterFamily], list[GaugeFamily]]:
    trace = load_trace(STANDARD_TRACE, min_history=None, name="mongodb_rps")
    gap_start = trace.start + timedelta(days=7, hours=3)
    gap_end = gap_start + timedelta(hours=1)
    values = trace.values.copy()
    values[trace.index_at(gap_start): trace.index_at(gap_end)] = np.nan
    trace = Series(values=values, start=trace.start, step_seconds=trace.step_seconds,
                   name=trace.name, source=trace.source)
    pods = ("llm-6d4b8c7f9-k2x4q", "llm-6d4b8c7f9-p8zrt", "llm-6d4b8c7f9-w5m7c")
    reset_every = timedelta(days=2)
    capacity = 700.0  # req/s per GPU at 100 %: the busiest minutes saturate, as real GPUs do
    ml = {"namespace": "ml"}
    counters = [CounterFamily(name="requests_total", series=trace, pods=pods,
                              labels={**ml, "job": "inference"}, rate_unit_seconds=1.0,
                              reset_every=reset_every)]
    share = trace.values / len(pods)
    util = Series(values=np.clip(share / capacity * 100.0, 0.0, 100.0), start=trace.start,
                  step_seconds=trace.step_seconds, name="gpu_util")
    stuck_pod = "stuck-5f6d7c8b9-abcde"
    stuck_stop = (trace.start + timedelta(days=10)).to_pydatetime()
    stuck = util.until(stuck_stop - timedelta(minutes=1))
    gpu = {"gpu": "0"}
    per_gpu: list[tuple[dict[str, str], Series]] = [
        ({"pod": p, "UUID": f"GPU-{i:08d}", **gpu}, util) for i, p in enumerate(pods)]
    per_gpu.append(({"pod": stuck_pod, "UUID": "GPU-stuck", **gpu}, stuck))
    idle_pods = ("idle-7c9d8f6b5-aaaaa", "idle-7c9d8f6b5-bbbbb")
    idle_utils = (2.0, 50.0)
    neighbour_pod = "llm-canary-5d6f7b8c9-zzzzz"
    for pod, level in [*zip(idle_pods, idle_utils, strict=True), (neighbour_pod, 100.0)]:
        flat_util = Series(values=np.full(len(trace), level), start=trace.start,
                           step_seconds=trace.step_seconds)
        per_gpu.append(({"pod": pod, "UUID": f"GPU-{pod}", **gpu}, flat_util))
    dup_values = (3.0, 4.0)
    flat = [Series(values=np.full(len(trace), v), start=trace.start, step_seconds=trace.step_seconds)
            for v in dup_values]
    gauges = [
        GaugeFamily(name="DCGM_FI_DEV_GPU_UTIL", per_series=per_gpu, labels=ml, help="GPU utilisation (%)."),
        GaugeFamily(name="queue_depth", per_series=[({"instance": "a"}, flat[0]), ({"instance": "b"}, flat[1])],
                    labels={"namespace": "dup", "pod": "dup-0"}, help="Queued requests.",
                    sample_step=CONSTANT_SAMPLE_STEP),
    ]
    history = StandardHistory(trace=trace, pods=pods, reset_every=reset_every,
                              gap=(gap_start.to_pydatetime(), gap_end.to_pydatetime()),
                              capacity_per_gpu=capacity, stuck_pod=stuck_pod, stuck_stop=stuck_stop,
                              dup_values=dup_values, idle_pods=idle_pods, idle_utils=idle_utils,
                              neighbour_pod=neighbour_pod, sample_step=sample_step)
    return history, counters, gauges


@dataclass(frozen=True)
class LoadedPrometheus:
    """A running Prometheus loaded with test data (what a subclass adds says which)."""

    server: PrometheusServer

    @property
    def url(self) -> str:
        return self.server.url


@dataclass(frozen=True)
class BackfilledPrometheus(LoadedPrometheus):
    """A running Prometheus holding :class:`StandardHistory`."""

    history: StandardHistory
    backfill: BackfillReport

"""Benchmark of the weekly retraining job as the cluster runs it: shard processes of the real
``predictive-scaler retrain`` command, pulling history from a real Prometheus, writing a directory store.

    python -m benchmarks.retrain --scalers 40 --weeks 4 --shards 1,2 --out backtests/results/retrain-run.md
    make bench-retrain

Run from the repository root with ``prometheus`` and ``promtool`` installed (``make tools``).

Setup (once): every scaler gets a deterministic synthetic demand (daily + weekly shape with bursts,
seeded by its name, 5-minute steps) written as a per-pod request counter ``requests_total{namespace,
job=<scaler>, pod}`` — one family, a distinct ``job`` label value per scaler — and, unless ``--no-dcgm``,
one ``DCGM_FI_DEV_GPU_UTIL`` gauge per pod following the demand (so the job's four DCGM pulls per
scaler return data, as in a cluster). ``promtool tsdb create-blocks-from openmetrics`` loads them into
one TSDB; one Prometheus serves it on loopback and is warmed with a query over all of it.

Then, for each shard count S: a fresh store directory and ``--weeks`` consecutive weekly runs on it
(``--now`` = start + ``--days`` + 7·(w−1) days, run id ``w<w>``), because the job keeps per-model
state across weeks and the steady state is week 3 onwards. Each week starts S processes of
``predictive-scaler retrain --config scalers.yaml --prometheus URL --store DIR --now … --run-id w<w>
--shard-count S --shard-index i --json`` at once — the Indexed Job's pods — with the pod's
environment (the BLAS thread variables removed: the command sets them itself). Measured per week:

- wall time from the first start to the last exit;
- client CPU: user + system of each shard process and of everything it waited for (cmdstan, run by
  Prophet through cmdstanpy, included), from ``os.wait4`` — checked against the RUSAGE_CHILDREN delta;
- Prometheus CPU: the server's utime + stime from ``/proc/<pid>/stat`` before and after (same cores);
- other CPU: the machine's busy time (``/proc/stat``) minus the two — other people's work on a shared
  machine (noise), and a check that nothing of the job's went uncounted.

Every shard must exit 0 and its ``--json`` report must list each of its scalers once as promoted or
kept; anything else fails the benchmark loudly. After each week one more process trains one scaler
alone (the *probe*, its own config and store), so each process's start-up (interpreter, imports, the
first fit's lazy loads) can be set apart from the cost of a scaler (:class:`Marginal`). The report
gives a table per shard count × week, the steady state (mean of weeks ≥ 3, else the last week), its
extrapolation to 1,000 scalers (start-up counted once per process; and the linear upper bound) and the
speed-up of 2 shards over 1, each against the targets (15 min wall for 1,000 scalers on 2 cores,
1.8 CPU-s per scaler with the pulls, 2 shards ≥ 1.8× faster than 1).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO, TextIO

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")  # this process's numpy (history generation) only; see child_env

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # tests.support (the OpenMetrics writer, the Prometheus fixture)
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402

from predictive_scaler.series import Series  # noqa: E402

#: Monday; week 1's history starts here and each run's ``--now`` is ``--days`` (+ 7 per week) later.
START = pd.Timestamp("2026-01-05", tz="UTC")
STEP = 300
#: Data before START (so the first rate() window is full) and after the last ``--now``.
LEAD = timedelta(days=1)
TAIL = timedelta(hours=1)
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
DONE = ("promoted", "kept")
#: Targets the job is judged by (2-core machine): 15 min for 1,000 scalers, i.e. ≈ 1.8 CPU-s a scaler.
TARGET_WALL_1000_S = 15 * 60
TARGET_CPU_PER_SCALER = 1.8
TARGET_SPEEDUP = 1.8
CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(RuntimeError):
    """The benchmark cannot measure (a tool is missing, a shard failed): said loudly, exit 1."""


# -- the fleet and its history ---------------------------------------------------------------------

@dataclass(frozen=True)
class SyntheticHistory:
    """Daily + weekly shaped demand (req/s) with bursts, one deterministic series per scaler name."""

    start: pd.Timestamp
    steps: int

    def series(self, key: str) -> Series:
        seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big")
        rng = np.random.default_rng(seed)
        n = self.steps
        t = np.arange(n)
        level = rng.uniform(20, 2000)
        daily = 1 + rng.uniform(0.3, 0.8) * np.sin(2 * np.pi * (t / 288 + rng.uniform()))
        weekly = 1 + 0.15 * np.sin(2 * np.pi * t / (7 * 288))
        bursts = 1 + (rng.random(n) < 0.002) * rng.uniform(0.5, 2.0, n)
        noise = np.exp(0.08 * rng.standard_normal(n))
        return Series(values=level * daily * weekly * bursts * noise, start=self.start,
                      step_seconds=STEP, name="demand")


@dataclass(frozen=True)
class Scaler:
    namespace: str
    name: str
    pods: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def fleet(count: int, pods: int) -> list[Scaler]:
    out = []
    for i in range(count):
        name = f"svc-{i:03d}"
        suffix = hashlib.sha256(name.encode()).hexdigest()
        out.append(Scaler(f"team-{i % 7}", name,
                          tuple(f"{name}-{suffix[:9]}-{suffix[9 + 5 * p: 14 + 5 * p]}" for p in range(pods))))
    return out


def manifest(s: Scaler, demand: Series) -> dict[str, Any]:
    """A PredictiveScaler as a user writes one: demand from its request counter, a GPU per replica."""
    per_replica = max(1, round(float(np.median(demand.values)) / 4))  # about 4 replicas on average
    return {
        "apiVersion": "autoscaling.predictive-scaler.io/v1alpha1", "kind": "PredictiveScaler",
        "metadata": {"name": s.name, "namespace": s.namespace},
        "spec": {
            "target": {"name": s.name},
            "demand": {"kind": "requests",
                       "query": f'sum(rate(requests_total{{namespace="{s.namespace}",job="{s.name}"}}[5m]))'},
            "capacity": {"requestsPerReplica": per_replica, "gpuUtilizationTarget": 0.7},
            "prewarm": {"budget": {"pricePerGpuHour": 3.0}},
        },
    }


def _rows(out: TextIO, prefix: str, times: np.ndarray, values: np.ndarray) -> int:
    out.writelines(f"{prefix} {float(v)!r} {int(t)}\n" for t, v in zip(times, values, strict=True))
    return int(len(times))


def write_openmetrics(path: Path, scalers: Sequence[Scaler], history: SyntheticHistory, sample_step: int,
                      dcgm: bool) -> int:
    """One counter family (a series per pod, a ``job`` value per scaler) and one DCGM gauge family."""
    from tests.support.openmetrics import CounterFamily, counter_samples

    n = 0
    demands = {s.key: history.series(s.key) for s in scalers}
    with open(path, "w", encoding="utf-8") as out:
        out.write("# HELP requests Requests served.\n# TYPE requests counter\n")
        for s in scalers:
            fam = CounterFamily(name="requests_total", series=demands[s.key], pods=s.pods,
                                labels={"namespace": s.namespace, "job": s.name}, reset_every=timedelta(days=3))
            for i, pod in enumerate(s.pods):
                times, values = counter_samples(fam, i, sample_step)
                labels = f'{{job="{s.name}",namespace="{s.namespace}",pod="{pod}"}}'
                n += _rows(out, f"requests_total{labels}", times, values)
        if dcgm:
            out.write("# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (%).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n")
            for s in scalers:
                d = demands[s.key]
                util = np.clip(100.0 * d.values / (1.1 * np.quantile(d.values, 0.99)), 0.0, 100.0)
                begin = int(d.start.timestamp())
                times = np.arange(-(-begin // sample_step) * sample_step, int(d.end.timestamp()) + 1, sample_step)
                idx = np.clip((times - sample_step - begin) // STEP, 0, len(d) - 1)
                for g, pod in enumerate(s.pods):
                    labels = (f'{{UUID="GPU-{s.name}-{g}",gpu="0",namespace="{s.namespace}",'
                              f'pod="{pod}"}}')
                    n += _rows(out, f"DCGM_FI_DEV_GPU_UTIL{labels}", times, np.round(util[idx], 1))
        out.write("# EOF\n")
    return n


def backfill(tsdb: Path, work: Path, scalers: Sequence[Scaler], history: SyntheticHistory, sample_step: int,
             dcgm: bool) -> tuple[int, float]:
    promtool = shutil.which("promtool")
    if promtool is None:
        raise BenchError("`promtool` is not installed; run `make tools` (Debian's prometheus package)")
    work.mkdir(parents=True, exist_ok=True)
    om = work / "backfill.om"
    t0 = time.perf_counter()
    samples = write_openmetrics(om, scalers, history, sample_step, dcgm)
    proc = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb),
                           "--max-block-duration=24h"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BenchError(f"promtool backfill failed ({proc.returncode}): {proc.stderr[-2000:]}")
    om.unlink()
    return samples, time.perf_counter() - t0


@dataclass
class Prometheus:
    url: str
    pid: int
    version: str


@contextlib.contextmanager
def prometheus_server(tsdb: Path, work: Path) -> Iterator[Prometheus]:
    """tests.support's fixture (retention 100y, loopback port), its pytest failures made ours."""
    import pytest

    from tests.support.prometheus import running_prometheus

    binary = shutil.which("prometheus")
    if binary is None:
        raise BenchError("`prometheus` is not installed; run `make tools` (Debian's prometheus package)")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    line = (version.stdout or version.stderr).splitlines()[0] if (version.stdout or version.stderr) else "?"
    try:
        with running_prometheus(tsdb, work) as server:
            yield Prometheus(server.url, server.process.pid, line.replace("prometheus, version ", ""))
    except pytest.fail.Exception as exc:
        raise BenchError(f"Prometheus: {exc.msg}") from None


def warm(url: str, start: datetime, end: datetime) -> None:
    """Touch every chunk once, so week 1 of the first shard count does not pay for a cold page cache alone."""
    import requests

    for query in ("sum(rate(requests_total[5m]))", "count(DCGM_FI_DEV_GPU_UTIL)"):
        r = requests.get(f"{url}/api/v1/query_range", timeout=300, params={
            "query": query, "start": start.timestamp(), "end": end.timestamp(), "step": "600"})
        r.raise_for_status()


# -- measuring one week ----------------------------------------------------------------------------

def proc_cpu(pid: int) -> float:
    """utime + stime of a running process, in seconds (fields 14 and 15 of /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy() -> float:
    """CPU-seconds the whole machine has been busy (all cores, /proc/stat; guest time is in user)."""
    parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in parts[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


@dataclass
class Shard:
    index: int
    scalers: int
    wall: float
    cpu: float
    in_process: float  # run_retrain's own time, from the report (the rest is start-up and imports)


@dataclass
class Week:
    shards: int
    week: int
    scalers: int
    wall: float
    client_cpu: float
    prometheus_cpu: float
    other_cpu: float
    load: float
    per_shard: list[Shard]
    outcomes: Counter[str]
    kinds: Counter[str]
    rusage_children: float
    #: hash of predictive_scaler/*.py when the week started (the code may change under a long run)
    code: str = ""
    #: processes a shard started and left behind (reaped here; their CPU is in client_cpu)
    orphans: int = 0
    #: the week's start-up probe: one process training one scaler (wall, CPU-s), run after the week
    probe_wall: float = 0.0
    probe_cpu: float = 0.0

    @property
    def client_per_scaler(self) -> float:
        return self.client_cpu / self.scalers

    @property
    def prometheus_per_scaler(self) -> float:
        return self.prometheus_cpu / self.scalers


@dataclass
class Job:
    """What every week's processes share."""

    command: list[str]
    config: Path
    prometheus: Prometheus
    days: int
    models: str | None
    keys: frozenset[str]
    work: Path
    timeout: int
    env: dict[str, str] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)

    def args(self, store: Path, now: datetime, week: int, shards: int, index: int) -> list[str]:
        args = [*self.command, "retrain", "--config", str(self.config), "--prometheus", self.prometheus.url,
                "--store", str(store), "--now", now.isoformat(), "--run-id", f"w{week}",
                "--shard-count", str(shards), "--shard-index", str(index), "--json"]
        if self.days != 28:  # the job's default; left off so the command is the CronJob's
            args += ["--history", f"{self.days}d"]
        if self.models:
            args += ["--models", self.models]
        return args + self.extra


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _Timeout


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux PR_SET_CHILD_SUBREAPER), so a
    process a shard starts and does not wait for is reaped here and its CPU counted, not lost."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _orphans_running(prometheus_pid: int) -> list[int]:
    """Descendants of shards still running after their shard exited (re-parented here)."""
    me, out = os.getpid(), []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != prometheus_pid:
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == me:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


@dataclass
class Reaped:
    #: shard index → (seconds since the start, CPU-s of it and what it waited for, exit code)
    shards: dict[int, tuple[float, float, int]] = field(default_factory=dict)
    #: CPU-s of orphaned descendants reaped here (started by a shard, not waited for by it)
    orphan_cpu: float = 0.0
    orphans: int = 0


def _wait_all(job: Job, procs: dict[int, tuple[int, subprocess.Popen[bytes]]], t0: float, what: str) -> Reaped:
    """Reap the shard processes as they exit (and any orphan of theirs re-parented here)."""
    reaped = Reaped()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(job.timeout)
    try:
        while len(reaped.shards) < len(procs):
            pid, status, ru = os.wait4(-1, 0)  # rusage of the child and of all it waited for
            if pid == job.prometheus.pid:
                raise BenchError(f"Prometheus exited during {what}")
            if pid not in procs:
                reaped.orphans += 1
                reaped.orphan_cpu += ru.ru_utime + ru.ru_stime
                continue
            i, p = procs[pid]
            p.returncode = os.waitstatus_to_exitcode(status)
            reaped.shards[i] = (time.perf_counter() - t0, ru.ru_utime + ru.ru_stime, p.returncode)
    except _Timeout:
        for _, p in procs.values():
            if p.returncode is None:
                p.kill()
                p.wait()
        raise BenchError(f"{what} ran past --timeout {job.timeout}s; logs in {job.work}") from None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    while True:  # orphans that have exited by now
        try:
            pid, status, ru = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        if pid == job.prometheus.pid:
            raise BenchError(f"Prometheus exited during {what}")
        reaped.orphans += 1
        reaped.orphan_cpu += ru.ru_utime + ru.ru_stime
    left = _orphans_running(job.prometheus.pid)
    if left:
        print(f"warning: {what}: {len(left)} process(es) started by the shards still run after them "
              f"(pids {left[:5]}); their CPU so far is not counted", file=sys.stderr)
    return reaped


def _read_reports(row: Week, files: Sequence[tuple[BinaryIO, BinaryIO]],
                  ended: dict[int, tuple[float, float, int]], keys: frozenset[str], what: str) -> None:
    """Check each shard's exit code and JSON report (every scaler promoted or kept, each once); count them."""
    seen: list[str] = []
    for i, pair in enumerate(files):
        texts = []
        for f in pair:
            f.seek(0)
            texts.append(f.read().decode("utf-8", "replace"))
            f.close()
        out, err = texts
        code = ended[i][2]
        try:
            doc = json.loads(out)
        except ValueError:
            doc = None
        if code != 0 or doc is None:
            raise BenchError(f"{what}: shard {i} exited {code}{'' if doc is not None else ' without a JSON report'}"
                             f"; its stderr ends:\n{err[-3000:]}")
        bad = [f"{s['key']}: {s['result']} ({s['reason']})" for s in doc["scalers"] if s["result"] not in DONE]
        if bad:
            raise BenchError(f"{what}: shard {i} did not train every scaler:\n  " + "\n  ".join(bad[:20]))
        for s in doc["scalers"]:
            seen.append(s["key"])
            row.outcomes[s["result"]] += 1
            if s["result"] == "promoted":
                row.kinds[s.get("kind") or "?"] += 1
        row.per_shard.append(Shard(i, len(doc["scalers"]), ended[i][0], ended[i][1], float(doc["seconds"])))
    if sorted(seen) != sorted(keys):
        missing, twice = set(keys) - set(seen), {k for k, c in Counter(seen).items() if c > 1}
        raise BenchError(f"{what}: scalers missing {sorted(missing)[:10]}, trained twice {sorted(twice)[:10]}")


def run_week(job: Job, store: Path, shards: int, week: int, label: str = "") -> Week:
    """Start the week's S shard processes at once; measure wall and CPU; check their reports."""
    what = f"{label}shards={shards} week {week}"
    code = code_hash()
    now = (START + timedelta(days=job.days + 7 * (week - 1))).to_pydatetime()
    logs = job.work / f"{label}s{shards}-w{week}"
    logs.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    files = [(open(logs / f"shard{i}.json", "w+b"), open(logs / f"shard{i}.log", "w+b")) for i in range(shards)]
    ru0, prom0, busy0, self0 = children_cpu(), proc_cpu(job.prometheus.pid), machine_busy(), self_cpu()
    t0 = time.perf_counter()
    procs = {}
    for i in range(shards):
        p = subprocess.Popen(job.args(store, now, week, shards, i), stdout=files[i][0], stderr=files[i][1],
                             env=job.env, cwd=job.work)
        procs[p.pid] = (i, p)
    reaped = _wait_all(job, procs, t0, what)
    ended = reaped.shards
    wall = max(t for t, _, _ in ended.values())
    ru1, prom1, busy1, self1 = children_cpu(), proc_cpu(job.prometheus.pid), machine_busy(), self_cpu()
    client = sum(cpu for _, cpu, _ in ended.values()) + reaped.orphan_cpu
    prom = prom1 - prom0
    row = Week(shards=shards, week=week, scalers=len(job.keys), wall=wall, client_cpu=client, prometheus_cpu=prom,
               other_cpu=(busy1 - busy0) - client - prom - (self1 - self0), load=load, per_shard=[],
               outcomes=Counter(), kinds=Counter(), rusage_children=ru1 - ru0, orphans=reaped.orphans,
               code=code if code == code_hash() else f"{code}→changed")
    _read_reports(row, files, ended, job.keys, what)
    if abs(row.rusage_children - client) > max(0.5, 0.02 * client):
        print(f"warning: {what}: per-process CPU {client:.1f} s differs from the RUSAGE_CHILDREN delta "
              f"{row.rusage_children:.1f} s", file=sys.stderr)
    return row


def code_hash() -> str:
    """A hash of the package's source as the shard processes will import it (an editable install)."""
    h = hashlib.sha256()
    for f in sorted((ROOT / "predictive_scaler").rglob("*.py")):
        h.update(str(f.relative_to(ROOT)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:10]


def code_state() -> str:
    """HEAD and the package files that differ from it (read-only git, no index refresh)."""
    def git(*a: str) -> str:
        r = subprocess.run(["git", "--no-optional-locks", *a], cwd=ROOT, capture_output=True, text=True, check=False)
        return r.stdout.strip() if r.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = git("diff", "--name-only", "HEAD", "--", "predictive_scaler").split()
    if not changed:
        return f"HEAD {head}, package unmodified"
    shown = ", ".join(c.removeprefix("predictive_scaler/") for c in changed[:8])
    more = f" and {len(changed) - 8} more" if len(changed) > 8 else ""
    return f"HEAD {head} with uncommitted changes in predictive_scaler/ ({shown}{more})"


# -- the report -----------------------------------------------------------------------------------

def machine(load: tuple[float, float, float], when: datetime) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, load average at start "
            f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min; shared machine), {when:%Y-%m-%d %H:%M} UTC")


def steady(rows: Sequence[Week]) -> list[Week]:
    late = [r for r in rows if r.week >= 3]
    return late or [max(rows, key=lambda r: r.week)]


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def _counts(c: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "–"


def report(args: argparse.Namespace, rows: Sequence[Week], setup: dict[str, Any]) -> list[str]:
    n = args.scalers
    lines = [
        f"## `predictive-scaler retrain`: {n} scalers, {args.weeks} weeks, shards {args.shards}, from a real Prometheus",
        "",
        f"Command: `{setup['command_line']}`",
        "",
        f"Machine: {setup['machine']}.",
        "",
        f"Code: {setup['code']}; source hash {rows[0].code if rows else '?'}.",
        "",
        f"Setup: Prometheus {setup['prometheus']} on loopback holding {n} request counters "
        f"(`requests_total`, {args.pods} pod(s) each, one `job` value per scaler)"
        + (" and a `DCGM_FI_DEV_GPU_UTIL` gauge per pod" if args.dcgm else " (no DCGM gauges)")
        + f", {setup['span_days']:.1f} days at a {args.sample_step}-s sample step ({setup['samples']:,} samples, "
        f"backfilled in {setup['backfill_s']:.0f} s). Each week runs S processes of `{setup['job_command']}` at once "
        f"(the Indexed Job's pods) on one directory store per shard count; candidates: "
        f"{args.models or 'the default (' + setup['candidates'] + ')'}; history {args.days} days. "
        "CPU: user + system of each shard process and what it waited for (cmdstan included), from `wait4`; "
        "Prometheus from /proc/<pid>/stat; *other* is the rest of the machine's busy time (other people's work).",
        "",
        "| shards | week | wall | client CPU-s / scaler | Prometheus CPU-s / scaler | other CPU-s | load at start | "
        "per shard: scalers, process wall (of it in the job), CPU-s | outcomes | promoted kinds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per = "; ".join(f"{s.scalers}, {s.wall:.1f} s ({s.in_process:.1f}), {s.cpu:.1f} s" for s in r.per_shard)
        lines.append(f"| {r.shards} | {r.week} | {r.wall:.1f} s | {r.client_per_scaler:.2f} | "
                     f"{r.prometheus_per_scaler:.3f} | {r.other_cpu:.1f} | {r.load:.2f} | {per} | "
                     f"{_counts(r.outcomes)} | {_counts(r.kinds)} |")
    return lines + _against_targets(args, rows, setup)


@dataclass(frozen=True)
class Marginal:
    """One steady week with each process's start-up set apart, from its one-scaler probe.

    A week of N scalers on S processes costs S·F + N·c CPU-s (F: a process's start-up — interpreter,
    imports, the first fit's lazy loads; c: a scaler), and the probe F + c, so c = (CPU − S·probe)/(N − S)
    and F = probe − c. The slowest shard's process, m scalers, takes F_w + m·w wall and the probe
    F_w + w, likewise. At 1,000 scalers: S·F/1000 + c CPU-s a scaler, and F_w + L·w wall, L the largest
    shard of 1,000 under the job's hash (:func:`largest_shards`)."""

    shards: int
    startup_cpu: float
    per_scaler_cpu: float
    startup_wall: float
    per_scaler_wall: float

    @classmethod
    def of(cls, n: int, week: Week) -> Marginal:
        slowest = max(week.per_shard, key=lambda sh: sh.wall)
        c = (week.client_cpu - week.shards * week.probe_cpu) / max(1, n - week.shards)
        w = (slowest.wall - week.probe_wall) / max(1, slowest.scalers - 1)
        return cls(week.shards, week.probe_cpu - c, c, week.probe_wall - w, w)

    def cpu_at(self, scalers: int) -> float:
        return self.per_scaler_cpu + self.shards * self.startup_cpu / scalers

    def wall_at(self, largest_shard: int) -> float:
        """Wall time when the slowest shard has ``largest_shard`` scalers."""
        return self.startup_wall + largest_shard * self.per_scaler_wall


def largest_shards(count: int, pods: int, shard_counts: Sequence[int]) -> dict[int, int]:
    """The largest shard of this bench's fleet of ``count`` scalers under the job's own stable hash, per
    shard count (1,000 scalers split 475/525 in two: the slowest shard, not the mean, sets the wall)."""
    from predictive_scaler.core.sharding import shard_of

    keys = [s.key for s in fleet(count, pods)]
    return {n: max(Counter(shard_of(k, n) for k in keys).values()) for n in shard_counts}


@dataclass(frozen=True)
class AtThousand:
    """One shard count's steady weeks with start-up set apart (:class:`Marginal`), and what they give
    at 1,000 scalers: CPU-s per scaler and wall, means over those weeks."""

    weeks: list[Week]
    marginals: list[Marginal]
    cpu: float
    wall: float


def at_thousand(n: int, by_shards: dict[int, list[Week]], largest: dict[int, int]) -> dict[int, AtThousand]:
    """Per shard count, the extrapolation to 1,000 scalers with each process's start-up counted once per
    process and the slowest shard holding ``largest[s]`` scalers."""
    out = {}
    for s, rs in by_shards.items():
        st = steady(rs)
        ms = [Marginal.of(n, r) for r in st]
        out[s] = AtThousand(st, ms, statistics.fmean(m.cpu_at(1000) for m in ms),
                            statistics.fmean(m.wall_at(largest[s]) for m in ms))
    return out


def _startup_apart(at: dict[int, AtThousand], largest: dict[int, int]) -> list[str]:
    """The table of :func:`at_thousand`."""
    lines = ["Start-up set apart (each week, after it, one process trains one scaler alone: the probe; "
             "see `Marginal`):", "",
             "| shards | probe: wall, CPU-s | start-up per process: CPU-s, wall | per scaler: CPU-s, wall in the "
             "slowest shard | 1,000 scalers: CPU-s per scaler | largest shard | wall | ≤ 15 min | "
             "≤ 1.8 CPU-s / scaler (client) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s, a in sorted(at.items()):
        st, ms = a.weeks, a.marginals
        lines.append(
            f"| {s} | {statistics.fmean(r.probe_wall for r in st):.1f} s, {statistics.fmean(r.probe_cpu for r in st):.2f} | "
            f"{statistics.fmean(m.startup_cpu for m in ms):.2f}, {statistics.fmean(m.startup_wall for m in ms):.1f} s | "
            f"{statistics.fmean(m.per_scaler_cpu for m in ms):.2f}, {statistics.fmean(m.per_scaler_wall for m in ms):.2f} s | "
            f"{a.cpu:.2f} | {largest[s]} | {a.wall:.0f} s ({a.wall / 60:.1f} min) | {verdict(a.wall <= TARGET_WALL_1000_S)} | "
            f"{verdict(a.cpu <= TARGET_CPU_PER_SCALER)} |")
    lines.append("")
    return lines


def _steady_table(n: int, by_shards: dict[int, list[Week]]) -> tuple[list[str], dict[int, float]]:
    """The steady weeks per shard count, extrapolated linearly; and their mean wall per shard count."""
    lines = ["| shards | wall | client CPU-s / scaler | + Prometheus | 1,000 scalers: wall × 1000/N | "
             "≤ 15 min | ≤ 1.8 CPU-s / scaler (client) |",
             "|---|---|---|---|---|---|---|"]
    walls: dict[int, float] = {}
    for s, rs in sorted(by_shards.items()):
        st = steady(rs)
        wall = statistics.fmean(r.wall for r in st)
        walls[s] = wall
        cpu = statistics.fmean(r.client_per_scaler for r in st)
        prom = statistics.fmean(r.prometheus_per_scaler for r in st)
        thousand = wall * 1000 / n
        lines.append(f"| {s} | {wall:.1f} s | {cpu:.2f} | {cpu + prom:.2f} | {thousand:.0f} s "
                     f"({thousand / 60:.1f} min) | {verdict(thousand <= TARGET_WALL_1000_S)} | "
                     f"{verdict(cpu <= TARGET_CPU_PER_SCALER)} |")
    return lines, walls


def _startup_verdict(at: dict[int, AtThousand]) -> str:
    """The 1,000-scaler wall and CPU per scaler of :func:`at_thousand` against the targets."""
    quick = min(at, key=lambda s: at[s].wall)
    worst_cpu = max(a.cpu for a in at.values())
    return (f"- **1,000 scalers, start-up set apart: {at[quick].wall / 60:.1f} min with {quick} shard(s)** "
            f"against ≤ 15 min: {verdict(at[quick].wall <= TARGET_WALL_1000_S)}; **{worst_cpu:.2f} "
            f"CPU-s per scaler** at most (every shard count, pulls included) against ≤ 1.8: "
            f"{verdict(worst_cpu <= TARGET_CPU_PER_SCALER)}.")


def _against_targets(args: argparse.Namespace, rows: Sequence[Week], setup: dict[str, Any]) -> list[str]:  # noqa: C901
    """The steady state, its extrapolation to 1,000 scalers and the 2-shard speed-up, each against its target."""
    n = args.scalers
    lines: list[str] = []
    by_shards: dict[int, list[Week]] = {}
    for r in rows:
        by_shards.setdefault(r.shards, []).append(r)
    which = "weeks ≥ 3" if args.weeks >= 3 else f"week {args.weeks} (fewer than 3 weeks run)"
    table, walls = _steady_table(n, by_shards)
    largest = largest_shards(1000, args.pods, sorted(by_shards))
    probed = all(r.probe_cpu > 0 for rs in by_shards.values() for r in steady(rs))
    at = at_thousand(n, by_shards, largest) if probed else {}
    lines += ["", f"### Steady state ({which}) against the targets", "", *table, "",
              *(_startup_apart(at, largest) if probed else [])]
    best = min(walls, key=lambda s: walls[s])
    if probed:
        lines.append(_startup_verdict(at))
    lines.append(f"- 1,000 scalers, {'the upper bound: ' if probed else ''}{walls[best] * 1000 / n / 60:.1f} min with "
                 f"{best} shard(s) against ≤ 15 min: {verdict(walls[best] * 1000 / n <= TARGET_WALL_1000_S)} (linear "
                 f"in scalers from {n}: each process's start-up, a few seconds, is counted 1000/{n} times per "
                 "process instead of once, so it errs high).")
    cores = os.cpu_count() or 1
    both = ([m.cpu_at(1000) + r.prometheus_per_scaler
             for a in at.values() for r, m in zip(a.weeks, a.marginals, strict=True)]
            if probed else [r.client_per_scaler + r.prometheus_per_scaler for rs in by_shards.values() for r in steady(rs)])
    bound = 1000 * min(both) / cores
    lines.append(f"- If the machine were the job's alone and fully used, 1,000 scalers would take at least "
                 f"{bound / 60:.1f} min ({1000:,} × {min(both):.2f} CPU-s client{' at 1,000' if probed else ''} + Prometheus / "
                 f"{cores} cores): the "
                 "CPU-bound floor, which other people's work on the machine does not inflate as it does the wall time.")
    cpus = [r.client_per_scaler for rs in by_shards.values() for r in steady(rs)]
    lo, hi = min(cpus), max(cpus)
    lines.append(f"- CPU per scaler of these {n}, start-ups included, pulls included: {lo:.2f}–{hi:.2f} CPU-s "
                 f"(client, every shard count) against ≤ 1.8: {verdict(hi <= TARGET_CPU_PER_SCALER)}; Prometheus adds "
                 f"{min(r.prometheus_per_scaler for r in rows):.3f}–{max(r.prometheus_per_scaler for r in rows):.3f} "
                 "CPU-s per scaler on the same cores (in a cluster it runs elsewhere).")
    if 1 in walls and 2 in walls:
        weeks1 = {r.week: r.wall for r in steady(by_shards[1])}
        weeks2 = {r.week: r.wall for r in steady(by_shards[2])}
        common = sorted(set(weeks1) & set(weeks2))
        speed = sum(weeks1[w] for w in common) / sum(weeks2[w] for w in common)
        split = "/".join(str(s.scalers) for s in by_shards[2][0].per_shard)
        ideal = n / max(s.scalers for s in by_shards[2][0].per_shard)
        lines.append(f"- **2 shards over 1: {speed:.2f}×** (week(s) {', '.join(map(str, common))}) against ≥ 1.8×: "
                     f"{verdict(speed >= TARGET_SPEEDUP)}. The stable hash splits these {n} scalers {split}: were "
                     f"every scaler equally costly, that would cap it at {ideal:.2f}× (1,000 of them split "
                     f"{largest[2]}/{1000 - largest[2]}, a cap of {1000 / largest[2]:.2f}×).")
        all1 = {r.week: r for r in by_shards[1]}
        all2 = {r.week: r for r in by_shards[2]}
        per_week = ", ".join(f"week {w} {all1[w].wall / all2[w].wall:.2f}× (other work {all1[w].other_cpu:.0f} and "
                             f"{all2[w].other_cpu:.0f} CPU-s)" for w in sorted(set(all1) & set(all2)))
        lines.append(f"- 2 shards over 1, week by week: {per_week}.")
    other = sum(r.other_cpu for r in rows)
    timed = sum(r.wall for r in rows)
    lines.append(f"- Other work on the machine while the job ran: {other:.0f} CPU-s over {timed:.0f} s of timed wall "
                 f"({other / (timed * cores):.0%} of the {cores} cores){' — the wall times are inflated by it' if other > 0.1 * timed * cores else ''}.")
    codes = {r.code for r in rows}
    if len(codes) > 1:
        changed = ", ".join(f"shards {r.shards} week {r.week}: {r.code}" for r in rows)
        lines.append(f"- **The package's source changed during this run** (someone edited predictive_scaler/), so "
                     f"the weeks did not all run the same code — compare with care ({changed}).")
    orphans = sum(r.orphans for r in rows)
    if orphans:
        lines.append(f"- {orphans} process(es) started by the shards were not waited for by them (re-parented to the "
                     "benchmark, which reaped them and counted their CPU in the client's).")
    elif not setup.get("subreaper"):
        lines.append("- (Could not become the subreaper of the shards' orphans: a process they leave behind would "
                     "go uncounted, and show as *other*.)")
    lines.append("")
    return lines


# -- main -----------------------------------------------------------------------------------------

def child_env() -> dict[str, str]:
    """The pod's environment: no BLAS thread variables (the command sets them before numpy loads)."""
    return {k: v for k, v in os.environ.items() if k not in THREAD_VARS}


def job_command() -> list[str]:
    script = Path(sys.executable).parent / "predictive-scaler"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from predictive_scaler.cli import main; sys.exit(main(sys.argv[1:]))"]


def measure(args: argparse.Namespace, root: Path) -> tuple[list[Week], dict[str, Any]]:
    from predictive_scaler.forecasting.registry import DEFAULT_CANDIDATES

    shard_counts = [int(x) for x in args.shards.split(",")]
    end = START + timedelta(days=args.days + 7 * (args.weeks - 1)) + TAIL
    begin = START - LEAD
    history = SyntheticHistory(begin, int((end - begin).total_seconds()) // STEP)
    scalers = fleet(args.scalers, args.pods)
    subreaper = become_subreaper()
    config = root / "scalers.yaml"
    config.write_text(yaml.safe_dump_all([manifest(s, history.series(s.key)) for s in scalers]))
    # The start-up probe's scaler: the first by key, alone in a config and a store of its own.
    probe = min(scalers, key=lambda s: s.key)
    probe_config = root / "probe.yaml"
    probe_config.write_text(yaml.safe_dump_all([manifest(probe, history.series(probe.key))]))
    print(f"backfilling {len(scalers)} scalers × {history.steps * STEP / 86400:.1f} days …", file=sys.stderr, flush=True)
    samples, backfill_s = backfill(root / "tsdb", root / "work", scalers, history, args.sample_step, args.dcgm)
    print(f"  {samples:,} samples in {backfill_s:.0f} s", file=sys.stderr, flush=True)
    rows: list[Week] = []
    with prometheus_server(root / "tsdb", root / "work") as server:
        warm(server.url, begin.to_pydatetime(), end.to_pydatetime())
        job = Job(command=job_command(), config=config, prometheus=server, days=args.days, models=args.models,
                  keys=frozenset(s.key for s in scalers), work=root / "runs", timeout=args.timeout, env=child_env(),
                  extra=shlex.split(args.job_args or ""))
        probe_job = replace(job, config=probe_config, keys=frozenset({probe.key}))
        for shards in shard_counts:
            store = root / f"store-s{shards}"
            store.mkdir()
            probe_store = root / f"probe-store-s{shards}"
            probe_store.mkdir()
            for week in range(1, args.weeks + 1):
                row = run_week(job, store, shards, week)
                alone = run_week(probe_job, probe_store, 1, week, label="probe-")
                row.probe_wall, row.probe_cpu = alone.wall, alone.client_cpu
                rows.append(row)
                print(f"shards={shards} week={week}: {row.wall:.1f} s wall, {row.client_per_scaler:.2f} CPU-s/scaler "
                      f"(+{row.prometheus_per_scaler:.3f} Prometheus, other {row.other_cpu:.1f} s, load {row.load:.2f}) "
                      f"{_counts(row.outcomes)}", file=sys.stderr, flush=True)
        setup: dict[str, Any] = {"prometheus": server.version,
                 "job_command": "predictive-scaler retrain --config scalers.yaml --prometheus URL --store DIR "
                                "--now T --run-id wN --shard-count S --shard-index i --json"
                                + (f" --history {args.days}d" if args.days != 28 else "")
                                + (f" --models {args.models}" if args.models else "")
                                + (f" {args.job_args}" if args.job_args else "")}
    setup.update(samples=samples, backfill_s=backfill_s, subreaper=subreaper, span_days=history.steps * STEP / 86400,
                 candidates=", ".join(DEFAULT_CANDIDATES))
    return rows, setup


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scalers", type=int, default=40, help="scalers in the fleet (default 40)")
    p.add_argument("--weeks", type=int, default=4, help="consecutive weekly runs per shard count (default 4)")
    p.add_argument("--shards", default="1,2", help="comma-separated shard counts (default 1,2)")
    p.add_argument("--days", type=int, default=28, help="history the job pulls, days (default 28, the job's)")
    p.add_argument("--sample-step", type=int, default=60, help="seconds between backfilled samples (default 60)")
    p.add_argument("--pods", type=int, default=1, help="pods (counter series, GPUs) per scaler (default 1)")
    p.add_argument("--dcgm", action=argparse.BooleanOptionalAction, default=True,
                   help="backfill a DCGM utilisation gauge per pod, so the job's DCGM pulls return data (default on)")
    p.add_argument("--models", help="candidate kinds passed to the job (default: none given, the job's default)")
    p.add_argument("--job-args", help="more arguments for every shard process, e.g. --job-args=--cold")
    p.add_argument("--timeout", type=int, default=3600, help="seconds one week may run (default 3600)")
    p.add_argument("--out", type=Path, default=Path("backtests/results/retrain-run.md"),
                   help="append the Markdown report here (default backtests/results/retrain-run.md)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (TSDB, stores, shard logs)")
    args = p.parse_args(argv)
    try:
        counts = [int(x) for x in args.shards.split(",")]
    except ValueError:
        p.error(f"--shards {args.shards!r}: give comma-separated integers, e.g. 1,2")
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        p.error("--shards: distinct shard counts of at least 1")
    if args.scalers < 1 or args.weeks < 1 or args.pods < 1:
        p.error("--scalers, --weeks and --pods must be at least 1")
    if args.days < 14:
        p.error("--days must be at least 14 (the job's minimum history)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    given = sys.argv[1:] if argv is None else list(argv)
    started = datetime.now(UTC)
    setup_machine = machine(os.getloadavg(), started)
    setup_code = code_state()
    root = Path(tempfile.mkdtemp(prefix="bench-retrain-"))
    try:
        rows, setup = measure(args, root)
    except BenchError as exc:
        print(f"bench-retrain FAILED: {exc}\n(work directory kept: {root})", file=sys.stderr)
        return 1
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"work directory kept: {root}", file=sys.stderr)
    setup.update(machine=setup_machine, code=setup_code,
                 command_line=shlex.join(["python", "-m", "benchmarks.retrain", *given]))
    text = "\n".join(report(args, rows, setup)) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fresh = not args.out.exists()
    with open(args.out, "a", encoding="utf-8") as fh:
        if fresh:
            fh.write("# Retraining job runs (`make bench-retrain`)\n\nEach section is one run of "
                     "`benchmarks/retrain.py`, appended.\n\n")
        fh.write(text + "\n")
    print(f"appended to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

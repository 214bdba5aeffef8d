"""`predictive-scaler retrain` against a real Prometheus holding several scalers' backfilled histories.

The module's one Prometheus holds 21 days (2026-01-05 → 01-26, sampled every 60 s) of:

- ``chat``: requests on 4 GPUs that each serve 40 req/s at 100 % (daily peaks saturate), plus a
  fifth GPU of the same Deployment idling at 2 %;
- ``gappy``: the same shape with a whole day missing (a scrape outage) — still trained;
- ``short``: only the last 9 days — skipped with its reason;
- ``drift``: clean for two weeks, then days 14-19 replaced by a smooth curve (a broken recording
  rule), clean again for the last 2 days (the holdout) — the second week's challenger calibrates
  on the false calm, is worse on the holdout and is kept out;
- ``broken``: a scaler whose query Prometheus refuses — failed, so each run exits 1 (the weekly
  CronJob shows failed), the others unaffected.

Two runs: week 1 at day 14, week 2 at day 21. The crash and corruption cases start from a copy of
one week-1 store of ``chat``, ``gappy`` and ``drift`` and run week 2 against the same Prometheus.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from predictive_scaler.cli import main
from predictive_scaler.errors import ModelError
from predictive_scaler.forecasting.store import MODEL_FILE, ModelStore
from predictive_scaler.series import Series
from tests.support.openmetrics import CounterFamily, GaugeFamily
from tests.support.prometheus import PrometheusServer, backfill, running_prometheus

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]  # ~25 s: promtool backfill + eleven runs

START = pd.Timestamp("2026-01-05", tz="UTC")
STEP = 300
DAYS = 21
PER_GPU = 40.0
GPUS = 4
PRICE = 3.0
MODELS = "persistence,seasonal-naive"


def shape(seed: int, *, noise: float = 0.08, days: int = DAYS) -> np.ndarray:
    n = days * 86400 // STEP
    t = np.arange(n)
    rng = np.random.default_rng(seed)
    return 100.0 * (1.0 + 0.6 * np.sin(2 * np.pi * t / 288)) * (1 + noise * rng.standard_normal(n))


def series(values: np.ndarray) -> Series:
    return Series(values=values, start=START, step_seconds=STEP)


def histories() -> tuple[list[CounterFamily], list[GaugeFamily]]:
    chat = shape(1)
    gappy = shape(2)
    gappy[9 * 288: 10 * 288] = np.nan
    short = shape(3)
    short[: 12 * 288] = np.nan
    drift = shape(4)
    drift[14 * 288: 19 * 288] = shape(4, noise=0.0)[14 * 288: 19 * 288]
    counters = [
        CounterFamily(name=f"{job}_requests_total", series=series(values), pods=(f"{job}-6d4b8c7f9-aaaaa",),
                      labels={"namespace": "ml", "job": job}, reset_every=timedelta(days=5))
        for job, values in (("chat", chat), ("gappy", gappy), ("short", short), ("drift", drift))
    ]
    util = series(np.clip(chat / (PER_GPU * GPUS) * 100, 0, 100))
    pods = [f"chat-6d4b8c7f9-{c * 5}" for c in "bcde"]
    per_gpu = [({"pod": pod, "gpu": "0", "UUID": f"GPU-{i}"}, util) for i, pod in enumerate(pods)]
    per_gpu.append(({"pod": "chat-6d4b8c7f9-fffff", "gpu": "0", "UUID": "GPU-idle"},
                    series(np.full(len(chat), 2.0))))
    gauges = [GaugeFamily(name="DCGM_FI_DEV_GPU_UTIL", per_series=per_gpu, labels={"namespace": "ml"},
                          help="GPU utilisation (%).")]
    return counters, gauges


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    root = tmp_path_factory.mktemp("retrain-prometheus")
    counters, gauges = histories()
    backfill(root / "tsdb", root / "work", counters=counters, gauges=gauges, sample_step=60)
    with running_prometheus(root / "tsdb", root / "work") as server:
        yield server


def scaler(name: str, query: str | None = None) -> dict[str, object]:
    return {
        "apiVersion": "autoscaling.predictive-scaler.io/v1alpha1", "kind": "PredictiveScaler",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "target": {"name": name},
            "demand": {"kind": "requests",
                       "query": query or f'sum(rate({name}_requests_total{{namespace="ml",job="{name}"}}[5m]))'},
            "capacity": {"requestsPerReplica": 20, "gpuUtilizationTarget": 0.7},
            "prewarm": {"budget": {"pricePerGpuHour": PRICE}},
        },
    }


@dataclass
class Runs:
    week1: dict[str, dict[str, object]]
    week2: dict[str, dict[str, object]]
    week2_again: dict[str, dict[str, object]]
    store: ModelStore
    exit_codes: tuple[int, ...]
    text: str


@pytest.fixture(scope="module")
def runs(prometheus: PrometheusServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    tmp = tmp_path_factory.mktemp("retrain-cmd")
    config = tmp / "scalers.yaml"
    config.write_text(yaml.safe_dump_all([
        scaler("chat"), scaler("gappy"), scaler("short"), scaler("drift"),
        scaler("broken", query="sum(rate(chat_requests_total{job=~\"(\"}[5m]))"),
    ]))
    store = tmp / "models"
    with pytest.MonkeyPatch.context() as mp:
        capture = _Capture()
        mp.setattr("sys.stdout", capture)
        codes = []
        outs = []
        for day, run_id in ((14, "w1"), (21, "w2"), (21, "w2")):
            capture.reset()
            codes.append(main(["retrain", "--config", str(config), "--prometheus", prometheus.url,
                               "--store", str(store), "--now", (START + pd.Timedelta(days=day)).isoformat(),
                               "--run-id", run_id, "--models", MODELS, "--json"]))
            outs.append({s["key"].split("/")[1]: s for s in json.loads(capture.text())["scalers"]})
        capture.reset()
        main(["retrain", "--config", str(config), "--prometheus", prometheus.url, "--store", str(store),
              "--now", (START + pd.Timedelta(days=21)).isoformat(), "--run-id", "w2", "--models", MODELS])
        text = capture.text()
    yield Runs(outs[0], outs[1], outs[2], ModelStore(store), tuple(codes), text)


class _Capture:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, s: str) -> int:
        self.parts.append(s)
        return len(s)

    def flush(self) -> None:
        pass

    def reset(self) -> None:
        self.parts.clear()

    def text(self) -> str:
        return "".join(self.parts)


def test_the_scalers_with_enough_history_are_trained(runs: Runs) -> None:
    assert runs.exit_codes == (1, 1, 1)  # broken's refused query fails every run; the others are still trained
    for name in ("chat", "gappy", "drift"):
        assert runs.week1[name]["result"] == "promoted", runs.week1[name]["reason"]
        assert runs.store.serving(name, expected_series=name).manifest.metrics["retrain"]["run_id"] in ("w1", "w2")


@pytest.mark.parametrize(("name", "week", "reason"), [
    ("short", "week1", "insufficient history: 2.0 days < 14 days"),
    ("short", "week2", "insufficient history: 9.0 days < 14 days"),
], ids=["two-days", "nine-days"])
def test_short_history_is_skipped_with_its_reason(runs: Runs, name: str, week: str, reason: str) -> None:
    out = getattr(runs, week)[name]
    assert out["result"] == "skipped"
    assert reason in out["reason"]
    assert runs.store.pointer(name) is None  # nothing published: its controller stays reactive


@pytest.mark.parametrize("week", ["week1", "week2", "week2_again"])
def test_a_refused_query_fails_the_scaler_with_its_reason(runs: Runs, week: str) -> None:
    out = getattr(runs, week)["broken"]
    assert out["result"] == "failed"  # not done: the next run tries it again
    assert "SourceError" in out["reason"] and "bad_data" in out["reason"] and "fix the query" in out["reason"]
    assert runs.store.pointer("broken") is None


def test_a_run_whose_scalers_are_only_skipped_succeeds(prometheus: PrometheusServer, tmp_path: Path) -> None:
    code, out = retrain_json(prometheus, write_config(tmp_path / "scalers.yaml", "short"), tmp_path / "models", 21, "w3")
    assert code == 0 and out["short"]["result"] == "skipped", out  # short history is this scaler's state


def test_an_unreachable_prometheus_fails_the_run_with_the_reason(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.prometheus import free_port

    code = main(["retrain", "--config", str(write_config(tmp_path / "scalers.yaml", "chat")),
                 "--prometheus", f"http://127.0.0.1:{free_port()}", "--store", str(tmp_path / "models"),
                 "--now", (START + pd.Timedelta(days=21)).isoformat(), "--timeout", "1", "--json"])
    out, err = capsys.readouterr()
    assert code == 1, "the weekly CronJob must show failed"
    [outcome] = json.loads(out)["scalers"]
    assert outcome["result"] == "failed" and "cannot connect (connection refused)" in outcome["reason"], outcome
    assert "1 scaler(s) failed, so this run fails (exit 1)" in err and "ml/chat: SourceError" in err, err


def test_a_worse_challenger_is_not_promoted(runs: Runs) -> None:
    out = runs.week2["drift"]
    assert out["result"] == "kept", out["reason"]
    assert "keep serving" in out["reason"]  # type: ignore[operator]
    assert out["serving_version"] == runs.week1["drift"]["version"]
    assert runs.store.pointer("drift").version == runs.week1["drift"]["version"]  # type: ignore[union-attr]


def test_a_rerun_of_the_same_week_changes_nothing(runs: Runs) -> None:
    for name in ("chat", "gappy", "drift"):
        assert runs.week2_again[name]["result"] == "already-done"
        assert len(runs.store.list(name)) == 1 + (runs.week2[name]["result"] == "promoted")
    assert runs.week2_again["short"]["result"] == "skipped"  # skipped ones are tried again


def test_capacity_from_dcgm_is_recorded_in_the_manifest(runs: Runs) -> None:
    cap = runs.store.serving("chat").manifest.capacity
    assert cap is not None
    truth = PER_GPU * 0.7
    assert cap["requests_per_replica"] == pytest.approx(truth, rel=0.05)
    assert cap["low"] <= cap["requests_per_replica"] <= cap["high"]
    assert cap["steps_saturated"] > 0  # the daily peaks were left out


def test_idle_allocated_gpus_and_their_cost_are_reported(runs: Runs) -> None:
    idle = runs.week2["chat"]["idle_gpus"]
    assert idle["mean"] == pytest.approx(1.0)  # type: ignore[index]
    assert idle["cost_per_day"] == pytest.approx(24 * PRICE)  # type: ignore[index]
    assert runs.week2["gappy"]["idle_gpus"] is None  # no DCGM data is not "no waste"
    assert "idle allocated GPUs" in runs.text and "72.00/day" in runs.text


@pytest.mark.parametrize(("name", "days", "expect_days"), [
    ("chat", 21, 21.0),
    ("short", 21, 9.0),  # the metric began 9 days ago: leading no-data is trimmed, not zero
], ids=["full", "trimmed-start"])
def test_history_for_scaler_is_the_jobs_pull(prometheus: PrometheusServer, name: str, days: int,
                                             expect_days: float) -> None:
    from predictive_scaler.retrain.history import history_for_scaler
    from predictive_scaler.sources.prometheus import PrometheusSource
    from predictive_scaler.spec import ScalerSpec

    spec = ScalerSpec.from_dict(scaler(name)["spec"])  # type: ignore[arg-type]
    end = (START + pd.Timedelta(days=DAYS)).to_pydatetime()
    got = history_for_scaler(PrometheusSource(prometheus.url), spec, end, days, namespace="ml", min_history=None)
    observed = got.slice(int(np.flatnonzero(np.isfinite(got.values))[0]), len(got))
    assert observed.span.total_seconds() / 86400 == pytest.approx(expect_days, abs=0.01)
    assert got.step_seconds == STEP and got.end == pd.Timestamp(end)
    if name == "chat":  # the backfilled rates come back, except the step of each counter reset
        # Demand is evaluated every minute and averaged per step, as the controller serves it
        # (sources/demand.py): the five evaluations of a [5m] rate inside a step cover this
        # step for 3/5 of their windows and the previous one for 2/5.
        steps = shape(1)
        close = np.isclose(got.values[1:], 0.6 * steps[1:] + 0.4 * steps[:-1], rtol=1e-6)
        assert close.mean() > 0.995
        assert np.flatnonzero(~close).size <= 2 * (DAYS // 5 + 1)  # a reset's window spans two steps


# -- crash and corruption against the same Prometheus ---------------------------------------------

CRASH_FLEET = ("chat", "gappy", "drift")  # in week 2: chat and gappy are promoted, drift is kept


class Killed(BaseException):
    """A process death (SIGKILL, OOM kill): not an Exception, so nothing in the job handles it."""


def retrain_json(prometheus: PrometheusServer, config: Path, store: Path, day: int,
                 run_id: str) -> tuple[int, dict[str, dict[str, object]]]:
    with pytest.MonkeyPatch.context() as mp:
        capture = _Capture()
        mp.setattr("sys.stdout", capture)
        code = main(["retrain", "--config", str(config), "--prometheus", prometheus.url, "--store", str(store),
                     "--now", (START + pd.Timedelta(days=day)).isoformat(), "--run-id", run_id,
                     "--models", MODELS, "--json"])
    if not capture.text():
        return code, {}
    return code, {s["key"].split("/")[1]: s for s in json.loads(capture.text())["scalers"]}


def write_config(path: Path, *names: str) -> Path:
    path.write_text(yaml.safe_dump_all([scaler(n) for n in names]))
    return path


@pytest.fixture(scope="module")
def week1_store(prometheus: PrometheusServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store after a clean week-1 run of CRASH_FLEET; tests copy it, never change it."""
    tmp = tmp_path_factory.mktemp("retrain-week1")
    code, out = retrain_json(prometheus, write_config(tmp / "scalers.yaml", *CRASH_FLEET), tmp / "models", 14, "w1")
    assert code == 0 and all(out[n]["result"] == "promoted" for n in CRASH_FLEET), out
    return tmp / "models"


@pytest.fixture
def store_dir(week1_store: Path, tmp_path: Path) -> Path:
    shutil.copytree(week1_store, tmp_path / "models")
    return tmp_path / "models"


def assert_store_consistent(store: ModelStore) -> None:
    """Every serving pointer names a listed version that loads and verifies; no temporary is a version."""
    for name in store.names():
        versions = [v.version for v in store.list(name)]
        assert not any(v.startswith(".") for v in versions)
        pointer = store.pointer(name)
        if pointer is not None:
            assert pointer.version in versions
            loaded = store.serving(name, expected_series=name)  # raises if anything is off
            assert loaded.manifest.sha256 == pointer.sha256


def damage(path: Path) -> None:
    data = path.read_bytes()
    assert b"0" in data
    path.write_bytes(data.replace(b"0", b"1", 3))


def test_a_corrupted_new_version_is_refused_and_the_previous_version_keeps_serving(
        prometheus: PrometheusServer, store_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write_config(tmp_path / "scalers.yaml", "chat")
    store = ModelStore(store_dir)
    served = store.pointer("chat").version  # type: ignore[union-attr]
    real_publish = ModelStore.publish

    def publish_then_damage(self: ModelStore, name: str, model: object, **kwargs: object) -> str:
        version = real_publish(self, name, model, **kwargs)  # type: ignore[arg-type]
        damage(self.version_dir(name, version) / MODEL_FILE)  # bit rot / a bad write before it is served
        return version

    with monkeypatch.context() as mp:
        mp.setattr(ModelStore, "publish", publish_then_damage)
        code, out = retrain_json(prometheus, config, store_dir, 21, "w2")
    assert code == 1  # a failed scaler fails the Job, so it is retried and seen
    refused = out["chat"]["version"]
    assert out["chat"]["result"] == "failed"
    assert "sha256 does not match" in out["chat"]["reason"]  # type: ignore[operator]
    assert f"still serving {served}" in out["chat"]["reason"]  # type: ignore[operator]
    assert store.pointer("chat").version == served  # type: ignore[union-attr]
    assert_store_consistent(store)
    with pytest.raises(ModelError, match="sha256 does not match"):
        store.load("chat", refused)  # type: ignore[arg-type]
    # Resumed: the damaged version from this run is refused again and the scaler is trained anew.
    code, again = retrain_json(prometheus, config, store_dir, 21, "w2")
    assert code == 0 and again["chat"]["result"] == "promoted", again["chat"]["reason"]
    assert again["chat"]["version"] not in (refused, served)
    assert store.pointer("chat").version == again["chat"]["version"]  # type: ignore[union-attr]
    assert_store_consistent(store)


def test_a_corrupted_serving_artifact_is_refused_and_the_next_run_replaces_it(
        prometheus: PrometheusServer, store_dir: Path, tmp_path: Path) -> None:
    store = ModelStore(store_dir)
    damaged = store.pointer("chat").version  # type: ignore[union-attr]
    damage(store.version_dir("chat", damaged) / MODEL_FILE)
    with pytest.raises(ModelError, match="sha256 does not match.*(rollback|retrain)"):
        store.serving("chat", expected_series="chat")  # what the controller loads: refused
    code, out = retrain_json(prometheus, write_config(tmp_path / "scalers.yaml", "chat"), store_dir, 21, "w2")
    assert code == 0 and out["chat"]["result"] == "promoted"
    assert f"serving version {damaged} was refused" in out["chat"]["reason"]  # type: ignore[operator]
    assert "sha256 does not match" in out["chat"]["reason"]  # type: ignore[operator]
    assert store.pointer("chat").version == out["chat"]["version"] != damaged  # type: ignore[union-attr]
    assert_store_consistent(store)


def test_a_crash_halfway_through_a_run_leaves_the_store_consistent_and_a_rerun_completes(
        prometheus: PrometheusServer, store_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write_config(tmp_path / "scalers.yaml", *CRASH_FLEET)
    store = ModelStore(store_dir)
    week1 = {n: store.pointer(n).version for n in CRASH_FLEET}  # type: ignore[union-attr]
    real_promote = ModelStore.promote

    def killed_before_serving_gappy(self: ModelStore, name: str, version: str) -> object:
        if name == "gappy":  # the second scaler: its new version is written, its pointer not yet moved
            raise Killed(f"killed before serving {name} {version}")
        return real_promote(self, name, version)

    with monkeypatch.context() as mp:
        mp.setattr(ModelStore, "promote", killed_before_serving_gappy)
        with pytest.raises(Killed):
            retrain_json(prometheus, config, store_dir, 21, "w2")
    assert_store_consistent(store)
    assert store.pointer("chat").version != week1["chat"]  # type: ignore[union-attr]  # finished before the crash
    assert store.pointer("gappy").version == week1["gappy"]  # type: ignore[union-attr]  # previous keeps serving
    assert store.pointer("drift").version == week1["drift"]  # type: ignore[union-attr]  # not reached
    half_done = [v.version for v in store.list("gappy") if v.version != week1["gappy"]]
    assert len(half_done) == 1  # published, verified on disk, never served

    code, again = retrain_json(prometheus, config, store_dir, 21, "w2")
    assert code == 0
    assert {n: again[n]["result"] for n in CRASH_FLEET} == {
        "chat": "already-done", "gappy": "promoted", "drift": "kept"}
    assert "before an interruption" in again["gappy"]["reason"]  # type: ignore[operator]
    assert again["gappy"]["version"] == half_done[0]  # reused, not trained and published twice
    assert_store_consistent(store)
    assert {n: len(store.list(n)) for n in CRASH_FLEET} == {"chat": 2, "gappy": 2, "drift": 1}

"""Fixtures of the reliability suite: the fault proxy before the real Prometheus, a model store
template with the served models, the fake API server, and :class:`World` builders."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pytest_httpserver import HTTPServer

from predictive_scaler.forecasting.baselines import PersistenceForecaster
from predictive_scaler.forecasting.store import ModelStore, TrainingWindow
from predictive_scaler.series import Series
from tests.reliability.harness import World
from tests.support.fakes.apiserver import FakeApiServer
from tests.support.prometheus import BackfilledPrometheus
from tests.support.proxy import FaultProxy
from tests.support.specs import scaler_spec

#: Demand query a user would write (per-pod counters with resets). Two minutes of range over a
#: 60 s scrape: a [1m] range holds a single sample whenever the query time is not on a scrape
#: (e.g. after a retry's wait), and rate() of one sample is an empty result.
QUERY = 'sum(rate(requests_total{namespace="ml",job="inference"}[2m]))'
MODEL = "llm"
BUSY_MODEL = "llm-busy"
TRAIN_DAYS = 10


def trace_time(prom: BackfilledPrometheus, offset: timedelta) -> datetime:
    """A whole minute, one minute past a 5-minute boundary, ``offset`` into the trace."""
    t = prom.history.trace.start.to_pydatetime() + offset
    return datetime.fromtimestamp(math.floor(t.timestamp() / 300) * 300 + 60, UTC)


def busy_gpus(prom: BackfilledPrometheus) -> Series:
    """The DCGM busy-GPU demand the backfill implies for the ``llm`` pods (1-min step)."""
    h = prom.history
    share = h.trace.values / len(h.pods)
    util = np.clip(share / h.capacity_per_gpu * 100.0, 0.0, 100.0)
    return Series(values=len(h.pods) * util / 100.0, start=h.trace.start, step_seconds=h.trace.step_seconds,
                  name=BUSY_MODEL)


def capacity_per_replica(prom: BackfilledPrometheus) -> float:
    # About eight replicas at the trace's P95, so the 1–12 range has room both ways.
    return round(float(np.nanpercentile(prom.history.trace.values, 95)) / 8, 1)


def matrix_spec(prom: BackfilledPrometheus, **overrides: Any) -> dict[str, Any]:
    spec = scaler_spec(model=MODEL, query=QUERY, requests_per_replica=capacity_per_replica(prom), max_replicas=12)
    spec.update(overrides)  # whole top-level fields, `model` included (scaler_spec's own `model` is a name)
    return spec


def fit_persistence(series: Series, name: str) -> tuple[Any, TrainingWindow]:
    grid = series.resample(300)
    history = grid.slice(0, TRAIN_DAYS * 288)
    history = Series(values=history.values, start=history.start, step_seconds=300, name=name)
    return PersistenceForecaster().fit(history), TrainingWindow.of(history)


@pytest.fixture(scope="session")
def proxy(prometheus_server: BackfilledPrometheus) -> Iterator[FaultProxy]:
    with FaultProxy(prometheus_server.url) as p:
        yield p


@pytest.fixture(autouse=True)
def _clear_proxy_faults(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "proxy" in request.fixturenames:
        request.getfixturevalue("proxy").clear()


@pytest.fixture(scope="session")
def store_template(prometheus_server: BackfilledPrometheus, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Models served in every scenario: persistence on the request trace and on busy GPUs."""
    store = ModelStore(tmp_path_factory.mktemp("reliability-models"))
    for name, series in ((MODEL, prometheus_server.history.trace), (BUSY_MODEL, busy_gpus(prometheus_server))):
        model, window = fit_persistence(series, name)
        store.publish(name, model, series=name, window=window)
    return store.root


@pytest.fixture
def store(store_template: Path, tmp_path: Path) -> ModelStore:
    """A private copy: scenarios damage it."""
    root = tmp_path / "models"
    shutil.copytree(store_template, root)
    return ModelStore(root)


@pytest.fixture
def fake_api(httpserver: HTTPServer) -> Iterator[FakeApiServer]:
    with FakeApiServer(httpserver) as server:
        yield server


MakeWorld = Callable[..., World]


@pytest.fixture
def make_world(fake_api: FakeApiServer, store: ModelStore, proxy: FaultProxy,
               prometheus_server: BackfilledPrometheus) -> MakeWorld:
    def make(offset: timedelta = timedelta(days=11, hours=6), **spec_overrides: Any) -> World:
        spec = matrix_spec(prometheus_server, **spec_overrides)
        return World(fake_api, store, proxy.url, trace_time(prometheus_server, offset), spec)
    return make


@pytest.fixture(scope="session")
def hostile_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """good.csv (21 days at 5 min) and a store with three versions of ``web`` — see hostile.py."""
    from tests.reliability.hostile import build_template

    return build_template(tmp_path_factory.mktemp("hostile-template"))


@pytest.fixture
def work(hostile_template: Path, tmp_path: Path) -> Path:
    """A private copy of the hostile template: cases write into it and damage its store."""
    from tests.reliability.hostile import prepare

    return prepare(hostile_template, tmp_path / "work")

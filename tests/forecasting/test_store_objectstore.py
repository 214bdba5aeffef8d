"""The model store in a real S3-compatible object store (SeaweedFS on loopback): the directory store's
guarantees — verified JSON, sha256, atomic publish, a serving pointer that never names a half-written
version, concurrent writers — over conditional writes (If-None-Match / If-Match)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from predictive_scaler.cli import main
from predictive_scaler.errors import ConfigError, ModelError
from predictive_scaler.forecasting.object_store import ObjectModelStore
from predictive_scaler.forecasting.store import MANIFEST_FILE, MODEL_FILE, open_store
from tests.support.objectstore_writer import model, window
from tests.support.seaweedfs import SeaweedFS, client

pytestmark = [pytest.mark.objectstore, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def s3_env(seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> SeaweedFS:
    for key, value in seaweedfs.env().items():
        monkeypatch.setenv(key, value)
    return seaweedfs


@pytest.fixture
def url(s3_env: SeaweedFS, request: pytest.FixtureRequest) -> str:
    return s3_env.url(f"t/{request.node.name.replace('[', '-').replace(']', '')[:60]}")


def writer(url: str, name: str, count: int, pause: float = 0.0) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.support.objectstore_writer", url, name, str(count),
                             str(pause)], cwd=ROOT, env=os.environ.copy(), stdout=subprocess.PIPE, text=True)


def test_publish_read_verify_and_rollback(url: str) -> None:
    store = open_store(url)
    assert isinstance(store, ObjectModelStore)
    v1 = store.publish("chat", model(1), series="chat", window=window())
    v2 = store.publish("chat", model(2), series="chat", window=window())
    assert store.names() == ["chat"]
    assert [i.version for i in store.list("chat")] == sorted([v1, v2])
    assert store.serving("chat", expected_series="chat").path.name == v2
    with pytest.raises(ModelError, match="trained for series"):
        store.serving("chat", expected_series="other")
    assert store.rollback("chat").path.name == v1
    assert store.pointer("chat").version == v1  # type: ignore[union-attr]
    assert store.promote("chat", v2).path.name == v2
    assert all(r.ok for r in store.verify())


def test_a_tampered_model_is_refused_and_verify_says_so(url: str, s3_env: SeaweedFS, capsys: pytest.CaptureFixture[str]) -> None:
    store = ObjectModelStore(url)
    v1 = store.publish("chat", model(1), series="chat", window=window())
    v2 = store.publish("chat", model(2), series="chat", window=window())
    key = f"{store.prefix}chat/versions/{v2}/{MODEL_FILE}"
    client(s3_env).put_object(Bucket=store.bucket, Key=key, Body=b'{"kind": "persistence", "params": {}}')
    with pytest.raises(ModelError, match="sha256"):
        store.serving("chat")
    assert main(["models", "verify", "--store", url]) == 1
    assert "sha256" in capsys.readouterr().out
    assert main(["models", "verify", "--store", url, "--repair"]) == 1  # v2 stays damaged, but serving is v1
    assert store.pointer("chat").version == v1  # type: ignore[union-attr]
    with pytest.raises(ModelError):
        store.promote("chat", v2)  # refused: the pointer stays on v1
    assert store.pointer("chat").version == v1  # type: ignore[union-attr]


def test_the_cli_takes_the_url(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    store = ObjectModelStore(url)
    v1 = store.publish("chat", model(1), series="chat", window=window())
    v2 = store.publish("chat", model(2), series="chat", window=window())
    assert main(["models", "list", "--store", url, "--name", "chat"]) == 0
    assert v1 in capsys.readouterr().out
    assert main(["models", "rollback", "--store", url, "--name", "chat"]) == 0
    assert main(["models", "promote", "--store", url, "--name", "chat", "--version", v2]) == 0
    assert main(["models", "show", "--store", url, "--name", "chat"]) == 0
    assert v2 in capsys.readouterr().out
    assert main(["models", "verify", "--store", url]) == 0


def test_a_bad_url_is_a_config_error(s3_env: SeaweedFS) -> None:
    with pytest.raises(ConfigError, match="s3://bucket"):
        open_store("s3://Bad_Bucket/x")


def test_two_writer_processes_at_once_lose_nothing(url: str) -> None:
    # Both write the same name (pointer races) and one a name of its own.
    procs = [writer(url, "common", 6), writer(url, "common", 6), writer(url, "mine", 3)]
    outs = [p.communicate(timeout=300)[0].split() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    store = ObjectModelStore(url, keep=1000)
    published = set(outs[0]) | set(outs[1])
    assert {i.version for i in store.list("common")} == published  # every version of both writers is there
    pointer = store.pointer("common")
    assert pointer is not None and pointer.version in published
    # Every promote was a conditional write on the one before: none lost, so the history holds the others.
    assert len(set(pointer.history)) == len(pointer.history) == min(len(published) - 1, store.keep)
    assert all(r.ok for r in store.verify()), store.verify()


def test_a_reader_during_writes_never_sees_a_half_written_version(url: str) -> None:
    store = ObjectModelStore(url)
    store.publish("chat", model(0), series="chat", window=window())
    proc = writer(url, "chat", 8)
    seen: set[str] = set()
    errors: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        reader = ObjectModelStore(url)
        while not stop.is_set():
            try:
                seen.add(reader.serving("chat", expected_series="chat").path.name)  # sha256 checked
            except BaseException as exc:  # noqa: BLE001 - any refusal is the failure this test is about
                errors.append(exc)
                return

    thread = threading.Thread(target=read)
    thread.start()
    try:
        proc.communicate(timeout=300)
    finally:
        stop.set()
        thread.join()
    assert proc.returncode == 0
    assert not errors, errors
    assert len(seen) > 1  # the reader saw the pointer move


def test_a_writer_killed_mid_publish_leaves_the_store_verifiable(url: str, s3_env: SeaweedFS,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    store = ObjectModelStore(url)
    v1 = store.publish("chat", model(0), series="chat", window=window())
    proc = writer(url, "chat", 1, pause=60)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "model-written"
    proc.send_signal(signal.SIGKILL)  # between model.json and manifest.json
    proc.wait()
    keys = [o["Key"] for o in client(s3_env).list_objects_v2(Bucket=store.bucket, Prefix=store.prefix)["Contents"]]
    orphans = [k for k in keys if k.endswith(MODEL_FILE) and k.replace(MODEL_FILE, MANIFEST_FILE) not in keys]
    assert len(orphans) == 1  # the killed publish's model, without its manifest …
    assert [i.version for i in store.list("chat")] == [v1]  # … is not a version
    assert store.serving("chat").path.name == v1
    assert main(["models", "verify", "--store", url]) == 0, capsys.readouterr().out
    v2 = store.publish("chat", model(1), series="chat", window=window())  # the next writer goes on
    assert store.serving("chat").path.name == v2


def test_the_controller_reads_its_models_from_the_url(url: str) -> None:
    """`controller --model-store s3://…`: the settings keep the URL, the controller opens the object store,
    and its model port follows the serving pointer there as it does on a volume."""
    from predictive_scaler.controller.ports import StoreModelPort
    from predictive_scaler.controller.settings import ControllerSettings

    settings = ControllerSettings(prometheus_url="http://127.0.0.1:9090", model_store=url)
    assert settings.model_store == url
    store = open_store(settings.model_store)
    first = store.publish("chat", model(1), series="chat", window=window())
    port = StoreModelPort(store, "chat", horizon_seconds=1800, quantile=0.95, expected_series="chat")
    port.refresh()
    assert (port.version, port.problem, port.loads) == (first, None, 1)
    port.refresh()
    assert port.loads == 1, "an unchanged pointer is not loaded again"
    second = store.publish("chat", model(2), series="chat", window=window())
    port.refresh()
    assert (port.version, port.loads) == (second, 2)
    empty = StoreModelPort(store, "nothing", horizon_seconds=1800, quantile=0.95)
    empty.refresh()
    assert empty.version is None and f"no serving version in {url}" in (empty.problem or "")


def test_a_port_taken_before_weed_binds_it_starts_again_on_fresh_ports(tmp_path, monkeypatch):
    """The fixture chooses free ports, then weed binds them; anything can take one in between (weed's own
    connections draw from the same ephemeral range). That start is retried, not the session's object
    store tests failed."""
    import socket

    from tests.support import seaweedfs as support

    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    real = support.free_port
    handed: list[int] = []

    def first_one_taken() -> int:
        handed.append(port if not handed else real())
        return handed[-1]

    monkeypatch.setattr(support, "free_port", first_one_taken)
    try:
        with support.running_seaweedfs(tmp_path / "weed") as store:
            client(store).put_object(Bucket=store.bucket, Key="k", Body=b"v")
            assert store.endpoint != f"http://127.0.0.1:{port}"
    finally:
        taken.close()
    assert "address already in use" in (tmp_path / "weed" / "weed.log").read_text()
    assert (tmp_path / "weed" / "restart1" / "weed.log").exists()

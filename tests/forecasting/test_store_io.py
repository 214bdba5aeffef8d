"""The model store's own I/O: OS errors mapped to StoreError (the path, what failed, what to do) with
nothing lost, and files of the wrong kind where the store keeps its own refused, never followed.

In-process, with the failing ``os`` call monkeypatched: the tests run as root, which writes through
any mode bits. tests/reliability/test_hostile_files.py runs the same faults through the CLI.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from predictive_scaler.clock import FakeClock
from predictive_scaler.errors import ModelError, StoreError
from predictive_scaler.forecasting import store as store_module
from predictive_scaler.forecasting.baselines import PersistenceForecaster
from predictive_scaler.forecasting.store import ModelStore, TrainingWindow, save_artifact
from tests.reliability.hostile import digest, good_series

HISTORY = good_series(7 * 288)
WINDOW = TrainingWindow.of(HISTORY)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2024, 3, 2, tzinfo=UTC))


@pytest.fixture
def model_store(tmp_path: Path, clock: FakeClock) -> ModelStore:
    s = ModelStore(tmp_path / "store", clock=clock)
    for _ in range(2):
        publish(s, clock)
    return s


def publish(s: ModelStore, clock: FakeClock, name: str = "web") -> str:
    clock.advance(timedelta(hours=1))
    return s.publish(name, PersistenceForecaster().fit(HISTORY), series=name, window=WINDOW)


@pytest.fixture
def failing(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, int, Callable[..., bool]], None]:
    """``failing("write", errno.ENOSPC, when)``: ``os.write`` (etc.) fails with that errno when ``when(*args)``."""
    def install(name: str, code: int, when: Callable[..., bool]) -> None:
        real = getattr(os, name)

        def fake(*args: Any, **kwargs: Any) -> Any:
            if when(*args):
                raise OSError(code, os.strerror(code))
            return real(*args, **kwargs)
        monkeypatch.setattr(store_module.os, name, fake)
    return install


@pytest.fixture
def unchanged(model_store: ModelStore) -> Iterator[None]:
    before = digest(model_store.root)
    yield
    assert digest(model_store.root) == before, "the store changed"


def test_full_disk_during_publish_changes_nothing(model_store: ModelStore, clock: FakeClock, failing: Any,
                                                  unchanged: None) -> None:
    failing("write", errno.ENOSPC, lambda fd, data: True)
    with pytest.raises(StoreError) as info:
        publish(model_store, clock)
    message = str(info.value)
    assert "model.json: cannot write (No space left on device)" in message
    assert "free space there" in message and "nothing was published: the store is as it was" in message
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOSPC


def test_read_only_pointer_switch_keeps_the_pointer(model_store: ModelStore, failing: Any, unchanged: None) -> None:
    oldest = model_store.list("web")[0].version
    failing("replace", errno.EROFS, lambda src, dst: Path(dst).name == "serving")
    with pytest.raises(StoreError, match=r"serving: cannot write \(Read-only file system\).*mount it read-write.*"
                                         "the serving pointer is unchanged"):
        model_store.promote("web", oldest)
    assert not [p for p in (model_store.root / "web").iterdir() if ".tmp-" in p.name], "a temporary file was left"


def test_a_publish_that_fails_after_the_version_is_in_place_says_what_is_stored(
        model_store: ModelStore, clock: FakeClock, failing: Any) -> None:
    serving = model_store.pointer("web")
    failing("replace", errno.EACCES, lambda src, dst: Path(dst).name == "serving")
    with pytest.raises(StoreError, match="Permission denied.*give it write access.*the serving pointer is unchanged; "
                                         "version .* is stored — promote it"):
        publish(model_store, clock)
    assert model_store.pointer("web") == serving
    assert len(model_store.list("web")) == 3  # the new version is stored, complete, and not serving


@pytest.mark.parametrize("plant, says", [
    (lambda p: p.mkdir(), "lock file is a directory"),
    (lambda p: os.mkfifo(p), "lock file is a FIFO (named pipe)"),
    (lambda p: p.symlink_to(p.parent.parent.parent / "made-by-the-lock"), "lock file is a symbolic link to"),
], ids=["directory", "fifo", "link-out-of-the-store"])
def test_a_lock_of_the_wrong_kind_is_refused_never_opened(model_store: ModelStore, plant: Callable[[Path], None],
                                                          says: str) -> None:
    lock = model_store.root / "web" / ".lock"
    lock.unlink()
    plant(lock)
    with pytest.raises(StoreError, match=f"{re.escape(says)}.*move it aside"):
        model_store.rollback("web")
    assert not (model_store.root.parent / "made-by-the-lock").exists()


def test_a_file_where_the_store_keeps_a_directory_is_refused(model_store: ModelStore, clock: FakeClock) -> None:
    (model_store.root / "api").write_text("not a directory")
    with pytest.raises(StoreError, match="api: is a regular file, not a directory — the store keeps model 'api' "
                                         "there; move it aside"):
        publish(model_store, clock, "api")
    assert (model_store.root / "api").read_text() == "not a directory"


def test_a_serving_pointer_linking_out_of_the_store_is_damage_repaired_without_following(
        model_store: ModelStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"version": "x", "sha256": "0" * 64}))
    pointer = model_store.root / "web" / "serving"
    pointer.unlink()
    pointer.symlink_to(outside)
    with pytest.raises(ModelError, match="is a symbolic link to .*outside.json.*the serving pointer is damaged"):
        model_store.pointer("web")
    model_store.rollback("web")  # repairs: the newest version that verifies
    assert not pointer.is_symlink() and json.loads(outside.read_text())["version"] == "x"


def test_an_unreadable_pointer_is_not_called_damage(model_store: ModelStore, failing: Any) -> None:
    failing("open", errno.EACCES, lambda path, *a: Path(path).name == "serving")
    with pytest.raises(StoreError, match=r"serving: cannot be read \(Permission denied\); check the path"):
        model_store.pointer("web")


def test_an_unlistable_store_is_a_store_error(model_store: ModelStore, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(self: Path) -> Any:
        raise PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(Path, "iterdir", denied)
    with pytest.raises(StoreError, match="cannot be listed \\(Permission denied\\); give this user read access"):
        model_store.names()


def test_a_model_too_big_to_load_again_is_never_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "MAX_MODEL_BYTES", 16)
    with pytest.raises(ModelError, match="over the 16-byte limit a model file may have"):
        save_artifact(PersistenceForecaster().fit(HISTORY), series="web", window=WINDOW, directory=tmp_path / "a")
    assert not (tmp_path / "a").exists()

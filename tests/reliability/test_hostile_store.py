"""A damaged model store, repaired by the tools themselves.

Each kind of damage to ``web``'s serving pointer (or to the version it names) is met four ways:
``forecast`` refuses it saying how to repair; ``models verify`` exits 1 naming it; and
``models rollback``, ``models promote`` and ``train`` each repair it — after which ``models verify``
passes (bar a damaged version that is no longer served, which it still names) and ``forecast``
works from the serving version. No version is ever lost.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reliability.hostile import Case, Ran, check, ids, run_cli

FORECAST = "forecast --model {store}/web --trace {d}/good.csv"
VERIFY = "models verify --store {store}"
ROLLBACK = "models rollback --store {store} --name web"
PROMOTE = "models promote --store {store} --name web --version {v[0]}"
TRAIN = "train --trace {d}/good.csv --out {store} --name web --models persistence --min-history 7d"
POINTER = "store/web/serving"


def served(path: Path) -> list[str]:
    return sorted(p.name for p in (path.parent / "versions").iterdir() if not p.name.startswith("."))


def pointer_doc(path: Path) -> dict[str, object]:
    return json.loads(path.read_text())


def rewrite(change: Callable[[dict[str, object], Path], dict[str, object]]) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_text(json.dumps(change(pointer_doc(path), path)))
    return write


def pointer_is_a_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def serving_version_pruned(path: Path) -> None:
    shutil.rmtree(path.parent / "versions" / pointer_doc(path)["version"])  # type: ignore[operator]


def serving_version_truncated(path: Path) -> None:
    model = path.parent / "versions" / str(pointer_doc(path)["version"]) / "model.json"
    model.write_bytes(model.read_bytes()[:20])


#: Damage → (what forecast and verify must say, whether the damage is to a version rather than the pointer).
DAMAGE: dict[str, tuple[str | bytes | Callable[[Path], None], tuple[str, ...], bool]] = {
    "empty": (b"", ("serving pointer is damaged",), False),
    "not-json": ("{{{", ("not JSON or truncated", "serving pointer is damaged"), False),
    "binary": (b"\x80\x04\x95garbage", ("serving pointer is damaged",), False),
    "a-list": ("[1, 2]", ("serving pointer is damaged (no version and sha256)",), False),
    "no-sha": (rewrite(lambda d, p: {"version": d["version"]}), ("no version and sha256",), False),
    "traversal": (rewrite(lambda d, p: {**d, "version": "../../etc"}), ("invalid version '../../etc'",), False),
    "history-damaged": (rewrite(lambda d, p: {**d, "history": 5}), ("history is damaged",), False),
    "a-directory": (pointer_is_a_directory, ("serving pointer is a directory",), False),
    "names-a-pruned-version": (serving_version_pruned, ("is gone (deleted or pruned)",), False),
    "sha-mismatch": (rewrite(lambda d, p: {**d, "sha256": "0" * 64}), ("differs from what was promoted",), False),
    "serving-version-truncated": (serving_version_truncated, ("sha256 does not match the manifest",), True),
}
REPAIR_ADVICE = ("models rollback",)


def repaired(version_damaged: bool) -> Callable[[Ran, Path], None]:
    def then(ran: Ran, work: Path) -> None:
        store = work / "store"
        verify = run_cli(["models", "verify", "--store", str(store)])
        assert "Traceback" not in verify.text
        if version_damaged:  # the damaged version is still there (never deleted), and named
            assert verify.code == 1 and "sha256 does not match" in verify.out, verify.text
        else:
            assert verify.code == 0, verify.text
            assert ": ok" in verify.out
        forecast = run_cli(["forecast", "--model", str(store / "web"), "--trace", str(work / "good.csv")])
        assert forecast.code == 0, forecast.text
    return then


CASES: list[Case] = []
for name, (body, says, version_damaged) in DAMAGE.items():
    files = {POINTER: body}
    advice = () if version_damaged else REPAIR_ADVICE
    CASES += [
        Case(f"{name}-forecast-refuses", FORECAST, 2, (*says, *advice), files),
        Case(f"{name}-verify-names-it", VERIFY, 1, ("web: serving", "problem(s)", *says), files),
        Case(f"{name}-rollback-repairs", ROLLBACK, 0, ("web:",), files, store_may_change=True,
             then=repaired(version_damaged)),
        Case(f"{name}-promote-repairs", PROMOTE, 0, ("web: now serving",), files, store_may_change=True,
             then=repaired(version_damaged)),
        Case(f"{name}-train-repairs", TRAIN, 0, ("(serving)",), files, store_may_change=True,
             then=repaired(version_damaged)),
    ]


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(proc.stdout)


def leftover(pid: int) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.mkdir(parents=True)
        (path / "model.json").write_text('{"kind": "persist')
    return write


def temporary(pid: int) -> str:
    return f"store/web/versions/.tmp-{pid}@{socket.gethostname()}-{'a' * 12}"


def swept(gone: bool, name: str) -> Callable[[Ran, Path], None]:
    def then(ran: Ran, work: Path) -> None:
        assert (work / name).exists() != gone, f"{name}: {'kept' if not gone else 'swept'} expected"
    return then


DEAD = dead_pid()
CASES += [
    Case("verify-repair-flag", VERIFY + " --repair", 0, ("serving pointer repaired: now", ": ok"),
         {POINTER: "{{{"}, store_may_change=True, then=repaired(False)),
    Case("verify-unknown-name", VERIFY + " --name wbe", 2, ("--name 'wbe': no such model", "it holds web")),
    Case("verify-no-store", "models verify --store {d}/nope", 2, ("no such directory", "train --out")),
    Case("verify-a-damaged-old-version", VERIFY, 1, ("version", "not JSON or truncated"),
         {"store/web/versions/20240101T000000Z-00000000/manifest.json": "{", }),
    Case("list-shows-damaged-pointer", "models list --store {store}", 0, ("damaged pointer",), {POINTER: "{{{"}),
    Case("promote-unknown-version", "models promote --store {store} --name web --version 20990101T000000Z-deadbeef", 2,
         ("no model artifact here", "retrain")),
    Case("promote-traversal", "models promote --store {store} --name web --version ../../etc", 2,
         ("invalid version '../../etc'",)),
    Case("rollback-unknown-name", "models rollback --store {store} --name nope", 2,
         ("no serving version to roll back from",)),
    Case("show-traversal", "models show --store {store} --name web --version ../x", 2, ("invalid version",)),
    Case("dead-writers-leftover-is-swept", TRAIN, 0, ("(serving)",), {temporary(DEAD): leftover(DEAD)},
         store_may_change=True, then=swept(True, temporary(DEAD))),
    Case("live-writers-temporary-is-kept", TRAIN, 0, ("(serving)",), {temporary(os.getpid()): leftover(os.getpid())},
         store_may_change=True, then=swept(False, temporary(os.getpid()))),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_hostile_store(case: Case, work: Path) -> None:
    check(case, work)


def test_promote_of_a_damaged_version_keeps_the_pointer(work: Path) -> None:
    store = work / "store"
    versions = sorted(p for p in (store / "web" / "versions").iterdir())
    (versions[0] / "model.json").write_text('{"kind": "persistence", "params": {}}')
    case = Case("promote-damaged-version", PROMOTE, 2, ("sha256 does not match the manifest", "roll back"))
    check(case, work)

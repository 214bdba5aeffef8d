"""The hostile-input suite's machinery: one table row per case, run through the real CLI in-process.

A :class:`Case` names the files it writes into a fresh work directory (which also holds a good
21-day trace ``good.csv`` and a model store ``store/`` with three versions of ``web``), the
command line (``{d}`` is the work directory, ``{store}`` the store, ``{v[0]}`` … the versions of
``web`` oldest first), the exit code, and the
fragments its message must hold: what is wrong, where, and what to do. :func:`check` runs it with
``predictive_scaler.cli.main`` capturing stdout/stderr and asserts, besides those, that no
traceback was printed and that nothing already stored changed — every file of the store and every
file the case wrote is byte-for-byte what it was (unless the case says the store may change, and
then no version is lost).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import shutil
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from predictive_scaler.cli import main
from predictive_scaler.clock import FakeClock
from predictive_scaler.forecasting.baselines import PersistenceForecaster
from predictive_scaler.forecasting.store import ModelStore, TrainingWindow
from predictive_scaler.series import Series

GOOD_DAYS = 21
STEP = 300
START = pd.Timestamp("2024-01-01T00:00:00Z")
#: "Billion laughs": eight levels of nine aliases, 48 million values once expanded, in 400 bytes.
BOMB = ("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefg", "bcdefgh", strict=True)))


@dataclass(frozen=True)
class Case:
    """One hostile input and what must come of it."""

    id: str
    argv: str  # split on whitespace after formatting {d} and {store}
    code: int
    says: tuple[str, ...]
    #: Files written into the work directory first (name → text or bytes, or a callable writing it).
    files: Mapping[str, str | bytes | Callable[[Path], None]] = field(default_factory=dict)
    #: The store may change (a repair, a successful train): then no version may be lost.
    store_may_change: bool = False
    #: Extra check on the run (e.g. the forecast of an accepted trace is at the right time).
    then: Callable[[Ran, Path], None] | None = None
    #: Environment variables set during the run.
    env: Mapping[str, str] = field(default_factory=dict)
    #: Run the real console entry point in a child process that must end within this many seconds
    #: (a hang is a failure, not a stuck suite); None runs ``cli.main`` in this process.
    timeout: float | None = None


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def ids(cases: list[Case]) -> list[str]:
    names = [c.id for c in cases]
    assert len(names) == len(set(names)), "case ids must be unique"
    return names


def rows(n: int = GOOD_DAYS * 86400 // STEP, *, start: pd.Timestamp = START, step: int = STEP,
         fmt: str = "%Y-%m-%dT%H:%M:%SZ", level: float = 100.0) -> list[tuple[str, float]]:
    t = start + pd.to_timedelta(np.arange(n) * step, unit="s")
    v = level + 0.5 * level * np.sin(2 * np.pi * np.arange(n) * step / 86400)
    return [(ts.strftime(fmt), round(float(x), 2)) for ts, x in zip(t, v, strict=True)]


def csv(pairs: list[tuple[str, Any]], header: str = "timestamp,value") -> str:
    return header + "\n" + "".join(f"{a},{b}\n" for a, b in pairs)


def good_series(n: int = GOOD_DAYS * 86400 // STEP) -> Series:
    values = np.array([v for _, v in rows(n)])
    return Series(values=values, start=START, step_seconds=STEP, name="web")


def make_store(root: Path) -> list[str]:
    """Three versions of ``web`` (the last serving, the others in its rollback history)."""
    clock = FakeClock(datetime(2024, 2, 1, tzinfo=UTC))
    store = ModelStore(root, clock=clock)
    versions = []
    history = good_series(7 * 288)
    for _ in range(3):
        clock.advance(timedelta(days=7))
        versions.append(store.publish("web", PersistenceForecaster().fit(history), series="web",
                                      window=TrainingWindow.of(history)))
    return versions


def prepare(template: Path, work: Path) -> Path:
    """A private copy of the template (good.csv, store/) in ``work``."""
    shutil.copytree(template, work, dirs_exist_ok=True)
    return work


def build_template(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "good.csv").write_text(csv(rows()))
    make_store(root / "store")
    return root


def digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` → its sha256 (directories as entries too, so a new one shows)."""
    out: dict[str, str] = {}
    if not root.exists():
        return out
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "link → " + str(p.readlink())
        elif p.is_dir():
            out[rel + "/"] = "dir"
        elif p.is_file():
            out[rel] = _file_digest(p)
        else:  # a FIFO or a device a case planted: never opened here (a FIFO would block)
            out[rel] = "special"
    return out


def _file_digest(path: Path) -> str:
    """sha256 of a file, streamed; a file over 64 MiB (a case's sparse giant) by size and mtime."""
    st = path.stat()
    if st.st_size > 64 << 20:
        return f"size {st.st_size}, mtime {st.st_mtime_ns}"
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def run_cli(argv: list[str], env: Mapping[str, str] | None = None) -> Ran:
    """``predictive-scaler ARGV`` in this process; stdout and stderr captured."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        stack.enter_context(warnings.catch_warnings())
        if env:
            stack.enter_context(_environ(env))
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own refusals
            code = exc.code if isinstance(exc.code, int) else 2
    return Ran(int(code), out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _environ(env: Mapping[str, str]) -> Any:
    import os

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def write_files(work: Path, files: Mapping[str, str | bytes | Callable[[Path], None]]) -> None:
    for name, body in files.items():
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(body):
            body(path)
        elif isinstance(body, bytes):
            path.write_bytes(body)
        else:
            path.write_text(body)


def versions(store: Path) -> set[str]:
    return {str(p.relative_to(store)) for p in store.glob("*/versions/*") if not p.name.startswith(".")}


def run_child(argv: list[str], env: Mapping[str, str], timeout: float) -> Ran:
    """``python -m predictive_scaler.cli ARGV`` in a child process that must end within ``timeout`` s."""
    import os
    import subprocess
    import sys

    try:
        proc = subprocess.run([sys.executable, "-m", "predictive_scaler.cli", *argv], capture_output=True,
                              text=True, timeout=timeout, env={**os.environ, **env}, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"predictive-scaler {' '.join(argv)} still ran after {timeout} s (a hang)") from exc
    return Ran(proc.returncode, proc.stdout, proc.stderr)


def check(case: Case, work: Path, **extra: str) -> Ran:
    """Run ``case`` in ``work`` (already prepared) and assert everything a hostile case promises.

    ``extra`` adds names to the argv's and env's format fields (e.g. ``prom`` for a test server's URL).
    """
    write_files(work, case.files)
    store = work / "store"
    before_store, before_files = digest(store), digest(work)
    served = store / "web" / "versions"
    v = sorted(p.name for p in served.iterdir() if not p.name.startswith(".")) if served.is_dir() else []
    argv = case.argv.format(d=work, store=store, v=v, **extra).split()
    env = {k: v.format(d=work, store=store, **extra) for k, v in case.env.items()}
    ran = run_cli(argv, env) if case.timeout is None else run_child(argv, env, case.timeout)
    where = f"[{case.id}] predictive-scaler {' '.join(argv)}\nstdout: {ran.out[-2000:]}\nstderr: {ran.err[-2000:]}"
    assert "Traceback" not in ran.text, where
    assert ran.code == case.code, where
    missing = [f for f in case.says if f not in ran.text]
    assert not missing, f"message lacks {missing}: {where}"
    if case.code == 2:
        assert ran.err.strip(), f"a refusal says why on stderr: {where}"
    if case.store_may_change:
        assert versions(store) >= {v for v in versions_from(before_store)}, f"a version was lost: {where}"
    else:
        assert digest(store) == before_store, f"the store changed: {where}"
        after = digest(work)
        changed = {k for k in before_files if not k.startswith("store") and after.get(k) != before_files[k]}
        assert not changed, f"files changed: {sorted(changed)}: {where}"
    if case.then is not None:
        case.then(ran, work)
    return ran


def versions_from(digests: Mapping[str, str]) -> set[str]:
    out = set()
    for rel in digests:
        parts = rel.rstrip("/").split("/")
        if len(parts) == 3 and parts[1] == "versions" and not parts[2].startswith("."):
            out.add("/".join(parts))
    return out

"""Hostile files: what is not a regular file, what is too big, and a store that cannot be written.

- **hangs**: a FIFO or a device (a FIFO with no writer blocks ``open`` for ever; ``/dev/zero`` never
  ends) in each position of the model store and as a trace, a scenario or a scaler manifest. Each
  runs the real entry point in a child that must end within 10 s, and is refused naming the path
  and what it is ("is a FIFO (named pipe), not a regular file").
- **store I/O**: a full disk, a file-size limit, a read-only store, no permission, and things of the
  wrong kind where the store keeps its own (a ``.lock`` directory, a ``versions`` file, links out of
  the store). Each is a clear error naming the path and the remedy, and nothing stored is lost or
  changed. The OS errors are real where the kernel can make them for root: ``RLIMIT_FSIZE`` makes
  ``EFBIG``. Root writes through any mode bits and no read-only mount is to be had in a test, so
  ``ENOSPC``, ``EROFS`` and ``EACCES`` come from :data:`FAULT`, loaded by the child at start-up
  (``sitecustomize`` on its ``PYTHONPATH``), which makes the ``os`` calls that write under the
  store fail with them — the product code in between is the real one.
- **unbounded input**: a sparse 2 GB trace, eleven million rows, a 50 MB line, YAML and model files
  over their limits: each refused before it is read, within 10 s, with the limit and how to raise
  it, and no message quoting more than an excerpt of the input.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.reliability.hostile import START, STEP, Case, Ran, check, csv, ids, rows, run_cli

FORECAST = "forecast --model {store}/web --trace {d}/good.csv"
VERIFY = "models verify --store {store}"
LIST = "models list --store {store} --name web"
ROLLBACK = "models rollback --store {store} --name web"
PROMOTE = "models promote --store {store} --name web --version {v[0]}"
TRAIN = "train --trace {d}/good.csv --out {store} --name web --models persistence --min-history 7d"
TRAIN_T = "train --trace {d}/t.csv --out {store} --name web --models persistence"
EVALUATE_T = "evaluate --trace {d}/t.csv --models persistence"
FORECAST_T = "forecast --model {store}/web --trace {d}/t.csv"
BACKTEST_SCENARIO = "backtest --trace {d}/good.csv --scenario {d}/s.yaml --no-progress"
BACKTEST_SCALER = "backtest --prometheus http://127.0.0.1:9 --scaler {d}/scaler.yaml --no-progress"
#: Seconds a case that could hang or read for long has to end in; a training run in a child gets more.
QUICK = 10
TRAINING = 60
ROLLBACK_ADVICE = "models rollback"
NOT_REGULAR = "not a regular file"


# -- what the cases plant ----------------------------------------------------------------------

def fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def link_to(target: str) -> Callable[[Path], None]:
    """A symbolic link to ``target`` (absolute, or relative to the work directory)."""
    def write(path: Path) -> None:
        path.unlink(missing_ok=True)
        path.symlink_to(target if target.startswith("/") else _work(path) / target)
    return write


def sparse(size: int) -> Callable[[Path], None]:
    """A file of ``size`` bytes that takes no disk (all a hole): big to stat, instant to make."""
    def write(path: Path) -> None:
        path.unlink(missing_ok=True)
        path.touch()
        os.truncate(path, size)
    return write


def directory(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.mkdir()


def file_instead_of_directory(path: Path) -> None:
    for p in sorted(path.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    path.rmdir()
    path.write_text("not a directory\n")


def in_version(name: str, make: Callable[[Path], None], *, which: int = -1) -> Callable[[Path], None]:
    """``make`` the file ``name`` of a version of ``web`` (newest, the serving one, by default); the
    case's key is ``store/web/versions``."""
    def write(versions: Path) -> None:
        version = sorted(p for p in versions.iterdir() if not p.name.startswith("."))[which]
        make(version / name)
    return write


def _work(path: Path) -> Path:
    """The work directory a planted ``path`` is in (the one holding ``good.csv``)."""
    return next(p for p in path.parents if (p / "good.csv").exists())


def many_rows(count: int) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_bytes(b"timestamp,value\n" + b"0,0\n" * count)
    return write


def one_line(size: int) -> Callable[[Path], None]:
    """``size`` bytes of digits and no newline: a "row" no parser should be handed."""
    def write(path: Path) -> None:
        path.write_bytes(b"7" * size)
    return write


def with_cell(row: int, cell: str, *, column: int) -> str:
    """The first day of good rows with the cell of ``row`` (2 = the first data row) in ``column`` replaced."""
    pairs: list[list[str]] = [[t, str(v)] for t, v in rows(288)]
    pairs[row - 2][column] = cell
    return csv([(t, v) for t, v in pairs])


def parquet_with_cell(size: int) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        t = (START + pd.to_timedelta(np.arange(288) * STEP, unit="s")).strftime("%Y-%m-%dT%H:%M:%SZ").tolist()
        t[1] = "9" * size
        pd.DataFrame({"timestamp": t, "value": np.ones(288)}).to_parquet(path)
    return write


def serving_pointer(write: Callable[[Path], None]) -> dict[str, Callable[[Path], None]]:
    return {"store/web/serving": write}


# -- what the cases check beyond check() ---------------------------------------------------------

def short(limit: int = 4000) -> Callable[[Ran, Path], None]:
    """The output quotes at most an excerpt of the input."""
    def then(ran: Ran, work: Path) -> None:
        assert len(ran.text) < limit, f"{len(ran.text):,} characters of output: {ran.text[:300]}…"
    return then


def untouched(name: str, body: str | None) -> Callable[[Ran, Path], None]:
    """``name`` in the work directory (outside the store) still holds ``body`` (None: still absent)."""
    def then(ran: Ran, work: Path) -> None:
        path = work / name
        if body is None:
            assert not path.exists(), f"{path} was created through a link in the store"
        else:
            assert path.read_text() == body, f"{path} was written through a link in the store"
    return then


def repaired_without_following(name: str, body: str) -> Callable[[Ran, Path], None]:
    """The pointer is a regular file again, the file it linked to is as it was, and the store verifies."""
    def then(ran: Ran, work: Path) -> None:
        untouched(name, body)(ran, work)
        pointer = work / "store" / "web" / "serving"
        assert not pointer.is_symlink() and json.loads(pointer.read_text())["version"]
        verify = run_cli(["models", "verify", "--store", str(work / "store")])
        assert verify.code == 0 and ": ok" in verify.out, verify.text
    return then


def both(*checks: Callable[[Ran, Path], None]) -> Callable[[Ran, Path], None]:
    def then(ran: Ran, work: Path) -> None:
        for c in checks:
            c(ran, work)
    return then


# -- faults the child process is started with ------------------------------------------------------

#: The child's ``sitecustomize``: HOSTILE_FAULT under HOSTILE_STORE — ``efbig`` (a real RLIMIT_FSIZE of
#: 256 bytes, SIGXFSZ ignored as a shell's ``ulimit -f`` leaves it), ``enospc`` (writes into files under
#: the store fail as on a full volume), ``erofs``/``eacces`` (every call that would change something
#: under the store fails as on a read-only mount / without permission).
FAULT = '''
import errno
import os

_FAULT = os.environ.get("HOSTILE_FAULT", "")
_STORE = os.path.realpath(os.environ.get("HOSTILE_STORE", "/nonexistent"))


def _inside(path):
    if isinstance(path, int):
        return False
    real = os.path.realpath(os.fsdecode(path))
    return real == _STORE or real.startswith(_STORE + os.sep)


def _fail(code, path):
    raise OSError(code, os.strerror(code), os.fsdecode(path))


if _FAULT == "efbig":
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256, 256))
elif _FAULT == "enospc":
    _write = os.write

    def _full(fd, data):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target and _inside(target):
            _fail(errno.ENOSPC, target)
        return _write(fd, data)

    os.write = _full
elif _FAULT in ("erofs", "eacces"):
    _CODE = errno.EROFS if _FAULT == "erofs" else errno.EACCES
    _WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def _guard(name, checked):
        real = getattr(os, name)

        def guarded(*args, **kwargs):
            for i in checked:
                if i < len(args) and _inside(args[i]):
                    _fail(_CODE, args[i])
            return real(*args, **kwargs)
        setattr(os, name, guarded)

    for _name in ("mkdir", "unlink", "remove", "rmdir", "symlink"):
        _guard(_name, (0,))
    for _name in ("replace", "rename"):
        _guard(_name, (0, 1))
    _open = os.open

    def _open_guarded(path, flags, *args, **kwargs):
        if flags & _WRITES and _inside(path):
            _fail(_CODE, path)
        return _open(path, flags, *args, **kwargs)

    os.open = _open_guarded
'''


def fault(kind: str, under: str = "{store}") -> dict[str, str]:
    return {"PYTHONPATH": "{d}/fault", "PYTHONDONTWRITEBYTECODE": "1", "HOSTILE_FAULT": kind, "HOSTILE_STORE": under}


FAULT_FILES = {"fault/sitecustomize.py": FAULT}


# -- the cases ------------------------------------------------------------------------------------

HANGS: list[Case] = [
    Case("model-json-is-a-fifo-forecast", FORECAST, 2,
         ("model.json", "is a FIFO (named pipe), not a regular file", ROLLBACK_ADVICE),
         {"store/web/versions": in_version("model.json", fifo)}, timeout=QUICK),
    Case("manifest-json-is-a-fifo-verify", VERIFY, 1,
         ("web: serving", "problem(s)", "manifest.json", "is a FIFO (named pipe), not a regular file"),
         {"store/web/versions": in_version("manifest.json", fifo)}, timeout=QUICK),
    Case("serving-pointer-is-a-fifo-list", "models list --store {store}", 0,
         ("damaged pointer", "serving: is a FIFO (named pipe)", "serving pointer is damaged"),
         serving_pointer(fifo), timeout=QUICK),
    Case("lock-is-a-fifo-rollback", ROLLBACK, 2,
         (".lock", "lock file is a FIFO (named pipe), not a regular file", "move it aside"),
         {"store/web/.lock": fifo}, timeout=QUICK),
    Case("version-entry-is-a-fifo-promote",
         "models promote --store {store} --name web --version 20990101T000000Z-deadbeef", 2,
         ("20990101T000000Z-deadbeef", "is a FIFO (named pipe), not a directory", "retrain"),
         {"store/web/versions/20990101T000000Z-deadbeef": fifo}, timeout=QUICK),
    Case("model-json-links-to-dev-zero-verify", VERIFY + " --name web", 1,
         ("model.json", "is a symbolic link to '/dev/zero', not a regular file"),
         {"store/web/versions": in_version("model.json", link_to("/dev/zero"))}, timeout=QUICK),
    Case("manifest-json-links-to-dev-urandom-promote", PROMOTE, 2,
         ("manifest.json", "is a symbolic link to '/dev/urandom', not a regular file", ROLLBACK_ADVICE),
         {"store/web/versions": in_version("manifest.json", link_to("/dev/urandom"), which=0)}, timeout=QUICK),
    Case("serving-pointer-links-to-dev-zero-forecast", FORECAST, 2,
         ("serving: is a symbolic link to '/dev/zero'", "serving pointer is damaged", ROLLBACK_ADVICE),
         serving_pointer(link_to("/dev/zero")), timeout=QUICK),
    Case("lock-links-to-a-fifo-train", TRAIN, 2,
         (".lock", "lock file is a symbolic link to", "outside.fifo", "move it aside", "nothing was published"),
         {"outside.fifo": fifo, "store/web/.lock": link_to("outside.fifo")}, timeout=QUICK),
    Case("trace-is-a-fifo-train", TRAIN_T, 2,
         ("t.csv", "is a FIFO (named pipe), not a regular file", "timestamp,value CSV or Parquet file"),
         {"t.csv": fifo}, timeout=QUICK),
    Case("trace-is-dev-zero-evaluate", "evaluate --trace /dev/zero", 2,
         ("/dev/zero: is a character device, not a regular file", "timestamp,value CSV"), timeout=QUICK),
    Case("trace-links-to-dev-urandom-forecast", FORECAST_T, 2,
         ("t.csv", "is a character device (through a symbolic link to '/dev/urandom'), not a regular file"),
         {"t.csv": link_to("/dev/urandom")}, timeout=QUICK),
    Case("parquet-trace-is-a-fifo-backtest", "backtest --trace {d}/t.parquet --no-progress", 2,
         ("t.parquet", "is a FIFO (named pipe), not a regular file"), {"t.parquet": fifo}, timeout=QUICK),
    Case("scenario-is-a-fifo-backtest", BACKTEST_SCENARIO, 2,
         ("s.yaml", "is a FIFO (named pipe), not a regular file", "backtests/default.yaml"),
         {"s.yaml": fifo}, timeout=QUICK),
    Case("scenario-links-to-dev-zero-backtest", BACKTEST_SCENARIO, 2,
         ("s.yaml", "is a character device (through a symbolic link to '/dev/zero')"),
         {"s.yaml": link_to("/dev/zero")}, timeout=QUICK),
    Case("scaler-spec-is-a-fifo-backtest", BACKTEST_SCALER, 2,
         ("scaler.yaml", "is a FIFO (named pipe), not a regular file", "PredictiveScaler manifests"),
         {"scaler.yaml": fifo}, timeout=QUICK),
    Case("retrain-config-is-a-fifo",
         "retrain --config {d}/scalers.yaml --prometheus http://127.0.0.1:9 --store {store}", 2,
         ("scalers.yaml", "is a FIFO (named pipe), not a regular file"), {"scalers.yaml": fifo}, timeout=QUICK),
    Case("kubeconfig-is-a-fifo-controller",
         "controller --kubeconfig {d}/kc --prometheus-url http://127.0.0.1:9 --model-store {store}", 2,
         ("kc: is a FIFO (named pipe), not a regular file", "kubectl config view --raw"), {"kc": fifo},
         timeout=QUICK),
    # A retrain record planted as a FIFO is ignored (and replaced), never waited on; the source is down,
    # so the run fails for that reason, promptly.
    Case("retrain-record-is-a-fifo",
         "retrain --config {d}/scalers.yaml --prometheus http://127.0.0.1:9 --store {store} --run-id r1 "
         "--timeout 1", 1, ("cannot connect", "1 scaler(s) failed"),
         {"scalers.yaml": "apiVersion: predictive-scaler.io/v1alpha1\nkind: PredictiveScaler\n"
                          "metadata: {name: web, namespace: ml}\nspec:\n  target: {name: web}\n"
                          "  demand: {query: 'sum(rate(x[5m]))'}\n  capacity: {requestsPerReplica: 20}\n"
                          "  maxReplicas: 20\n",
          "store/web/retrain/r1.json": fifo}, store_may_change=True, timeout=QUICK),
]

SECRET = "the file a link in the store points at\n"

STORE_IO: list[Case] = [
    Case("disk-full-during-train", TRAIN, 2,
         ("store/web/versions/.tmp-", "cannot write (No space left on device)", "the store's volume is full",
          "free space there", "nothing was published: the store is as it was"),
         FAULT_FILES, env=fault("enospc"), timeout=TRAINING),
    Case("file-size-limit-during-train", TRAIN, 2,
         ("store/web/versions/.tmp-", "cannot write (File too large)", "file-size limit",
          "nothing was published: the store is as it was"),
         FAULT_FILES, env=fault("efbig"), timeout=TRAINING),
    Case("disk-full-during-promote", PROMOTE, 2,
         ("store/web/serving", "No space left on device", "free space there", "the serving pointer is unchanged"),
         FAULT_FILES, env=fault("enospc"), timeout=QUICK),
    Case("read-only-store-rollback", ROLLBACK, 2,
         ("store/web/.lock", "Read-only file system", "mount it read-write"),
         FAULT_FILES, env=fault("erofs"), timeout=QUICK),
    Case("read-only-store-train-refused-before-training", TRAIN, 2,
         ("--out", "cannot write in", "Read-only file system", "choose another --out"),
         FAULT_FILES, env=fault("erofs"), timeout=QUICK),
    Case("read-only-model-directory-train", TRAIN, 2,
         ("store/web/versions/.tmp-", "cannot create the directory (Read-only file system)", "mount it read-write",
          "nothing was published: the store is as it was"),
         FAULT_FILES, env=fault("erofs", "{store}/web"), timeout=TRAINING),
    Case("permission-denied-promote", PROMOTE, 2,
         ("store/web/.lock", "Permission denied", "give it write access to the store"),
         FAULT_FILES, env=fault("eacces"), timeout=QUICK),
    Case("lock-is-a-directory-promote", PROMOTE, 2,
         ("store/web/.lock", "lock file is a directory, not a regular file", "move it aside"),
         {"store/web/.lock": directory}),
    Case("versions-is-a-file-train", TRAIN, 2,
         ("store/web/versions: is a regular file, not a directory", "the store keeps the versions of 'web' there",
          "move it aside"),
         {"store/web/versions": file_instead_of_directory}),
    Case("versions-is-a-file-verify", VERIFY, 1,
         ("web: serving", "versions: is a regular file, not a directory", "move it aside"),
         {"store/web/versions": file_instead_of_directory}),
    Case("model-directory-is-a-file-train",
         "train --trace {d}/good.csv --out {store} --name api --models persistence --min-history 7d", 2,
         ("store/api: is a regular file, not a directory", "the store keeps model 'api' there", "move it aside"),
         {"store/api": "a file where a model's directory goes\n"}),
    Case("store-root-is-a-file-list", "models list --store {d}/notastore", 2,
         ("--store", "notastore: is a regular file, not a directory", "`train --out` wrote to"),
         {"notastore": "a file\n"}),
    Case("serving-links-out-of-the-store-forecast", FORECAST, 2,
         ("serving: is a symbolic link to", "secret.txt", "serving pointer is damaged", ROLLBACK_ADVICE),
         {"secret.txt": SECRET, **serving_pointer(link_to("secret.txt"))}),
    Case("serving-links-out-of-the-store-rollback-repairs", ROLLBACK, 0,
         ("serving pointer was damaged", "repaired: now serving"),
         {"elsewhere.txt": SECRET, **serving_pointer(link_to("elsewhere.txt"))}, store_may_change=True,
         then=repaired_without_following("elsewhere.txt", SECRET)),
    Case("lock-links-out-of-the-store-promote", PROMOTE, 2,
         ("store/web/.lock", "lock file is a symbolic link to", "created-by-lock", "move it aside"),
         {"store/web/.lock": link_to("created-by-lock")}, then=untouched("created-by-lock", None)),
    Case("model-json-links-out-of-the-store-verify", VERIFY, 1,
         ("model.json: is a symbolic link to", "good.csv", "not a regular file"),
         {"store/web/versions": in_version("model.json", link_to("good.csv"), which=1)}),
]

TRACE_LIMIT = ("over the 536,870,912-byte limit (512 MiB) for a trace", "PREDICTIVE_SCALER_MAX_TRACE_BYTES=BYTES")

UNBOUNDED: list[Case] = [
    Case("sparse-2gib-trace-train", TRAIN_T, 2, ("t.csv", "is 2,147,483,648 bytes (2 GiB)", *TRACE_LIMIT),
         {"t.csv": sparse(2 << 30)}, timeout=QUICK),
    Case("sparse-2gib-parquet-evaluate", "evaluate --trace {d}/t.parquet", 2,
         ("t.parquet", "2,147,483,649 bytes", *TRACE_LIMIT), {"t.parquet": sparse((2 << 30) + 1)}, timeout=QUICK),
    Case("eleven-million-tiny-rows", EVALUATE_T, 2,
         ("t.csv", "more than 10,000,000 rows, the most a trace may hold", "cut it into shorter files"),
         {"t.csv": many_rows(11_000_000)}, timeout=QUICK, then=short()),
    Case("fifty-megabyte-single-line", TRAIN_T, 2,
         ("t.csv", "row 1 is over 4,096 bytes long", "one 'timestamp,value' pair per line"),
         {"t.csv": one_line(50 << 20)}, timeout=QUICK, then=short()),
    Case("five-megabyte-header", EVALUATE_T, 2, ("t.csv", "row 1 is over 4,096 bytes long"),
         {"t.csv": "x" * (5 << 20) + ",value\n" + csv(rows(288)).split("\n", 1)[1]}, timeout=QUICK, then=short()),
    Case("five-megabyte-timestamp-cell", FORECAST_T, 2, ("t.csv", "row 3 is over 4,096 bytes long"),
         {"t.csv": with_cell(3, "2024-01-01T00:05:00Z" * 250_000, column=0)}, timeout=QUICK, then=short()),
    Case("three-kilobyte-value-is-quoted-short", EVALUATE_T, 2,
         ("t.csv", "row 2: value 'lots-of-requests", "…' (3,000 characters) is not a number"),
         {"t.csv": with_cell(2, ("lots-of-requests-" * 200)[:3000], column=1)}, then=short(600)),
    Case("three-kilobyte-timestamp-is-quoted-short", TRAIN_T, 2,
         ("t.csv", "row 4: cannot read timestamp 'yesterday-at-noon", "…' (3,000 characters)", "ISO-8601"),
         {"t.csv": with_cell(4, ("yesterday-at-noon-" * 200)[:3000], column=0)}, then=short(600)),
    Case("parquet-five-megabyte-cell", "evaluate --trace {d}/t.parquet", 2,
         ("t.parquet", "row 2: the 'timestamp' cell is over 4,096 characters long"),
         {"t.parquet": parquet_with_cell(5 << 20)}, timeout=QUICK, then=short()),
    Case("scenario-over-the-yaml-limit", BACKTEST_SCENARIO, 2,
         ("s.yaml", "over the 1,048,576-byte limit (1 MiB) for a scenario", "PREDICTIVE_SCALER_MAX_YAML_BYTES=BYTES"),
         {"s.yaml": "# padding\n" * 120_000 + "policies: [predictive]\n"}, then=short()),
    Case("scaler-spec-sparse-gigabyte", BACKTEST_SCALER, 2,
         ("scaler.yaml", "is 1,073,741,824 bytes (1 GiB)", "for a scalers file", "PREDICTIVE_SCALER_MAX_YAML_BYTES"),
         {"scaler.yaml": sparse(1 << 30)}, timeout=QUICK),
    Case("giant-model-json-forecast", FORECAST, 2,
         ("model.json", "over the 16,777,216-byte limit (16 MiB) for a model file", "not a model file this tool "
          "wrote", ROLLBACK_ADVICE),
         {"store/web/versions": in_version("model.json", sparse(2 << 30))}, timeout=QUICK),
    Case("giant-manifest-json-list", LIST, 0,
         ("damaged", "manifest.json", "over the 1,048,576-byte limit (1 MiB) for a manifest file"),
         {"store/web/versions": in_version("manifest.json", sparse(300 << 20), which=0)}, timeout=QUICK),
    Case("giant-serving-pointer-verify", VERIFY, 1,
         ("serving: is 104,857,600 bytes", "for a serving pointer file", "serving pointer is damaged"),
         serving_pointer(sparse(100 << 20)), timeout=QUICK),
    Case("trace-limit-lowered-by-environment", "evaluate --trace {d}/good.csv", 2,
         ("good.csv", "over the 1,024-byte limit (1 KiB) for a trace", "PREDICTIVE_SCALER_MAX_TRACE_BYTES"),
         env={"PREDICTIVE_SCALER_MAX_TRACE_BYTES": "1KiB"}),
    Case("trace-limit-not-a-size", "evaluate --trace {d}/good.csv", 2,
         ("PREDICTIVE_SCALER_MAX_TRACE_BYTES='lots' is not a size", "=1GiB", "the default is 512 MiB"),
         env={"PREDICTIVE_SCALER_MAX_TRACE_BYTES": "lots"}),
]

CASES: dict[str, list[Case]] = {"hangs": HANGS, "store I/O": STORE_IO, "unbounded input": UNBOUNDED}
ALL = [case for cases in CASES.values() for case in cases]


def test_every_class_is_large_enough() -> None:
    sizes = {name: len(cases) for name, cases in CASES.items()}
    assert all(n >= 10 for n in sizes.values()) and sum(sizes.values()) >= 35, sizes
    assert all(c.timeout is not None and c.timeout <= QUICK for c in HANGS), "a hang case runs under a timeout"


@pytest.mark.parametrize("case", ALL, ids=ids(ALL))
def test_hostile_file(case: Case, work: Path) -> None:
    check(case, work)

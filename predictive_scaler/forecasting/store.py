"""Versioned model artifacts (JSON + manifest + sha256) and the directory-backed model store.

An artifact is a directory holding ``model.json`` (``{"kind", "params"}``) and
``manifest.json`` (format version, kind, library versions, the series it was
trained for, training window, evaluation metrics, creation time, sha256 and size
of ``model.json``). :func:`load_artifact` checks the manifest *before* it parses
the model: a model file is only parsed once its bytes are known to be the ones
the manifest describes. Nothing here ever unpickles.

The store (a directory; a PersistentVolume in the cluster) lays out::

    <root>/<name>/versions/<version>/model.json
    <root>/<name>/versions/<version>/manifest.json
    <root>/<name>/serving            {"version", "sha256", "history": [older serving versions]}

Versions are immutable once written. Every write goes to a temporary name in the
same directory, is fsynced, then renamed into place (and the directory fsynced),
and the serving pointer is switched only after the version is complete — so a
crash at any point leaves the previous serving model intact and loadable.

Several writers may share one store (concurrent ``train --out``, the retraining
job, an operator's ``models promote``): each writes under its own temporary name
(``.tmp-<pid>@<host>-<random>``, swept only once its writer is gone), and moving
a version into place, switching the pointer and pruning happen under an
exclusive ``flock`` on ``<root>/<name>/.lock`` — so no writer deletes another's
work and no version is lost. A damaged ``serving`` pointer is repaired by the
next ``promote``, ``rollback`` or publish, and reported by :meth:`ModelStore.verify`.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import socket
import stat
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from predictive_scaler import __version__
from predictive_scaler.clock import Clock, SystemClock
from predictive_scaler.errors import ConfigError, ModelError, StoreError, did_you_mean
from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting.base import FittedModel
from predictive_scaler.series import Series, to_utc
from predictive_scaler.yaml_input import describe, kind_of, read_regular

#: The artifact format this build writes and reads. 2: calibrated models may carry coverage
#: tracking (``tracking_window``, ``tracking_steps``, ``tracking_rate``), which a reader of
#: format 1 would ignore; 3: the tracker's step floor (``tracking_floor``), which a reader of 2
#: would ignore as silently — so such a reader refuses a 3 and says to upgrade. Formats 1 and 2
#: still load unchanged.
FORMAT_VERSION = 3
KNOWN_FORMAT_VERSIONS = frozenset({1, 2, FORMAT_VERSION})
MODEL_FILE = "model.json"
MANIFEST_FILE = "manifest.json"
SERVING_FILE = "serving"
LOCK_FILE = ".lock"
#: A temporary version directory of a writer on another host is swept after this long.
STALE_TEMPORARY_SECONDS = 3600.0
#: Refuse bigger model files before reading them, and never write one: the bundled model is 2.5 KB and
#: the biggest kinds (a weekly profile at one minute, calibration offsets per horizon) a few hundred KB,
#: while parsing JSON costs about ten times its size in memory.
MAX_MODEL_BYTES = 16 * 1024 * 1024
#: A manifest (5 KB bundled) or a serving pointer (under 1 KB).
MAX_MANIFEST_BYTES = 1024 * 1024
#: Versions kept per name (the serving one and its rollback history are always kept too).
DEFAULT_KEEP = 5

_RETRAIN = "retrain with `predictive-scaler train`"
_ROLLBACK = "roll back with `predictive-scaler models rollback`"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_LIBRARIES = ("statsmodels", "prophet", "numpy", "pandas")


# -- manifest ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainingWindow:
    """The history a model was fitted on: [start, end) at ``step_seconds``."""

    start: pd.Timestamp
    end: pd.Timestamp
    step_seconds: int

    @classmethod
    def of(cls, series: Series) -> TrainingWindow:
        return cls(start=series.start, end=series.end, step_seconds=series.step_seconds)

    def to_dict(self) -> dict[str, Any]:
        return {"start": _iso(self.start), "end": _iso(self.end), "step_seconds": self.step_seconds}

    @classmethod
    def from_dict(cls, d: Any) -> TrainingWindow:
        if not isinstance(d, Mapping):
            raise ModelError(f"manifest: 'window' must be an object; {_RETRAIN}")
        step = d.get("step_seconds")
        if not isinstance(step, int) or isinstance(step, bool) or step <= 0:
            raise ModelError(f"manifest: window step_seconds must be a positive integer; {_RETRAIN}")
        start, end = _timestamp(d.get("start"), "window start"), _timestamp(d.get("end"), "window end")
        if end <= start:
            raise ModelError(f"manifest: window end {end} is not after its start {start}; {_RETRAIN}")
        return cls(start=start, end=end, step_seconds=step)


@dataclass(frozen=True)
class Manifest:
    """What an artifact is, checked before its model is parsed."""

    format_version: int
    kind: str
    series: str
    window: TrainingWindow
    sha256: str
    size_bytes: int
    created_at: pd.Timestamp
    #: For a calibrated wrapper, the kind of the model inside it ("arima", "prophet" …).
    base_kind: str | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)
    libraries: Mapping[str, str | None] = field(default_factory=dict)
    #: Requests/s one replica serves at the utilisation target, learned from DCGM history by the
    #: retraining job (``predictive_scaler.capacity_estimate``), with its interval; None when unknown.
    capacity: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "kind": self.kind,
            "base_kind": self.base_kind,
            "series": self.series,
            "window": self.window.to_dict(),
            "metrics": _jsonable(self.metrics),
            "libraries": dict(self.libraries),
            **({"capacity": _jsonable(self.capacity)} if self.capacity is not None else {}),
            "created_at": _iso(self.created_at),
            "sha256": self.sha256,
            "size_bytes": self.size_bytes,
        }

    @classmethod
    def from_dict(cls, d: Any) -> Manifest:
        if not isinstance(d, Mapping):
            raise ModelError(f"manifest is not a JSON object; {_RETRAIN}")
        version = d.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise ModelError(f"manifest has no integer format_version; {_RETRAIN}")
        if version not in KNOWN_FORMAT_VERSIONS:
            raise ModelError(
                f"unknown artifact format version {version} (this build reads "
                f"{', '.join(map(str, sorted(KNOWN_FORMAT_VERSIONS)))}); {_RETRAIN} or upgrade predictive-scaler"
            )
        for key in ("kind", "series", "sha256"):
            if not isinstance(d.get(key), str) or not d[key]:
                raise ModelError(f"manifest: {key!r} must be a non-empty string; {_RETRAIN}")
        if not re.fullmatch(r"[0-9a-f]{64}", d["sha256"]):
            raise ModelError(f"manifest: sha256 is not a hex digest; {_RETRAIN}")
        size = d.get("size_bytes")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ModelError(f"manifest: size_bytes must be a non-negative integer; {_RETRAIN}")
        base = d.get("base_kind")
        if base is not None and not isinstance(base, str):
            raise ModelError(f"manifest: base_kind must be a string or null; {_RETRAIN}")
        metrics = d.get("metrics", {})
        libraries = d.get("libraries", {})
        if not isinstance(metrics, Mapping) or not isinstance(libraries, Mapping):
            raise ModelError(f"manifest: metrics and libraries must be objects; {_RETRAIN}")
        created = _timestamp(d.get("created_at"), "created_at")
        capacity = d.get("capacity")
        if capacity is not None and not isinstance(capacity, Mapping):
            raise ModelError(f"manifest: capacity must be an object or absent; {_RETRAIN}")
        return cls(
            format_version=version,
            kind=d["kind"],
            base_kind=base,
            series=d["series"],
            window=TrainingWindow.from_dict(d.get("window")),
            metrics=dict(metrics),
            libraries=dict(libraries),
            capacity=dict(capacity) if capacity is not None else None,
            created_at=created,
            sha256=d["sha256"],
            size_bytes=size,
        )


@dataclass(frozen=True)
class LoadedModel:
    """A verified model and the manifest it was checked against."""

    model: FittedModel
    manifest: Manifest
    path: Path


def library_versions() -> dict[str, str | None]:
    """Versions of the libraries a model's numbers depend on (from metadata: nothing is imported)."""
    out: dict[str, str | None] = {"predictive_scaler": __version__}
    for name in _LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


# -- writing -----------------------------------------------------------------------------------

def model_bytes(model: FittedModel) -> bytes:
    """Canonical JSON of a model; refuses non-finite parameters (they would not load)."""
    try:
        text = json.dumps({"kind": model.kind, "params": model.to_params()}, allow_nan=False,
                          sort_keys=True, separators=(",", ":"), default=_json_default)
    except ValueError as exc:
        raise ModelError(
            f"{model.kind} model has non-finite (NaN or infinite) parameters and cannot be saved; "
            "check the training data for gaps or constant stretches and retrain"
        ) from exc
    except TypeError as exc:
        raise ModelError(f"{model.kind} model parameters are not JSON-serialisable ({exc})") from exc
    return text.encode("utf-8")


def artifact_bytes(
    model: FittedModel,
    *,
    series: str,
    window: TrainingWindow,
    metrics: Mapping[str, Any] | None = None,
    clock: Clock | None = None,
    capacity: Mapping[str, Any] | None = None,
) -> tuple[bytes, Manifest]:
    """The bytes of ``model.json`` and the manifest describing them (what every store writes)."""
    _check_name(series, what="series")
    body = model_bytes(model)
    if len(body) > MAX_MODEL_BYTES:  # it could never be loaded again
        raise ModelError(f"{model.kind} model is {len(body):,} bytes as JSON, over the {MAX_MODEL_BYTES:,}-byte limit "
                         "a model file may have; choose a smaller model (fewer candidates with --models)")
    created = pd.Timestamp((clock or SystemClock()).now())
    manifest = Manifest(
        format_version=FORMAT_VERSION,
        kind=model.kind,
        base_kind=_base_kind(model),
        series=series,
        window=window,
        metrics=dict(metrics or {}),
        libraries=library_versions(),
        created_at=created,
        sha256=hashlib.sha256(body).hexdigest(),
        size_bytes=len(body),
        capacity=dict(capacity) if capacity is not None else None,
    )
    return body, manifest


def save_artifact(
    model: FittedModel,
    *,
    series: str,
    window: TrainingWindow,
    metrics: Mapping[str, Any] | None = None,
    directory: str | Path,
    clock: Clock | None = None,
    capacity: Mapping[str, Any] | None = None,
) -> Manifest:
    """Write ``model.json`` then ``manifest.json`` (each atomically) into ``directory``.

    The manifest is written last, so a directory without one is an unfinished write and is refused.
    """
    body, manifest = artifact_bytes(model, series=series, window=window, metrics=metrics, clock=clock,
                                    capacity=capacity)
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _io_error(exc, d, "create the directory") from exc
    write_atomic(d / MODEL_FILE, body)
    write_atomic(d / MANIFEST_FILE, _dump(manifest.to_dict()))
    return manifest


def write_atomic(path: Path, data: bytes) -> None:
    """Temp file in the same directory, fsync, rename over ``path``, fsync the directory.

    On any failure ``path`` is as it was and the temp file is gone; an OS error (a full or read-only
    volume, no permission) is a :class:`StoreError` naming ``path`` and what to do.
    """
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        # O_EXCL|O_NOFOLLOW: the temp name is ours alone, never a link planted to write elsewhere.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        _remove_quietly(tmp)
        raise _io_error(exc, path, "write") from exc
    except BaseException:
        _remove_quietly(tmp)
        raise
    _fsync_dir(path.parent)


def _remove_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):  # a read-only volume refuses this too; the first error is the one to say
        path.unlink(missing_ok=True)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _io_error(exc, path, "sync the directory") from exc


def _io_error(exc: OSError, path: Path, doing: str) -> StoreError:
    """An OS error of the store's volume as a StoreError: the path, what failed, and what to do."""
    why = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        fix = ("the store's volume is full, or a quota or file-size limit was reached: free space there (or give "
               "another store directory), then run it again")
    elif exc.errno == errno.EROFS:
        fix = ("the store is on a read-only file system: mount it read-write (in the cluster, the model store's "
               "volume must not be readOnly), then run it again")
    elif exc.errno in (errno.EACCES, errno.EPERM):
        fix = "this user may not write there: give it write access to the store, then run it again"
    elif exc.errno in (errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.ELOOP):
        fix = "something of the wrong kind is in the way: move it aside, then run it again"
    else:
        fix = "check the store's volume, then run it again"
    return StoreError(f"{path}: cannot {doing} ({why}); {fix}")


# -- reading -----------------------------------------------------------------------------------

def load_artifact(directory: str | Path, *, expected_series: str | None = None) -> LoadedModel:
    """Verify and load an artifact; every refusal is a :class:`ModelError` saying what to do."""
    d = Path(directory)
    manifest = read_manifest(d)
    model = verify_artifact(str(d), manifest, lambda: _read_bounded(d / MODEL_FILE, MAX_MODEL_BYTES, "model"),
                            expected_series=expected_series)
    return LoadedModel(model=model, manifest=manifest, path=d)


def verify_artifact(where: str, manifest: Manifest, read_model: Callable[[], bytes], *,
                    expected_series: str | None = None) -> FittedModel:
    """The model of an artifact at ``where`` (a directory or an object prefix), parsed only once its bytes
    (from ``read_model``) match ``manifest``; every refusal is a :class:`ModelError` saying what to do."""
    if expected_series is not None and manifest.series != expected_series:
        raise ModelError(
            f"{where}: artifact was trained for series {manifest.series!r}, not {expected_series!r}; "
            f"{_RETRAIN} on {expected_series!r}'s history"
        )
    body = read_model()
    model_at = f"{where}/{MODEL_FILE}"
    if hashlib.sha256(body).hexdigest() != manifest.sha256:
        raise ModelError(
            f"{model_at}: sha256 does not match the manifest (the file was changed or "
            f"corrupted); {_ROLLBACK} or {_RETRAIN}"
        )
    doc = _parse_json(body, model_at)
    if not isinstance(doc, dict) or not isinstance(doc.get("params"), dict):
        raise ModelError(f"{model_at}: expected an object with 'kind' and 'params'; {_RETRAIN}")
    if doc.get("kind") != manifest.kind:
        raise ModelError(
            f"{model_at}: model kind {doc.get('kind')!r} differs from the manifest's "
            f"{manifest.kind!r}; {_RETRAIN}"
        )
    try:
        return registry.model_from_params(manifest.kind, doc["params"])
    except ModelError as exc:
        # The model's own message may already end in generic advice; give the store's, once.
        raise ModelError(f"{model_at}: {_without_advice(str(exc))}; {_RETRAIN}") from exc
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ModelError(f"{model_at}: invalid {manifest.kind} parameters ({exc!r}); {_RETRAIN}") from exc


def parse_manifest(body: bytes, where: str) -> Manifest:
    """A manifest's bytes (read from ``where``) checked; a ModelError when damaged."""
    return Manifest.from_dict(_parse_json(body, where))


def read_manifest(directory: str | Path) -> Manifest:
    d = Path(directory)
    if not d.is_dir():
        what = describe(d)
        kind = f"it is {what}, not a directory" if what is not None else "not a directory"
        raise ModelError(f"{d}: no model artifact here ({kind}); {_RETRAIN} --out {d}")
    body = _read_bounded(d / MANIFEST_FILE, MAX_MANIFEST_BYTES, "manifest")
    return Manifest.from_dict(_parse_json(body, d / MANIFEST_FILE))


def _read_bounded(path: Path, limit: int, what: str) -> bytes:
    """A file of the store: regular (never a FIFO, a device or a link: the store writes none) and at most
    ``limit`` bytes, checked before it is read. Damage is a ModelError; an unreadable file a StoreError."""
    return read_regular(
        path, limit=limit, what=f"a {what} file", remedy=f"{_ROLLBACK} or {_RETRAIN}", error=ModelError,
        unreadable=StoreError, follow_symlinks=False,
        missing=f"{what} file missing (unfinished or damaged artifact)",
        too_big=f"it is not a {what} file this tool wrote — {_ROLLBACK} or {_RETRAIN}",
    )


def _reject_constant(token: str) -> Any:
    raise ValueError(f"non-finite number {token}")


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise ValueError(f"non-finite number {token}")
    return value


def _parse_json(data: bytes, path: Path | str) -> Any:
    if data[:1] == b"\x80" or data[:2] in (b"(d", b"(l", b"}q", b"]q"):
        raise ModelError(
            f"{path}: not JSON — the bytes look like a Python pickle, which is never loaded (it can run "
            f"code); {_RETRAIN}"
        )
    try:
        text = data.decode("utf-8")
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except UnicodeDecodeError as exc:
        raise ModelError(f"{path}: not JSON (not UTF-8 text); {_RETRAIN}") from exc
    except ValueError as exc:  # JSONDecodeError and non-finite numbers
        if "non-finite" in str(exc):
            raise ModelError(f"{path}: contains a non-finite number ({exc}); {_RETRAIN}") from exc
        raise ModelError(f"{path}: not JSON or truncated ({exc}); {_ROLLBACK} or {_RETRAIN}") from exc


# -- the store ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ServingPointer:
    version: str
    sha256: str
    #: Versions that served before, oldest first: what rollback returns to.
    history: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "sha256": self.sha256, "history": list(self.history)}


@dataclass(frozen=True)
class VerifyReport:
    """What :meth:`ModelStore.verify` found for one model name."""

    name: str
    serving: str | None
    versions: int
    problems: tuple[str, ...] = ()
    #: What ``verify --repair`` did (e.g. the version the pointer was repaired to).
    repaired: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def with_repair(self, repaired: str) -> VerifyReport:
        return VerifyReport(self.name, self.serving, self.versions, self.problems, repaired)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "serving": self.serving, "versions": self.versions, "ok": self.ok,
                "problems": list(self.problems), "repaired": self.repaired}


@dataclass(frozen=True)
class VersionInfo:
    version: str
    serving: bool
    manifest: Manifest | None
    #: Why the manifest could not be read, for a damaged version.
    problem: str | None = None


class ModelStore:
    """Versioned artifacts per name with a serving pointer, rollback and pruning."""

    def __init__(self, root: str | Path, *, keep: int = DEFAULT_KEEP, clock: Clock | None = None) -> None:
        if keep < 1:
            raise ConfigError(f"model store must keep at least 1 version, got {keep}; use --keep 1 or more",
                              field="keep")
        self.root = Path(root)
        self.keep = keep
        self.clock = clock or SystemClock()

    @property
    def location(self) -> str:
        return str(self.root)

    # paths
    def _dir(self, name: str) -> Path:
        return self.root / _check_name(name, what="model name")

    def _versions(self, name: str) -> Path:
        return self._dir(name) / "versions"

    def version_dir(self, name: str, version: str) -> Path:
        return self._versions(name) / _check_name(version, what="version")

    def names(self) -> list[str]:
        """Every model in the store: a directory with a valid name holding ``versions`` (of whatever kind:
        a ``versions`` that is not a directory is a model :meth:`verify` reports, not one to hide)."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in _entries(self.root) if p.is_dir() and _NAME.match(p.name)
                      and os.path.lexists(p / "versions"))

    # writing
    def publish(
        self,
        name: str,
        model: FittedModel,
        *,
        series: str,
        window: TrainingWindow,
        metrics: Mapping[str, Any] | None = None,
        serve: bool = True,
        capacity: Mapping[str, Any] | None = None,
    ) -> str:
        """Write a new version (complete before it becomes visible); serve it if ``serve``. Returns its id.

        A failure before the version is in place (a full or read-only volume, say) leaves the store as it
        was and says so; after, the version is stored and the serving pointer is as it was."""
        versions = self._make_versions_dir(name)
        tmp = versions / f".tmp-{os.getpid()}@{socket.gethostname()}-{uuid.uuid4().hex[:12]}"
        placed = False
        try:
            manifest = save_artifact(model, series=series, window=window, metrics=metrics,
                                     directory=tmp, clock=self.clock, capacity=capacity)
            with self._locked(name):
                self._clean_temporaries(versions)
                version = f"{to_utc(manifest.created_at):%Y%m%dT%H%M%SZ}-{manifest.sha256[:8]}"
                final = versions / version
                if final.exists() and _intact(final, manifest.sha256):
                    # Same second, same bytes, and the copy on disk verifies: already published.
                    shutil.rmtree(tmp)
                else:
                    if final.exists():
                        # A damaged copy holds this id. Versions are immutable (a reader may hold the
                        # old one), so the good bytes get a fresh id that sorts right after it.
                        version = f"{version}-{uuid.uuid4().hex[:8]}"
                        final = versions / version
                    _replace(tmp, final)
                    placed = True
                    _fsync_dir(versions)
                if serve:
                    self._promote(name, version)
                self._prune(name)
        except StoreError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if placed:  # complete and verified: kept, so the trained model is not lost
                raise StoreError(f"{exc}; version {version} is stored — promote it with `predictive-scaler models "
                                 "promote` once the store can be written") from exc.__cause__ or exc
            raise StoreError(f"{exc}; nothing was published: the store is as it was") from exc.__cause__ or exc
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return version

    def _make_versions_dir(self, name: str) -> Path:
        """``<root>/<name>/versions``, created if missing; a file (or anything else) in the way is refused."""
        versions = self._versions(name)
        for path, holds in ((self.root, "its models"), (self._dir(name), f"model {name!r}"),
                            (versions, f"the versions of {name!r}")):
            if os.path.lexists(path) and not path.is_dir():
                raise StoreError(f"{path}: is {describe(path)}, not a directory — the store keeps {holds} there; "
                                 "move it aside (or give another store directory), then run it again")
        try:
            versions.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _io_error(exc, versions, "create the directory") from exc
        return versions

    @contextlib.contextmanager
    def _locked(self, name: str) -> Iterator[None]:
        """Exclusive lock of one model name across processes (flock on ``<name>/.lock``)."""
        d = self._dir(name)
        if not d.is_dir():
            yield  # nothing stored under this name: nothing to protect (and nothing is created)
            return
        path = d / LOCK_FILE
        fd = _open_lock(path)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:
                raise _io_error(exc, path, "lock the store's lock file") from exc
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def promote(self, name: str, version: str) -> LoadedModel:
        """Serve ``version`` after verifying it loads; on refusal the serving pointer is untouched.

        A damaged pointer is replaced (its rollback history is lost with it)."""
        self.version_dir(name, version)  # a bad name or version is refused before anything is created
        with self._locked(name):
            return self._promote(name, version)

    def _promote(self, name: str, version: str) -> LoadedModel:
        loaded = load_artifact(self.version_dir(name, version))
        current, _ = self.pointer_or_problem(name)
        history: tuple[str, ...] = ()
        if current is not None and current.version != version:
            history = (*current.history, current.version)[-self.keep:]
        elif current is not None:
            history = current.history
        self._write_pointer(name, ServingPointer(version, loaded.manifest.sha256, history))
        return loaded

    def rollback(self, name: str) -> LoadedModel:
        """Serve the version that served before the current one (skipping ones that no longer load).

        With a damaged pointer (its history unreadable), the newest version that verifies is served."""
        with self._locked(name):
            return self._rollback(name)

    def _rollback(self, name: str) -> LoadedModel:
        current, problem = self.pointer_or_problem(name)
        if problem is not None:
            for info in reversed(self.list(name)):
                try:
                    loaded = load_artifact(self.version_dir(name, info.version))
                except ModelError:
                    continue
                self._write_pointer(name, ServingPointer(info.version, loaded.manifest.sha256, ()))
                return loaded
            raise ModelError(f"model {name!r}: the serving pointer is damaged ({problem}) and no version "
                             f"verifies to repair it with; {_RETRAIN}")
        if current is None:
            raise ModelError(f"model {name!r} has no serving version to roll back from; publish one with `predictive-scaler train`")
        history = list(current.history)
        problems = []
        while history:
            candidate = history.pop()
            if not self.version_dir(name, candidate).exists():
                continue  # pruned since it served
            try:
                loaded = load_artifact(self.version_dir(name, candidate))
            except ModelError as exc:
                problems.append(f"{candidate}: {exc}")
                continue
            self._write_pointer(name, ServingPointer(candidate, loaded.manifest.sha256, tuple(history)))
            return loaded
        detail = f" ({'; '.join(problems)})" if problems else ""
        raise ModelError(
            f"model {name!r}: no earlier serving version to roll back to{detail}; "
            f"promote a listed version with `predictive-scaler models promote` or {_RETRAIN}"
        )

    def _write_pointer(self, name: str, pointer: ServingPointer) -> None:
        path = self._dir(name) / SERVING_FILE
        try:
            if path.is_dir() and not path.is_symlink():
                # Damage: kept aside (never deleted), so the pointer can be written again.
                _replace(path, path.with_name(f"{SERVING_FILE}.damaged-{uuid.uuid4().hex[:8]}"))
            # A link (to outside the store, say) is replaced itself, never written through.
            write_atomic(path, _dump(pointer.to_dict()))
        except StoreError as exc:
            raise StoreError(f"{exc}; the serving pointer is unchanged") from exc.__cause__ or exc

    # reading
    def pointer_or_problem(self, name: str) -> tuple[ServingPointer | None, str | None]:
        """The serving pointer, or ``(None, why)`` when it is damaged (never raises for damage)."""
        try:
            return self.pointer(name), None
        except ModelError as exc:
            return None, str(exc)

    def pointer(self, name: str) -> ServingPointer | None:
        """The serving pointer, cheaply (no model verification): lets a controller notice a new version."""
        path = self._dir(name) / SERVING_FILE
        if not os.path.lexists(path):
            return None
        if path.is_dir() and not path.is_symlink():
            raise ModelError(f"{path}: serving pointer is a directory, not a file; {_REPAIR}")
        try:
            doc = _parse_json(_read_bounded(path, MAX_MANIFEST_BYTES, "serving pointer"), path)
        except StoreError:
            raise  # unreadable (permissions, the volume): not damage a repair would mend
        except ModelError as exc:
            raise ModelError(f"{_without_store_advice(str(exc))}: the serving pointer is damaged; {_REPAIR}") from exc
        if not isinstance(doc, dict) or not isinstance(doc.get("version"), str) or not isinstance(doc.get("sha256"), str):
            raise ModelError(f"{path}: serving pointer is damaged (no version and sha256); {_REPAIR}")
        history = doc.get("history", [])
        if not isinstance(history, list) or not all(isinstance(v, str) for v in history):
            raise ModelError(f"{path}: serving pointer history is damaged; {_REPAIR}")
        try:
            _check_name(doc["version"], what="version")
            for v in history:
                _check_name(v, what="version")
        except ConfigError as exc:
            raise ModelError(f"{path}: serving pointer is damaged ({exc}); {_REPAIR}") from exc
        return ServingPointer(doc["version"], doc["sha256"], tuple(history))

    def serving(self, name: str, *, expected_series: str | None = None) -> LoadedModel:
        """The serving model, verified (hash, format, series) against manifest and pointer."""
        pointer = self.pointer(name)
        if pointer is None:
            others = [n for n in self.names() if n != name]
            hint = did_you_mean(name, others) if others and not self._versions(name).is_dir() else ""
            raise ModelError(f"model {name!r} has no serving version in {self.root}; {hint}{_RETRAIN} --out "
                             f"{self.root}")
        entry = self.version_dir(name, pointer.version)
        if not entry.is_dir():
            what = describe(entry)
            gone = "is gone (deleted or pruned)" if what is None else f"is {what}, not a version directory"
            raise ModelError(f"model {name!r}: the serving version {pointer.version} {gone} — "
                             f"the serving pointer is damaged; {_REPAIR}")
        loaded = load_artifact(self.version_dir(name, pointer.version), expected_series=expected_series)
        if loaded.manifest.sha256 != pointer.sha256:
            raise ModelError(
                f"model {name!r}: version {pointer.version} differs from what was promoted (sha256 "
                f"mismatch); {_ROLLBACK}"
            )
        return loaded

    def load(self, name: str, version: str, *, expected_series: str | None = None) -> LoadedModel:
        return load_artifact(self.version_dir(name, version), expected_series=expected_series)

    def list(self, name: str) -> list[VersionInfo]:
        versions = self._versions(name)
        if not versions.is_dir():
            return []
        try:
            serving = self.pointer(name)
        except ModelError:
            serving = None
        out = []
        for p in sorted(_entries(versions)):
            if p.name.startswith(".") or not p.is_dir():
                continue
            try:
                info = VersionInfo(p.name, serving is not None and serving.version == p.name, read_manifest(p))
            except ModelError as exc:
                info = VersionInfo(p.name, serving is not None and serving.version == p.name, None, str(exc))
            out.append(info)
        return out

    def verify(self, name: str | None = None, *, repair: bool = False) -> builtins.list[VerifyReport]:
        """Check every model (or ``name``): pointer readable, serving version verified, every version
        verified. ``repair``: a damaged pointer or a serving version that fails is re-pointed to the
        newest version that verifies (under the lock)."""
        names = [name] if name is not None else self.names()
        return [self._verify_one(n, repair) for n in names]

    def _verify_one(self, name: str, repair: bool) -> VerifyReport:
        problems: list[str] = []
        infos = self.list(name)
        versions = self._versions(name)
        if not versions.is_dir():
            what = describe(versions)
            if what is not None:
                return VerifyReport(name, None, 0, (
                    f"{versions}: is {what}, not a directory — the store keeps the versions of {name!r} there; "
                    f"move it aside, then {_RETRAIN} --out {self.root}",))
            return VerifyReport(name, None, 0, (f"model {name!r} is not in {self.root}; {_RETRAIN} --out {self.root}",))
        problems.extend(serving_problems(self, name)[0])
        for info in infos:
            try:
                load_artifact(self.version_dir(name, info.version))
            except ModelError as exc:
                problems.append(f"version {info.version}: {exc}")
        repaired = None
        if repair and problems:
            with self._locked(name):
                pointer, damaged = self.pointer_or_problem(name)
                serving_ok = pointer is not None and damaged is None and _intact(
                    self.version_dir(name, pointer.version), pointer.sha256)
                if not serving_ok:
                    for info in reversed(self.list(name)):
                        if _intact(self.version_dir(name, info.version), None):
                            loaded = self._promote(name, info.version)
                            repaired = f"serving pointer repaired: now {loaded.path.name}"
                            break
            if repaired:
                return self._verify_one(name, repair=False).with_repair(repaired)
        pointer, _ = self.pointer_or_problem(name)
        return VerifyReport(name, pointer.version if pointer else None, len(infos), tuple(problems), repaired)

    # documents kept beside a model's versions (the retraining job's run records)
    def document_path(self, name: str, folder: str, doc_id: str) -> Path:
        return self._dir(name) / _check_name(folder, what="folder") / f"{_check_name(doc_id, what='document id')}.json"

    def read_document(self, name: str, folder: str, doc_id: str, *, limit: int = 1 << 20) -> bytes | None:
        """``<name>/<folder>/<doc_id>.json``, or None when absent; a regular file of at most ``limit`` bytes
        (a FIFO planted there must not block): anything else is a ModelError."""
        path = self.document_path(name, folder, doc_id)
        if not os.path.lexists(path):
            return None
        return read_regular(path, limit=limit, what=f"a {folder} record", error=ModelError, remedy="it is ignored")

    def write_document(self, name: str, folder: str, doc_id: str, body: bytes) -> None:
        path = self.document_path(name, folder, doc_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _io_error(exc, path.parent, "create the directory") from exc
        write_atomic(path, body)

    # housekeeping
    def _prune(self, name: str) -> None:
        pointer, _ = self.pointer_or_problem(name)
        # The newest `keep` versions stay, plus the serving one if it is older (after a rollback).
        protected = set() if pointer is None else {pointer.version}
        versions = [v.version for v in self.list(name)]
        for v in versions[: max(0, len(versions) - self.keep)]:
            if v not in protected:
                shutil.rmtree(self.version_dir(name, v), ignore_errors=True)

    def _clean_temporaries(self, versions: Path) -> None:
        # Leftovers of crashed publishes: never visible as versions, removed on the next publish —
        # but only once their writer is gone: another writer may be filling its own right now.
        for p in versions.glob(".tmp-*"):
            if _writer_gone(p):
                shutil.rmtree(p, ignore_errors=True)


# -- helpers -----------------------------------------------------------------------------------

_TRAILING_RETRAIN = re.compile(r"[;,]?\s*retrain(?: the model)?\.?\s*$", re.IGNORECASE)


def _without_advice(message: str) -> str:
    """``message`` without a trailing "; retrain (the model)" (the caller adds the exact command)."""
    return _TRAILING_RETRAIN.sub("", message)


def _intact(directory: Path, sha256: str | None) -> bool:
    """Whether the version in ``directory`` loads (and, given ``sha256``, holds the model with that hash)."""
    try:
        loaded = load_artifact(directory)
    except (ModelError, ConfigError):
        return False
    return sha256 is None or loaded.manifest.sha256 == sha256


_TEMPORARY = re.compile(r"^\.tmp-(\d+)@(.+)-[0-9a-f]{12}$")


def _writer_gone(path: Path) -> bool:
    """Whether the publish that made the temporary directory ``path`` can no longer finish it."""
    m = _TEMPORARY.match(path.name)
    if m is None:
        return True  # not a name this build writes: an old build's leftover
    pid, host = int(m.group(1)), m.group(2)
    if host != socket.gethostname():
        try:
            return time.time() - path.stat().st_mtime > STALE_TEMPORARY_SECONDS
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _entries(directory: Path) -> builtins.list[Path]:
    """The entries of a store directory; an unreadable one is a StoreError naming it."""
    try:
        return builtins.list(directory.iterdir())
    except OSError as exc:
        raise StoreError(f"{directory}: cannot be listed ({exc.strerror or exc}); give this user read access to "
                         "the store, then run it again") from exc


def _replace(src: Path, dst: Path) -> None:
    try:
        os.replace(src, dst)
    except OSError as exc:
        raise _io_error(exc, dst, f"move {src.name} here") from exc


def _open_lock(path: Path) -> int:
    """The store's lock file, opened for flock (created if missing). Anything but a regular file is
    refused before it is opened (a FIFO, a link planted to create a file elsewhere, a directory)."""
    fix = "move it aside (the store makes a new lock file), then run it again"
    what = describe(path)
    if what is not None and what != "a regular file":
        raise StoreError(f"{path}: the store's lock file is {what}, not a regular file; {fix}")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR):  # swapped in since the check above
            raise StoreError(f"{path}: the store's lock file is {describe(path)}, not a regular file; {fix}") from exc
        raise _io_error(exc, path, "open the store's lock file") from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise StoreError(f"{path}: the store's lock file is {kind_of(mode)}, not a regular file; {fix}")
    return fd


_REPAIR = ("repair it with `predictive-scaler models rollback` (the newest version that verifies) or "
           "`predictive-scaler models promote --version V`, or retrain; `predictive-scaler models verify` checks "
           "the store")


def _without_store_advice(message: str) -> str:
    for advice in (f"; {_ROLLBACK} or {_RETRAIN}", f"; {_RETRAIN}", f" — {_ROLLBACK} or {_RETRAIN}"):
        if message.endswith(advice):
            return message[: -len(advice)]
    return message

def _check_name(name: str, *, what: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
        raise ConfigError(
            f"invalid {what} {name!r}: use letters, digits, '.', '_' and '-' (starting with a letter or "
            "digit, no '..', no '/'), e.g. the scaler's name",
            field=what.replace(" ", "_"),
        )
    return name


def _base_kind(model: FittedModel) -> str | None:
    """The wrapped model's kind for a wrapper (calibrated), else None."""
    kind = getattr(model, "base_kind", None)
    if kind is None:
        base = getattr(model, "base", None)
        kind = getattr(base, "kind", None)
    return kind if isinstance(kind, str) else None


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")


def _jsonable(obj: Any) -> Any:
    """Metrics for a manifest: undefined values become null, never NaN or Infinity."""
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _timestamp(value: Any, what: str) -> pd.Timestamp:
    try:
        ts = pd.Timestamp(value) if isinstance(value, str) else None
    except ValueError:
        ts = None
    if ts is None or pd.isna(ts):
        raise ModelError(f"manifest: {what} {value!r} is not an ISO-8601 time; {_RETRAIN}")
    return to_utc(ts)


def _dump(doc: Any) -> bytes:
    return (json.dumps(doc, allow_nan=False, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _iso(ts: pd.Timestamp | datetime) -> str:
    return to_utc(ts).isoformat().replace("+00:00", "Z")


# -- every store -------------------------------------------------------------------------------

class ModelStorage(Protocol):
    """What a model store offers, whatever holds it: a directory (:class:`ModelStore`) or an object store
    bucket (:class:`~predictive_scaler.forecasting.object_store.ObjectModelStore`). Both write versions
    before their manifest and the manifest before the pointer, and verify before a pointer moves."""

    keep: int

    @property
    def location(self) -> str:
        """Where the store is, as a user gives it (a directory or ``s3://bucket/prefix``)."""
        ...

    def names(self) -> builtins.list[str]: ...

    def publish(self, name: str, model: FittedModel, *, series: str, window: TrainingWindow,
                metrics: Mapping[str, Any] | None = None, serve: bool = True,
                capacity: Mapping[str, Any] | None = None) -> str: ...

    def promote(self, name: str, version: str) -> LoadedModel: ...

    def rollback(self, name: str) -> LoadedModel: ...

    def pointer(self, name: str) -> ServingPointer | None: ...

    def pointer_or_problem(self, name: str) -> tuple[ServingPointer | None, str | None]: ...

    def serving(self, name: str, *, expected_series: str | None = None) -> LoadedModel: ...

    def load(self, name: str, version: str, *, expected_series: str | None = None) -> LoadedModel: ...

    def list(self, name: str) -> builtins.list[VersionInfo]: ...

    def verify(self, name: str | None = None, *, repair: bool = False) -> builtins.list[VerifyReport]: ...

    def read_document(self, name: str, folder: str, doc_id: str, *, limit: int = 1 << 20) -> bytes | None: ...

    def write_document(self, name: str, folder: str, doc_id: str, body: bytes) -> None: ...


def serving_problems(store: ModelStorage, name: str) -> tuple[builtins.list[str], bool]:
    """What ``models verify`` says of ``name``'s serving pointer and the version it names, whatever holds
    the store; and whether that version serves (verified)."""
    pointer, damaged = store.pointer_or_problem(name)
    if damaged:
        return [damaged], False
    if pointer is None:
        return [f"model {name!r} has no serving pointer; promote a version with `predictive-scaler models promote`"], False
    try:
        store.serving(name)
    except ModelError as exc:
        return [f"serving version {pointer.version}: {exc}"], False
    return [], True


def is_object_store_url(location: str | Path) -> bool:
    return isinstance(location, str) and location.startswith("s3://")


def open_store(location: str | Path, *, keep: int = DEFAULT_KEEP, clock: Clock | None = None) -> ModelStorage:
    """The store at ``location``: ``s3://bucket/prefix`` (credentials and endpoint from the environment the
    AWS SDK reads) or a directory."""
    if is_object_store_url(location):
        from predictive_scaler.forecasting.object_store import ObjectModelStore

        return ObjectModelStore(str(location), keep=keep, clock=clock)
    return ModelStore(location, keep=keep, clock=clock)


def check_model_name(name: str, *, what: str = "model name") -> str:
    """``name`` if a store accepts it as a model, series or version name, else a ConfigError."""
    return _check_name(name, what=what)

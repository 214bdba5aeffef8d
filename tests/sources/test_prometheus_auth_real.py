"""The real Prometheus behind a loopback HTTPS proxy asking for a bearer token, a client certificate and a
tenant header (tests/support/auth_proxy.py): the controller's source, `retrain` and `backtest --prometheus`
read through it with the flags; without them each fails saying which credential or flag is missing, and
no token or password appears in any output, log or file.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from predictive_scaler.cli import build_parser, main
from predictive_scaler.clock import SystemClock
from predictive_scaler.commands.controller import settings_from_args
from predictive_scaler.controller.run import prometheus_source
from predictive_scaler.errors import SourceError
from predictive_scaler.sources.prometheus import PrometheusSource
from tests.support.auth_proxy import AuthProxy, Pki, auth_proxy, make_pki
from tests.support.prometheus import BackfilledPrometheus

pytestmark = [pytest.mark.prometheus]

TOKEN = "tok-9c4e1a7f3b2d"
ROTATED = "tok-rotated-5e8b0c"
PASSWORD = "pw-1a2b3c4d5e"
TENANT = "team-a"
QUERY = 'sum(rate(requests_total{namespace="ml",job="inference"}[1m]))'
SCALER = f"""\
apiVersion: predictive-scaler.io/v1alpha1
kind: PredictiveScaler
metadata: {{name: llm, namespace: ml}}
spec:
  target: {{name: llm}}
  demand: {{query: '{QUERY}'}}
  capacity: {{requestsPerReplica: 200}}
  maxReplicas: 14
"""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def proxy(prometheus_server: BackfilledPrometheus, pki: Pki) -> Iterator[AuthProxy]:
    with auth_proxy(prometheus_server.url, pki, client_ca=True, token=TOKEN, tenant=TENANT) as p:
        yield p


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


def flags(pki: Pki, token_file: Path | None, *, ca: bool = True, cert: bool = True,
          tenant: str | None = TENANT) -> list[str]:
    out = []
    if token_file is not None:
        out += ["--prometheus-bearer-token-file", str(token_file)]
    if ca:
        out += ["--prometheus-ca-file", str(pki.ca)]
    if cert:
        out += ["--prometheus-cert-file", str(pki.client_cert), "--prometheus-key-file", str(pki.client_key)]
    if tenant is not None:
        out += ["--prometheus-header", f"X-Scope-OrgID={tenant}"]
    return out


def controller_source(url: str, argv: list[str], tmp_path: Path) -> PrometheusSource:
    """The source the controller builds: flags parsed by its command, settings, then run.py's constructor."""
    args = build_parser().parse_args(["controller", "--prometheus-url", url, "--model-store", str(tmp_path), *argv])
    return prometheus_source(settings_from_args(args, {}), clock=SystemClock(), sleep=lambda _: None)


def no_secret_in(*texts: str) -> None:
    for text in texts:
        for value in (TOKEN, ROTATED, PASSWORD):
            assert value not in text


def test_the_controller_reads_through_tls_mtls_token_and_tenant_and_follows_a_rotated_token(
        prometheus_server: BackfilledPrometheus, proxy: AuthProxy, pki: Pki, token_file: Path, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    source = controller_source(proxy.url, flags(pki, token_file), tmp_path)
    now = prometheus_server.history.trace.end.to_pydatetime()
    with caplog.at_level(logging.DEBUG):
        assert source.check_connection(5.0) is None
        sample = source.scalar_now(QUERY, now, timedelta(minutes=5))
        assert sample.value > 0
        assert proxy.seen[-1] == (f"Bearer {TOKEN}", TENANT)
        # The projected token is rotated in place: the next query sends the new one.
        proxy.token = ROTATED
        fresh = token_file.with_suffix(".new")
        fresh.write_text(ROTATED + "\n")
        fresh.replace(token_file)
        assert source.scalar_now(QUERY, now, timedelta(minutes=5)).value == sample.value
        assert proxy.seen[-1] == (f"Bearer {ROTATED}", TENANT)
    no_secret_in(caplog.text)


@pytest.mark.parametrize(("drop", "words"), [
    ("token", ["HTTP 401", "--prometheus-bearer-token-file"]),
    ("tenant", ["HTTP 403", "X-Scope-OrgID"]),
    ("ca", ["certificate could not be verified", "--prometheus-ca-file"]),
])
def test_the_controller_without_a_credential_says_which(proxy: AuthProxy, pki: Pki, token_file: Path,
                                                        tmp_path: Path, drop: str, words: list[str]) -> None:
    argv = flags(pki, None if drop == "token" else token_file, ca=drop != "ca",
                 tenant=None if drop == "tenant" else TENANT)
    source = controller_source(proxy.url, argv, tmp_path)
    with pytest.raises(SourceError) as err:
        source.query("up")
    for word in words:
        assert word in str(err.value)
    problem = source.check_connection(5.0) or ""
    assert problem, "readiness must fail too"
    no_secret_in(str(err.value), problem)


def test_a_wrong_ca_is_a_verify_failure_naming_the_flag(proxy: AuthProxy, pki: Pki, token_file: Path,
                                                        tmp_path: Path) -> None:
    argv = [a if a != str(pki.ca) else str(pki.other_ca) for a in flags(pki, token_file)]
    with pytest.raises(SourceError, match="certificate could not be verified.*--prometheus-ca-file"):
        controller_source(proxy.url, argv, tmp_path).query("up")


def test_without_a_client_certificate_the_query_fails(proxy: AuthProxy, pki: Pki, token_file: Path,
                                                      tmp_path: Path) -> None:
    source = controller_source(proxy.url, flags(pki, token_file, cert=False), tmp_path)
    source.retries = 0
    with pytest.raises(SourceError) as err:
        source.query("up")
    assert "Prometheus at https://127.0.0.1" in str(err.value)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def all_files_text(root: Path, *secrets: Path) -> str:
    """What every file under ``root`` holds, but the secret files themselves."""
    return "".join(p.read_bytes().decode("utf-8", "replace") for p in root.rglob("*")
                   if p.is_file() and p not in secrets)


@pytest.mark.slow
def test_retrain_reads_through_the_proxy_and_fails_clearly_without_the_token(
        prometheus_server: BackfilledPrometheus, proxy: AuthProxy, pki: Pki, token_file: Path,
        tmp_path: Path) -> None:
    (tmp_path / "scalers.yaml").write_text(SCALER)
    end = prometheus_server.history.trace.end.isoformat()
    common = ["retrain", "--config", str(tmp_path / "scalers.yaml"), "--prometheus", proxy.url, "--now", end,
              "--history", "14d", "--min-history", "7d", "--holdout", "1d", "--max-missing", "0.5",
              "--models", "persistence", "--json"]
    code, out, err = run_cli([*common, "--store", str(tmp_path / "store"), *flags(pki, token_file)])
    assert code == 0, err
    assert '"result": "promoted"' in out
    denied, out2, err2 = run_cli([*common, "--store", str(tmp_path / "store2"), *flags(pki, None)])
    assert denied == 1
    assert "HTTP 401" in err2 and "--prometheus-bearer-token-file" in err2
    no_secret_in(out, err, out2, err2, all_files_text(tmp_path / "store"), all_files_text(tmp_path / "store2"))


@pytest.mark.slow
def test_backtest_prometheus_reads_through_the_proxy_and_fails_clearly_without_the_tenant(
        prometheus_server: BackfilledPrometheus, proxy: AuthProxy, pki: Pki, token_file: Path,
        tmp_path: Path) -> None:
    (tmp_path / "scaler.yaml").write_text(SCALER)
    (tmp_path / "s.yaml").write_text("name: behind-auth\nforecasters: [persistence]\nevaluation: 1d\n")
    common = ["backtest", "--prometheus", proxy.url, "--scaler", str(tmp_path / "scaler.yaml"), "--scenario",
              str(tmp_path / "s.yaml"), "--end", prometheus_server.history.trace.end.isoformat(), "--days", "14",
              "--min-history", "7d", "--max-missing", "0.5", "--no-progress", "--json"]
    code, out, err = run_cli([*common, "--save-history", str(tmp_path / "pulled.csv"), *flags(pki, token_file)])
    assert code == 0, err
    assert '"predictive"' in out
    denied, out2, err2 = run_cli([*common, *flags(pki, token_file, tenant=None)])
    assert denied != 0
    assert "HTTP 403" in err2 and "X-Scope-OrgID" in err2
    no_secret_in(out, err, out2, err2, all_files_text(tmp_path, token_file))


def test_basic_auth_from_a_password_file(prometheus_server: BackfilledPrometheus, pki: Pki, tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text(PASSWORD)
    argv = ["--prometheus-ca-file", str(pki.ca), "--prometheus-basic-auth-user", "reader",
            "--prometheus-basic-auth-password-file", str(password)]
    with auth_proxy(prometheus_server.url, pki, basic=("reader", PASSWORD)) as proxy:
        assert controller_source(proxy.url, argv, tmp_path).query("1").samples[0].value == 1.0
        password.write_text("wrong-password")
        with pytest.raises(SourceError) as err:
            controller_source(proxy.url, argv, tmp_path).query("1")
    assert "HTTP 401" in str(err.value)
    no_secret_in(str(err.value))

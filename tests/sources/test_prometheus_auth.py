"""PrometheusAuth: eager validation, flags and environment, file re-reading, SigV4 and Google signing.

No cloud is reachable: the SigV4 signature is checked against one computed here by the published
algorithm (AWS Signature Version 4) for fixed credentials and a fixed clock, and the Google path
with credentials whose token is already valid (no refresh call).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import hmac
import logging
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from pytest_httpserver import HTTPServer

from predictive_scaler.cli import main
from predictive_scaler.commands._flags import add_prometheus_auth_flags, prometheus_auth
from predictive_scaler.errors import ConfigError, SourceError
from predictive_scaler.sources.prometheus import PrometheusSource
from predictive_scaler.sources.prometheus_auth import (
    ENV_BEARER_TOKEN_FILE,
    ENV_HEADERS,
    ENV_INSECURE_SKIP_VERIFY,
    PrometheusAuth,
    PrometheusRequestAuth,
)

TOKEN = "tok-3f9a7c1e5b"
PASSWORD = "pw-8d2e6a4c0f"


def secret(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text + "\n")
    return path


def prepared(auth: PrometheusRequestAuth, url: str = "https://aps-workspaces.us-east-1.amazonaws.com/"
             "workspaces/ws-1/api/v1/query?query=up&time=1") -> requests.PreparedRequest:
    req = requests.Request("GET", url, headers={"X-Scope-OrgID": "team-a"}).prepare()
    result: requests.PreparedRequest = auth(req)
    return result


# -- validation ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "words"), [
    ({"bearer_token_file": "/nonexistent/token"}, ["--prometheus-bearer-token-file", "does not exist",
                                                   ENV_BEARER_TOKEN_FILE]),
    ({"basic_auth_user": "u"}, ["--prometheus-basic-auth-password-file"]),
    ({"cert_file": "CERT"}, ["--prometheus-key-file"]),
    ({"insecure_skip_verify": True, "ca_file": "CA"}, ["contradict", "--prometheus-ca-file"]),
    ({"bearer_token_file": "TOKEN", "basic_auth_user": "u", "basic_auth_password_file": "PW"},
     ["give one of them"]),
    ({"headers": (("Authorization", "Bearer x"),)}, ["--prometheus-header-file Authorization=PATH"]),
    ({"headers": (("bad name", "x"),)}, ["not an HTTP header name"]),
    ({"headers": (("X-Scope-OrgID", "a"), ("x-scope-orgid", "b"))}, ["given twice"]),
    ({"sigv4_region": "Frankfurt"}, ["not an AWS region", "us-east-1"]),
])
def test_bad_settings_are_refused_when_built_naming_the_flag(tmp_path: Path, kwargs: dict[str, Any],
                                                             words: list[str]) -> None:
    files = {"TOKEN": secret(tmp_path, "t", TOKEN), "PW": secret(tmp_path, "p", PASSWORD),
             "CERT": secret(tmp_path, "c", "x"), "CA": secret(tmp_path, "ca", "x")}
    kwargs = {k: files.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(ConfigError) as err:
        PrometheusAuth(**kwargs)
    for word in words:
        assert word in str(err.value)


def test_an_unreadable_file_is_refused_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = secret(tmp_path, "token", TOKEN)
    # As another user would find it (root, which runs CI's container, may read any file).
    monkeypatch.setattr("predictive_scaler.sources.prometheus_auth.os.access", lambda *_: False)
    with pytest.raises(ConfigError, match="cannot be read.*defaultMode"):
        PrometheusAuth(bearer_token_file=path)


def test_flags_override_the_environment_and_name_the_same_settings(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_prometheus_auth_flags(parser)
    token = secret(tmp_path, "token", TOKEN)
    env = {ENV_BEARER_TOKEN_FILE: str(token), ENV_HEADERS: "X-Scope-OrgID=team-a, X-Extra=1",
           ENV_INSECURE_SKIP_VERIFY: "false"}
    auth = prometheus_auth(parser.parse_args([]), env)
    assert auth.bearer_token_file == token and auth.headers == (("X-Scope-OrgID", "team-a"), ("X-Extra", "1"))
    auth = prometheus_auth(parser.parse_args(["--prometheus-header", "X-Scope-OrgID=team-b"]), env)
    assert auth.headers == (("X-Scope-OrgID", "team-b"),)
    with pytest.raises(ConfigError, match="NAME=VALUE"):
        prometheus_auth(parser.parse_args(["--prometheus-header", "novalue"]), {})
    with pytest.raises(ConfigError, match="not true or false"):
        PrometheusAuth.from_env({ENV_INSECURE_SKIP_VERIFY: "yes"})


# -- what is sent ---------------------------------------------------------------------------------
def test_a_rotated_token_and_header_file_are_re_read(tmp_path: Path) -> None:
    token = secret(tmp_path, "token", TOKEN)
    tenant = secret(tmp_path, "tenant", "team-a")
    auth = PrometheusAuth(bearer_token_file=token, header_files=(("X-Scope-OrgID", tenant),)).requests_auth()
    assert auth is not None
    req = prepared(auth)
    assert req.headers["Authorization"] == f"Bearer {TOKEN}" and req.headers["X-Scope-OrgID"] == "team-a"
    # The kubelet swaps a projected token's file; a new inode even with the same size and second.
    fresh = tmp_path / "token.new"
    fresh.write_text("tok-rotated-000\n")
    fresh.replace(token)
    assert prepared(auth).headers["Authorization"] == "Bearer tok-rotated-000"
    assert set(auth.secrets()) >= {"tok-rotated-000", "team-a"}


def test_basic_auth_password_comes_from_its_file(tmp_path: Path) -> None:
    auth = PrometheusAuth(basic_auth_user="reader", basic_auth_password_file=secret(tmp_path, "pw", PASSWORD))
    req = prepared(auth.requests_auth())  # type: ignore[arg-type]
    assert req.headers["Authorization"] == requests.auth._basic_auth_str("reader", PASSWORD)


def test_a_vanished_token_file_fails_the_query_naming_the_file(tmp_path: Path, httpserver: HTTPServer) -> None:
    token = secret(tmp_path, "token", TOKEN)
    source = PrometheusSource(httpserver.url_for("/"), auth=PrometheusAuth(bearer_token_file=token), retries=0)
    token.unlink()
    with pytest.raises(SourceError, match=f"cannot read the Prometheus credential file {token}.*still mounted"):
        source.query("up")


def test_both_paths_send_the_credentials_and_a_401_names_the_flags(tmp_path: Path, httpserver: HTTPServer) -> None:
    token = secret(tmp_path, "token", TOKEN)
    ok = {"status": "success", "data": {"resultType": "vector", "result": []}}
    okm = {"status": "success", "data": {"resultType": "matrix", "result": []}}
    want = {"Authorization": f"Bearer {TOKEN}", "X-Scope-OrgID": "team-a"}
    httpserver.expect_request("/api/v1/query", headers=want).respond_with_json(ok)
    httpserver.expect_request("/api/v1/query_range", headers=want).respond_with_json(okm)
    httpserver.expect_request("/api/v1/query").respond_with_data("no", status=401)
    auth = PrometheusAuth(bearer_token_file=token, headers=(("X-Scope-OrgID", "team-a"),))
    source = PrometheusSource(httpserver.url_for("/"), auth=auth, retries=0)
    assert source.query("up").samples == ()
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert source.range("up", now - dt.timedelta(hours=1), now, 60) == []
    assert source.check_connection(1.0) is None
    bare = PrometheusSource(httpserver.url_for("/"), retries=0)
    with pytest.raises(SourceError) as err:
        bare.query("up")
    assert "HTTP 401" in str(err.value) and "--prometheus-bearer-token-file" in str(err.value)
    assert "--prometheus-bearer-token-file" in (bare.check_connection(1.0) or "")


def test_insecure_skip_verify_is_warned_loudly(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        source = PrometheusSource("https://127.0.0.1:9", auth=PrometheusAuth(insecure_skip_verify=True))
    assert source.session.verify is False
    assert any("verification is OFF" in r.getMessage() for r in caplog.records)


# -- clouds -------------------------------------------------------------------------------------
class _Creds:
    access_key = "AKIDEXAMPLE"
    secret_key = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"  # noqa: S105 - AWS's documented example key
    token = "session-token-xyz"  # noqa: S105

    def get_frozen_credentials(self) -> _Creds:
        return self


def _sigv4_by_hand(url: str, headers: dict[str, str], when: dt.datetime, region: str) -> str:
    """The signature, per AWS's published Signature Version 4 steps, of a GET with an empty body."""
    parts = urlsplit(url)
    amz_date = when.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    signed = {k.lower(): v.strip() for k, v in headers.items()}
    names = ";".join(sorted(signed))
    query = "&".join(sorted(parts.query.split("&")))
    canonical = "\n".join(["GET", parts.path, query, *(f"{k}:{signed[k]}" for k in sorted(signed)), "", names,
                           hashlib.sha256(b"").hexdigest()])
    scope = f"{day}/{region}/aps/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + _Creds.secret_key).encode()
    for part in (day, region, "aps", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def test_sigv4_signs_with_the_expected_signature_for_a_fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    when = dt.datetime(2026, 3, 1, 12, 0, 0)
    monkeypatch.setattr("botocore.auth.get_current_datetime", lambda: when)
    auth = PrometheusRequestAuth(PrometheusAuth(sigv4_region="us-east-1"), aws_credentials=_Creds())
    req = prepared(auth)
    header = req.headers["Authorization"]
    assert header.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260301/us-east-1/aps/aws4_request, ")
    assert req.headers["X-Amz-Date"] == "20260301T120000Z"
    assert req.headers["X-Amz-Security-Token"] == _Creds.token
    names = header.split("SignedHeaders=")[1].split(",")[0]
    assert names == "host;x-amz-date;x-amz-security-token;x-scope-orgid"  # the tenant header is signed too
    signed = {"host": "aps-workspaces.us-east-1.amazonaws.com", "x-amz-date": "20260301T120000Z",
              "x-amz-security-token": _Creds.token, "x-scope-orgid": "team-a"}
    assert header.endswith("Signature=" + _sigv4_by_hand(req.url or "", signed, when, "us-east-1"))


def test_google_auth_adds_a_bearer_token() -> None:
    from google.oauth2.credentials import Credentials

    creds = Credentials(token="ya29.fixed-token", expiry=dt.datetime.now(dt.UTC).replace(tzinfo=None)
                        + dt.timedelta(hours=1))
    auth = PrometheusRequestAuth(PrometheusAuth(google_auth=True), google_credentials=creds)
    assert prepared(auth, "https://monitoring.googleapis.com/v1/projects/p/location/global/prometheus/api/v1/"
                    "query?query=up").headers["Authorization"] == "Bearer ya29.fixed-token"


@pytest.mark.parametrize(("module", "flag", "extra"), [
    ("botocore", ["--prometheus-sigv4-region", "eu-west-1"], "aws"),
    ("google", ["--prometheus-google-auth"], "gcp"),
])
def test_a_missing_cloud_library_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str], module: str, flag: list[str],
                                                 extra: str) -> None:
    for name in list(sys.modules):
        if name == module or name.startswith(module + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)  # import fails as when it is not installed
    (tmp_path / "s.yaml").write_text("apiVersion: predictive-scaler.io/v1alpha1\nkind: PredictiveScaler\n"
                                     "metadata: {name: a, namespace: ml}\nspec: {target: {name: a}, demand: "
                                     "{query: 'sum(rate(x[1m]))'}, capacity: {requestsPerReplica: 1}}\n")
    code = main(["retrain", "--config", str(tmp_path / "s.yaml"), "--prometheus", "https://127.0.0.1:9",
                 "--store", str(tmp_path / "store"), *flag])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"pip install 'predictive-scaler[{extra}]'" in err and flag[0] in err

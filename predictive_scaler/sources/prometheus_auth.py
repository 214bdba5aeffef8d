"""How to authenticate to a Prometheus that is not open: one frozen settings type, read from flags and env.

A managed or multi-tenant Prometheus (Amazon Managed Prometheus, Google Managed Prometheus, Mimir,
Cortex, Thanos behind an auth proxy) wants one or more of: a bearer token, basic auth, a private CA,
a client certificate (mTLS), a tenant header, or a request signature. :class:`PrometheusAuth` holds
them, checked when it is built (a file that cannot be read fails at start, not at the first query);
:meth:`PrometheusAuth.requests_auth` turns them into a ``requests`` auth that
:class:`~predictive_scaler.sources.prometheus.PrometheusSource` hands to prometheus-api-client and to
its own raw requests alike.

Secrets live in files, never in flags or environment values (which ``ps`` and pod specs show): the
token, the password and secret header values are read from files, and re-read when a file changes —
a projected ServiceAccount token is rotated in place by the kubelet. No secret is ever logged:
:meth:`PrometheusAuth.secrets` lists what :meth:`PrometheusSource.hide_secrets` blanks from
messages that quote a server's answer.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from requests.auth import AuthBase

from predictive_scaler.errors import ConfigError, SourceError

log = logging.getLogger(__name__)

_ENV = "PREDICTIVE_SCALER_PROMETHEUS_"
#: Environment variable of each setting; the flag is ``--prometheus-`` + the same words.
ENV_BEARER_TOKEN_FILE = _ENV + "BEARER_TOKEN_FILE"
ENV_BASIC_AUTH_USER = _ENV + "BASIC_AUTH_USER"
ENV_BASIC_AUTH_PASSWORD_FILE = _ENV + "BASIC_AUTH_PASSWORD_FILE"
ENV_CA_FILE = _ENV + "CA_FILE"
ENV_CERT_FILE = _ENV + "CERT_FILE"
ENV_KEY_FILE = _ENV + "KEY_FILE"
ENV_INSECURE_SKIP_VERIFY = _ENV + "INSECURE_SKIP_VERIFY"
#: ``NAME=VALUE`` pairs, one per line (or separated by commas).
ENV_HEADERS = _ENV + "HEADERS"
#: ``NAME=PATH`` pairs, one per line (or separated by commas): the value is the file's content.
ENV_HEADER_FILES = _ENV + "HEADER_FILES"
ENV_SIGV4_REGION = _ENV + "SIGV4_REGION"
ENV_GOOGLE_AUTH = _ENV + "GOOGLE_AUTH"

#: The flag that sets each field, for messages (every command spells them the same).
FLAGS = {
    "bearer_token_file": "--prometheus-bearer-token-file", "basic_auth_user": "--prometheus-basic-auth-user",
    "basic_auth_password_file": "--prometheus-basic-auth-password-file", "ca_file": "--prometheus-ca-file",
    "cert_file": "--prometheus-cert-file", "key_file": "--prometheus-key-file",
    "insecure_skip_verify": "--prometheus-insecure-skip-verify", "headers": "--prometheus-header",
    "header_files": "--prometheus-header-file", "sigv4_region": "--prometheus-sigv4-region",
    "google_auth": "--prometheus-google-auth",
}
ENVS = {
    "bearer_token_file": ENV_BEARER_TOKEN_FILE, "basic_auth_user": ENV_BASIC_AUTH_USER,
    "basic_auth_password_file": ENV_BASIC_AUTH_PASSWORD_FILE, "ca_file": ENV_CA_FILE, "cert_file": ENV_CERT_FILE,
    "key_file": ENV_KEY_FILE, "insecure_skip_verify": ENV_INSECURE_SKIP_VERIFY, "headers": ENV_HEADERS,
    "header_files": ENV_HEADER_FILES, "sigv4_region": ENV_SIGV4_REGION, "google_auth": ENV_GOOGLE_AUTH,
}

#: What to set when Prometheus refuses who is asking (401) — said by the source's error.
CREDENTIAL_HINT = (f"{FLAGS['bearer_token_file']} FILE, {FLAGS['basic_auth_user']} USER with "
                   f"{FLAGS['basic_auth_password_file']} FILE, {FLAGS['sigv4_region']} REGION or "
                   f"{FLAGS['google_auth']} (or {ENV_BEARER_TOKEN_FILE} … in the environment)")

#: OAuth scope of Google Managed Prometheus's query API (read-only monitoring).
GOOGLE_SCOPES = ("https://www.googleapis.com/auth/monitoring.read",)
#: AWS service name Amazon Managed Prometheus signs requests for.
SIGV4_SERVICE = "aps"

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)
#: Headers set here by other means: a plain --prometheus-header would put a secret on the command line.
_RESERVED = {"authorization": "use --prometheus-bearer-token-file, or --prometheus-header-file Authorization=PATH",
             "host": "give the host in the URL"}


@dataclass(frozen=True)
class PrometheusAuth:
    """Credentials and TLS settings for Prometheus; all optional (an open Prometheus needs none).

    - ``bearer_token_file``: ``Authorization: Bearer <content>``, re-read when the file changes.
    - ``basic_auth_user`` + ``basic_auth_password_file``: HTTP basic auth (the password re-read on change).
    - ``ca_file``: PEM bundle that signed Prometheus's certificate (instead of the system's CAs).
    - ``cert_file`` + ``key_file``: a client certificate (mTLS).
    - ``insecure_skip_verify``: do not verify Prometheus's certificate at all (warned at every start).
    - ``headers``: ``(name, value)`` sent with every request (e.g. ``X-Scope-OrgID`` of a Mimir tenant).
    - ``header_files``: ``(name, path)``: the value is the file's content (for secret header values).
    - ``sigv4_region``: sign every request with AWS SigV4 for Amazon Managed Prometheus in that region
      (credentials from botocore's default chain: env, IRSA, instance profile); needs the ``aws`` extra.
    - ``google_auth``: Google Application Default Credentials (workload identity) for Google Managed
      Prometheus; needs the ``gcp`` extra.
    """

    bearer_token_file: Path | None = None
    basic_auth_user: str | None = None
    basic_auth_password_file: Path | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure_skip_verify: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    header_files: tuple[tuple[str, Path], ...] = ()
    sigv4_region: str | None = None
    google_auth: bool = False

    def __post_init__(self) -> None:
        for name in ("bearer_token_file", "basic_auth_password_file", "ca_file", "cert_file", "key_file"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _readable(Path(value), name))
        object.__setattr__(self, "headers", tuple((str(k), str(v)) for k, v in self.headers))
        object.__setattr__(self, "header_files",
                           tuple((str(k), _readable(Path(p), "header_files")) for k, p in self.header_files))
        for name, value in self.headers:
            _check_header_name(name, "headers")
            if name.lower() in _RESERVED:
                raise ConfigError(f"{FLAGS['headers']} {name}=…: {name} is not set this way; {_RESERVED[name.lower()]}",
                                  field="prometheusHeaders")
            if "\n" in value or "\r" in value:
                raise ConfigError(f"{FLAGS['headers']} {name}=…: the value holds a line break; give one line",
                                  field="prometheusHeaders")
        for name, _ in self.header_files:
            _check_header_name(name, "header_files")
        seen = [n.lower() for n, _ in (*self.headers, *self.header_files)]
        if len(seen) != len(set(seen)):
            dup = next(n for n in seen if seen.count(n) > 1)
            raise ConfigError(f"header {dup!r} is given twice ({FLAGS['headers']} / {FLAGS['header_files']}); "
                              "give it once", field="prometheusHeaders")
        schemes = [FLAGS[n] for n, on in (("bearer_token_file", self.bearer_token_file is not None),
                                          ("basic_auth_user", self.basic_auth_user is not None),
                                          ("sigv4_region", self.sigv4_region is not None),
                                          ("google_auth", self.google_auth)) if on]
        if any(n.lower() == "authorization" for n, _ in self.header_files):
            schemes.append(f"{FLAGS['header_files']} Authorization=…")
        if len(schemes) > 1:
            raise ConfigError(f"{' and '.join(schemes)} each set the Authorization header; give one of them",
                              field="prometheusAuth")
        if (self.basic_auth_user is None) != (self.basic_auth_password_file is None):
            raise ConfigError(f"basic auth needs both {FLAGS['basic_auth_user']} and "
                              f"{FLAGS['basic_auth_password_file']} ({ENV_BASIC_AUTH_USER}, "
                              f"{ENV_BASIC_AUTH_PASSWORD_FILE})", field="prometheusBasicAuth")
        if self.basic_auth_user is not None and (not self.basic_auth_user or ":" in self.basic_auth_user):
            raise ConfigError(f"{FLAGS['basic_auth_user']} {self.basic_auth_user!r} must be a non-empty user name "
                              "without ':'", field="prometheusBasicAuth")
        if (self.cert_file is None) != (self.key_file is None):
            raise ConfigError(f"a client certificate needs both {FLAGS['cert_file']} and {FLAGS['key_file']} "
                              f"({ENV_CERT_FILE}, {ENV_KEY_FILE})", field="prometheusTls")
        if self.insecure_skip_verify and self.ca_file is not None:
            raise ConfigError(f"{FLAGS['insecure_skip_verify']} and {FLAGS['ca_file']} contradict each other; "
                              f"keep {FLAGS['ca_file']} (verification with your CA)", field="prometheusTls")
        if self.sigv4_region is not None and not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d+", self.sigv4_region):
            raise ConfigError(f"{FLAGS['sigv4_region']} {self.sigv4_region!r} is not an AWS region; give e.g. "
                              "us-east-1 (the workspace's region)", field="prometheusSigv4Region")

    @property
    def enabled(self) -> bool:
        return self != PrometheusAuth()

    @property
    def verify(self) -> bool | str:
        """``requests``' ``verify``: the CA bundle, False when verification is off, else True."""
        if self.insecure_skip_verify:
            return False
        return str(self.ca_file) if self.ca_file is not None else True

    @property
    def cert(self) -> tuple[str, str] | None:
        """``requests``' ``cert``: the client certificate and key, or None."""
        return (str(self.cert_file), str(self.key_file)) if self.cert_file and self.key_file else None

    def describe(self) -> str:
        """What is used, for the start-up log: names of files and headers, never their content."""
        parts = []
        if self.bearer_token_file:
            parts.append(f"bearer token from {self.bearer_token_file}")
        if self.basic_auth_user:
            parts.append(f"basic auth as {self.basic_auth_user!r}")
        if self.sigv4_region:
            parts.append(f"AWS SigV4 ({self.sigv4_region})")
        if self.google_auth:
            parts.append("Google default credentials")
        if self.ca_file:
            parts.append(f"CA {self.ca_file}")
        if self.cert_file:
            parts.append(f"client certificate {self.cert_file}")
        if self.insecure_skip_verify:
            parts.append("certificate NOT verified")
        names = [n for n, _ in self.headers] + [n for n, _ in self.header_files]
        if names:
            parts.append("headers " + ", ".join(names))
        return "; ".join(parts) or "none"

    def requests_auth(self) -> PrometheusRequestAuth | None:
        """A ``requests`` auth applying these settings to each request (None when there is nothing to add)."""
        if self.insecure_skip_verify:
            log.warning("Prometheus TLS certificate verification is OFF (%s): anyone between here and Prometheus "
                        "can read and forge every answer; give %s instead", FLAGS["insecure_skip_verify"],
                        FLAGS["ca_file"])
        dynamic = (self.bearer_token_file, self.basic_auth_user, self.header_files, self.sigv4_region,
                   self.google_auth, self.headers)
        return PrometheusRequestAuth(self) if any(dynamic) else None

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> PrometheusAuth:
        """Settings from ``PREDICTIVE_SCALER_PROMETHEUS_*`` variables, then ``overrides`` (flags; None or
        empty = not given)."""
        values: dict[str, Any] = {}
        for name, env in ENVS.items():
            text = environ.get(env, "").strip()
            if not text:
                continue
            if name in ("insecure_skip_verify", "google_auth"):
                if text.lower() not in ("true", "false"):
                    raise ConfigError(f"{env}={text!r} is not true or false", field=env)
                values[name] = text.lower() == "true"
            elif name in ("headers", "header_files"):
                values[name] = parse_pairs(re.split(r"[,\n]", text), env)
            else:
                values[name] = text
        values.update({k: v for k, v in overrides.items() if v is not None and v != () and v is not False})
        return cls(**values)


def parse_pairs(items: Iterable[str], where: str) -> tuple[tuple[str, str], ...]:
    """``NAME=VALUE`` items as pairs; ConfigError naming ``where`` (the flag or variable) otherwise."""
    pairs = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            # The value may be a secret: only the name is shown.
            raise ConfigError(f"{where} {name.strip()[:40]!r}…: write NAME=VALUE, e.g. X-Scope-OrgID=team-a",
                              field=where)
        pairs.append((name.strip(), value.strip()))
    return tuple(pairs)


class PrometheusRequestAuth(AuthBase):
    """Adds the credentials to each request, re-reading a secret file whenever it changed (by its
    modification time, size and inode: the kubelet swaps a projected token's symlink)."""

    def __init__(self, auth: PrometheusAuth, *, aws_credentials: Any = None, google_credentials: Any = None) -> None:
        self.auth = auth
        self._lock = threading.Lock()
        self._files: dict[Path, tuple[tuple[int, int, int], str]] = {}
        self._signer: Callable[[requests.PreparedRequest], None] | None = None
        if auth.sigv4_region is not None:
            self._signer = _sigv4_signer(auth.sigv4_region, aws_credentials)
        elif auth.google_auth:
            self._signer = _google_signer(google_credentials)

    def secrets(self) -> tuple[str, ...]:
        """The secret values read so far (token, password, header files), longest first."""
        with self._lock:
            found = {v for _, v in self._files.values() if len(v) >= 3}
        return tuple(sorted(found, key=len, reverse=True))

    def read(self, path: Path) -> str:
        """The file's content, stripped of surrounding whitespace; cached until it changes."""
        try:
            st = os.stat(path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            with self._lock:
                kept = self._files.get(path)
            if kept is not None and kept[0] == stamp:
                return kept[1]
            text = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise SourceError(f"cannot read the Prometheus credential file {path} "
                              f"({type(exc).__name__}: {getattr(exc, 'strerror', None) or 'unreadable'}); check "
                              "that the Secret or projected token is still mounted there") from exc
        if not text:
            raise SourceError(f"the Prometheus credential file {path} is empty; check the Secret it is mounted from")
        with self._lock:
            if kept is not None:
                log.info("Prometheus credential file %s changed: re-read", path)
            self._files[path] = (stamp, text)
        return text

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        a = self.auth
        for name, value in a.headers:
            r.headers[name] = value
        for name, path in a.header_files:
            r.headers[name] = self.read(path)
        if a.bearer_token_file is not None:
            r.headers["Authorization"] = f"Bearer {self.read(a.bearer_token_file)}"
        elif a.basic_auth_user is not None and a.basic_auth_password_file is not None:
            basic = requests.auth.HTTPBasicAuth(a.basic_auth_user, self.read(a.basic_auth_password_file))
            r = basic(r)
        if self._signer is not None:
            self._signer(r)  # last: the signature covers the headers set above
        return r


def missing_extra(flag: str, extra: str, package: str) -> ConfigError:
    return ConfigError(f"{flag} needs {package}, which is not installed: pip install 'predictive-scaler[{extra}]'",
                       field=flag)


def _sigv4_signer(region: str, credentials: Any) -> Callable[[requests.PreparedRequest], None]:
    """Signs a prepared request with AWS SigV4 for Amazon Managed Prometheus (service ``aps``)."""
    try:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.exceptions import BotoCoreError
        from botocore.session import get_session
    except ImportError as exc:
        raise missing_extra(FLAGS["sigv4_region"], "aws", "botocore") from exc
    if credentials is None:
        try:
            credentials = get_session().get_credentials()
        except BotoCoreError as exc:
            raise ConfigError(f"{FLAGS['sigv4_region']}: AWS credentials could not be loaded ({type(exc).__name__}); "
                              "set AWS_* variables, IRSA or an instance profile", field="prometheusSigv4Region") from exc
    if credentials is None:
        raise ConfigError(f"{FLAGS['sigv4_region']}: no AWS credentials found (botocore's default chain: "
                          "AWS_ACCESS_KEY_ID…, AWS_WEB_IDENTITY_TOKEN_FILE (IRSA), an instance profile); give "
                          "the pod an IAM role allowed aps:QueryMetrics", field="prometheusSigv4Region")

    def sign(r: requests.PreparedRequest) -> None:
        frozen = credentials.get_frozen_credentials() if hasattr(credentials, "get_frozen_credentials") else credentials
        body = r.body if r.body is not None else b""
        headers = {k: v for k, v in r.headers.items() if k.lower() not in ("authorization", "connection",
                                                                            "user-agent", "accept-encoding")}
        aws = AWSRequest(method=r.method, url=r.url, data=body, headers=headers)
        SigV4Auth(frozen, SIGV4_SERVICE, region).add_auth(aws)
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token", "X-Amz-Content-SHA256"):
            if name in aws.headers:
                r.headers[name] = aws.headers[name]

    return sign


def _google_signer(credentials: Any) -> Callable[[requests.PreparedRequest], None]:
    """Adds a Google OAuth access token (refreshed before it expires) for Google Managed Prometheus."""
    try:
        import google.auth
        import google.auth.exceptions
        from google.auth.transport.requests import Request
    except ImportError as exc:
        raise missing_extra(FLAGS["google_auth"], "gcp", "google-auth") from exc
    if credentials is None:
        try:
            credentials, _ = google.auth.default(scopes=list(GOOGLE_SCOPES))
        except google.auth.exceptions.DefaultCredentialsError as exc:
            raise ConfigError(f"{FLAGS['google_auth']}: no Google Application Default Credentials found; use "
                              "Workload Identity or set GOOGLE_APPLICATION_CREDENTIALS",
                              field="prometheusGoogleAuth") from exc
    lock = threading.Lock()
    transport = Request()

    def sign(r: requests.PreparedRequest) -> None:
        headers: dict[str, str] = {}
        try:
            with lock:
                credentials.before_request(transport, r.method, r.url, headers)
        except google.auth.exceptions.GoogleAuthError as exc:
            raise SourceError(f"Google credentials could not be refreshed ({type(exc).__name__}); check the "
                              "workload identity's binding (roles/monitoring.viewer)") from exc
        for name, value in headers.items():
            r.headers[name] = value

    return sign


def _readable(path: Path, name: str) -> Path:
    """``path`` when it is a readable file, else ConfigError naming the flag and variable."""
    flag, env = FLAGS[name], ENVS[name]
    if not path.is_file():
        what = "does not exist" if not path.exists() else "is not a file"
        raise ConfigError(f"{flag} {path} {what}; give the path of the mounted file ({env})",
                          field=name)
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{flag} {path} cannot be read by this process (uid {os.getuid()}); fix its "
                          "permissions (a Secret volume's defaultMode) or run as its owner", field=name)
    return path


def _check_header_name(name: str, field_name: str) -> None:
    if not _TOKEN.match(name):
        raise ConfigError(f"{FLAGS[field_name]}: {name[:40]!r} is not an HTTP header name; e.g. X-Scope-OrgID",
                          field="prometheusHeaders")


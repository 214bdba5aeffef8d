"""Controller settings: one frozen type, documented defaults, eager validation.

Defaults come from the environment the Deployment sets (``deploy/base/configmap.yaml``:
``PREDICTIVE_SCALER_*``) and can be overridden by the command's flags. Every
problem raises :class:`ConfigError` naming the setting and what to write instead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from predictive_scaler.errors import ConfigError
from predictive_scaler.forecasting.store import is_object_store_url
from predictive_scaler.sources.prometheus import redact_url
from predictive_scaler.sources.prometheus_auth import PrometheusAuth

ENV_PREFIX = "PREDICTIVE_SCALER_"
#: Environment variables read by :meth:`ControllerSettings.from_env` (configmap names).
ENV_PROMETHEUS_URL = ENV_PREFIX + "PROMETHEUS_URL"
ENV_MODEL_STORE = ENV_PREFIX + "MODEL_STORE"
ENV_INTERVAL = ENV_PREFIX + "RECONCILE_INTERVAL_SECONDS"
ENV_BUDGET_GPUS = ENV_PREFIX + "CLUSTER_BUDGET_GPUS"
ENV_BUDGET_COST = ENV_PREFIX + "CLUSTER_BUDGET_COST_PER_HOUR"
ENV_KEDA_PORT = ENV_PREFIX + "KEDA_PORT"
#: Port of KEDA's external scaler gRPC API (mode keda); "off" in the environment disables it.
DEFAULT_KEDA_PORT = 6000
#: TLS on the KEDA port (keda/tls.py): PEM files; the client CA turns on mTLS.
ENV_KEDA_TLS_CERT = ENV_PREFIX + "KEDA_TLS_CERT"
ENV_KEDA_TLS_KEY = ENV_PREFIX + "KEDA_TLS_KEY"
ENV_KEDA_TLS_CLIENT_CA = ENV_PREFIX + "KEDA_TLS_CLIENT_CA"
#: Serve only KEDA's API, from the scalers' status (a second replica for KEDA while the controller restarts).
ENV_KEDA_ONLY = ENV_PREFIX + "KEDA_ONLY"
ENV_LIVENESS_TIMEOUT = ENV_PREFIX + "LIVENESS_TIMEOUT"
ENV_READINESS_TIMEOUT = ENV_PREFIX + "READINESS_TIMEOUT"
#: Sharding (controller/shards.py): the replica count; the index is the StatefulSet ordinal of $HOSTNAME.
ENV_SHARD_COUNT = ENV_PREFIX + "SHARD_COUNT"
ENV_SHARD_INDEX = ENV_PREFIX + "SHARD_INDEX"
#: FinOps (docs/finops.md): the namespace label whose value is the ``team`` label of the cost metrics.
ENV_TEAM_LABEL = ENV_PREFIX + "TEAM_LABEL"
#: A label key: an optional DNS-subdomain prefix and "/", then a name of at most 63 characters.
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class ClusterBudgetLimits:
    """Cluster-wide bound on speculative capacity, summed over every PredictiveScaler.

    Per-scaler budgets add up without limit, so the operator caps the sum:
    ``max_gpus`` speculative GPUs and/or ``max_cost_per_hour`` (each scaler's
    cost uses its own ``pricePerGpuHour``). None = no cluster cap on that axis.
    """

    max_gpus: int | None = None
    max_cost_per_hour: float | None = None

    def __post_init__(self) -> None:
        if self.max_gpus is not None and (isinstance(self.max_gpus, bool) or not isinstance(self.max_gpus, int)
                                          or self.max_gpus < 0):
            raise ConfigError(f"cluster budget GPUs must be a whole number ≥ 0, got {self.max_gpus!r}; "
                              f"set {ENV_BUDGET_GPUS} (empty for no cap)", field="clusterBudgetGpus")
        if self.max_cost_per_hour is not None and not (
                isinstance(self.max_cost_per_hour, int | float) and math.isfinite(self.max_cost_per_hour)
                and self.max_cost_per_hour >= 0):
            raise ConfigError(f"cluster budget cost per hour must be a finite number ≥ 0, got "
                              f"{self.max_cost_per_hour!r}; set {ENV_BUDGET_COST} (empty for no cap)",
                              field="clusterBudgetCostPerHour")

    @property
    def unlimited(self) -> bool:
        return self.max_gpus is None and self.max_cost_per_hour is None


@dataclass(frozen=True)
class ControllerSettings:
    """Everything one controller process needs.

    - ``prometheus_url``: where demand and DCGM metrics are queried (required).
    - ``model_store``: the model store directory (the read-only PVC mount).
    - ``namespace``: watch one namespace; None watches the whole cluster.
    - ``interval_seconds``: time between two reconciles of one scaler. Default 60.
    - ``dry_run``: every write is sent with ``dryRun=All`` (validated, never persisted).
    - ``metrics_port`` / ``health_port``: ``/metrics``, ``/healthz`` and ``/readyz``; the same
      port serves all three when ``health_port`` is None. Default 8080.
    - ``kubeconfig``: a kubeconfig file; None uses the in-cluster ServiceAccount.
    - ``cluster_budget``: the cluster-wide speculative cap (see :class:`ClusterBudgetLimits`).
    - ``prometheus_timeout_seconds``: one Prometheus HTTP call. Default 10.
    - ``prometheus_auth``: credentials, CA, client certificate and headers for Prometheus
      (``PREDICTIVE_SCALER_PROMETHEUS_*_FILE`` …, see :class:`PrometheusAuth`). Default: none.
    - ``liveness_timeout_seconds`` (``PREDICTIVE_SCALER_LIVENESS_TIMEOUT``): /healthz fails once
      the reconcile loop has not run for this long — a reconcile running longer, or none
      returning while scalers exist (a wedged process must restart). Default 5 × interval.
    - ``readiness_timeout_seconds`` (``PREDICTIVE_SCALER_READINESS_TIMEOUT``): /readyz fails once
      the API server or Prometheus has been unreachable for longer than this. Default 60.
    - ``keda_port``: KEDA's external scaler gRPC API (scalers in mode keda); None: not served.
      Default 6000 (``PREDICTIVE_SCALER_KEDA_PORT``, ``off`` to disable).
    - ``keda_tls_cert`` / ``keda_tls_key`` / ``keda_tls_client_ca`` (``PREDICTIVE_SCALER_KEDA_TLS_*``): PEM
      files for TLS on that port; with the client CA, clients must present a certificate it signed.
    - ``keda_only`` (``PREDICTIVE_SCALER_KEDA_ONLY``): serve KEDA's API only, answering from the scalers'
      status; no reconcile (see docs/keda.md, high availability).
    - ``shard_count`` / ``shard_index`` (``PREDICTIVE_SCALER_SHARD_COUNT``; the index from
      ``PREDICTIVE_SCALER_SHARD_INDEX`` or the StatefulSet ordinal ending ``$HOSTNAME``): this replica
      reconciles only its shard of the scalers, fenced by a Lease (controller/shards.py). Default 1 / 0.
    - ``team_label`` (``--team-label``, ``PREDICTIVE_SCALER_TEAM_LABEL``): the namespace label whose value
      becomes the ``team`` label of the FinOps metrics (the namespace is read at most once per 10 minutes;
      needs ``get`` on namespaces). None: ``team`` is empty.
    """

    prometheus_url: str
    model_store: Path | str
    namespace: str | None = None
    interval_seconds: float = 60.0
    dry_run: bool = False
    metrics_port: int = 8080
    health_port: int | None = None
    metrics_host: str = "0.0.0.0"  # noqa: S104 — a pod's port is only reachable through its NetworkPolicy
    kubeconfig: str | None = None
    cluster_budget: ClusterBudgetLimits = ClusterBudgetLimits()
    prometheus_timeout_seconds: float = 10.0
    prometheus_auth: PrometheusAuth = PrometheusAuth()
    liveness_timeout_seconds: float | None = None
    readiness_timeout_seconds: float = 60.0
    keda_port: int | None = DEFAULT_KEDA_PORT
    keda_tls_cert: str | None = None
    keda_tls_key: str | None = None
    keda_tls_client_ca: str | None = None
    keda_only: bool = False
    shard_count: int = 1
    shard_index: int = 0
    team_label: str | None = None

    def __post_init__(self) -> None:
        if (isinstance(self.shard_count, bool) or not isinstance(self.shard_count, int) or self.shard_count < 1
                or not isinstance(self.shard_index, int) or not 0 <= self.shard_index < self.shard_count):
            raise ConfigError(f"shard {self.shard_index!r} of {self.shard_count!r}: the count must be a whole number "
                              f"≥ 1 and the index in 0..count-1; set {ENV_SHARD_COUNT} to the StatefulSet's replicas",
                              field="shardCount")
        if not isinstance(self.prometheus_url, str) or not self.prometheus_url.startswith(("http://", "https://")):
            raise ConfigError(f"Prometheus URL {redact_url(str(self.prometheus_url))!r} must start with http:// or "
                              "https://, e.g. "
                              "http://prometheus-operated.monitoring.svc:9090; pass --prometheus-url",
                              field="prometheusUrl")
        if not is_object_store_url(self.model_store):  # an s3:// URL stays text: a Path would fold its "//"
            object.__setattr__(self, "model_store", Path(self.model_store))
        if not (isinstance(self.interval_seconds, int | float) and math.isfinite(self.interval_seconds)
                and 5 <= self.interval_seconds <= 600):
            raise ConfigError(f"reconcile interval {self.interval_seconds!r} s is outside 5–600 s; the default "
                              "is 60", field="interval")
        self._check_serving()
        if self.namespace is not None and not self.namespace.strip():
            raise ConfigError("namespace is empty; omit --namespace to watch every namespace", field="namespace")
        _check_team_label(self.team_label)
        if not (self.prometheus_timeout_seconds > 0 and math.isfinite(self.prometheus_timeout_seconds)):
            raise ConfigError("Prometheus timeout must be a positive number of seconds",
                              field="prometheusTimeout")
        if self.liveness_timeout_seconds is None:
            object.__setattr__(self, "liveness_timeout_seconds", 5.0 * float(self.interval_seconds))
        for name, env in (("liveness_timeout_seconds", ENV_LIVENESS_TIMEOUT),
                          ("readiness_timeout_seconds", ENV_READINESS_TIMEOUT)):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int | float) and math.isfinite(value)
                                               and 1 <= value <= 86400):
                raise ConfigError(f"{env}={value!r} is not a number of seconds in 1–86400; e.g. 300 for "
                                  "liveness, 60 for readiness", field=env)

    def _check_serving(self) -> None:
        """The ports the process listens on, and KEDA's TLS."""
        for name in ("metrics_port", "health_port", "keda_port"):
            port = getattr(self, name)
            if port is None and name in ("health_port", "keda_port"):
                continue
            if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
                raise ConfigError(f"{name.replace('_', '-')} {port!r} is not a TCP port (0–65535; 0 picks a "
                                  "free one)", field=name)
        if bool(self.keda_tls_cert) != bool(self.keda_tls_key) or (self.keda_tls_client_ca and not self.keda_tls_cert):
            raise ConfigError(f"KEDA TLS needs a certificate and its key ({ENV_KEDA_TLS_CERT}, {ENV_KEDA_TLS_KEY}); "
                              f"{ENV_KEDA_TLS_CLIENT_CA} (mTLS) needs both too", field="kedaTls")
        if self.keda_only and self.keda_port is None:
            raise ConfigError(f"{ENV_KEDA_ONLY} serves only KEDA's API, but {ENV_KEDA_PORT} is off", field=ENV_KEDA_ONLY)

    @property
    def probe_interval_seconds(self) -> float:
        """How often /readyz's dependency probes run: often enough to notice within the timeout."""
        return max(0.2, min(5.0, self.readiness_timeout_seconds / 3))

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: object) -> ControllerSettings:
        """Settings from ``PREDICTIVE_SCALER_*`` variables, then ``overrides`` (flags; None = not given)."""
        values: dict[str, object] = {}
        if environ.get(ENV_PROMETHEUS_URL):
            values["prometheus_url"] = environ[ENV_PROMETHEUS_URL]
        if environ.get(ENV_MODEL_STORE):
            values["model_store"] = environ[ENV_MODEL_STORE]
        if environ.get(ENV_INTERVAL):
            values["interval_seconds"] = _number(environ[ENV_INTERVAL], ENV_INTERVAL)
        gpus = _optional(environ.get(ENV_BUDGET_GPUS), ENV_BUDGET_GPUS, whole=True)
        cost = _optional(environ.get(ENV_BUDGET_COST), ENV_BUDGET_COST, whole=False)
        budget = ClusterBudgetLimits(max_gpus=None if gpus is None else int(gpus), max_cost_per_hour=cost)
        values["cluster_budget"] = budget
        keda = environ.get(ENV_KEDA_PORT, "").strip()
        if keda:
            values["keda_port"] = None if keda.lower() == "off" else _port(keda, ENV_KEDA_PORT)
        for env, key in ((ENV_KEDA_TLS_CERT, "keda_tls_cert"), (ENV_KEDA_TLS_KEY, "keda_tls_key"),
                         (ENV_KEDA_TLS_CLIENT_CA, "keda_tls_client_ca"), (ENV_TEAM_LABEL, "team_label")):
            if environ.get(env, "").strip():
                values[key] = environ[env].strip()
        only = environ.get(ENV_KEDA_ONLY, "").strip().lower()
        if only:
            if only not in ("true", "false"):
                raise ConfigError(f"{ENV_KEDA_ONLY}={only!r} is not true or false", field=ENV_KEDA_ONLY)
            values["keda_only"] = only == "true"
        if environ.get(ENV_SHARD_COUNT, "").strip():
            count = _number(environ[ENV_SHARD_COUNT].strip(), ENV_SHARD_COUNT)
            values["shard_count"] = int(count) if count.is_integer() else count
            index = environ.get(ENV_SHARD_INDEX, "").strip() or environ.get("HOSTNAME", "").rpartition("-")[2]
            if not index.isdigit():
                raise ConfigError(f"{ENV_SHARD_COUNT} is set but this replica has no shard index: set "
                                  f"{ENV_SHARD_INDEX}, or run it in a StatefulSet (its pod name ends in the "
                                  "ordinal)", field=ENV_SHARD_INDEX)
            values["shard_index"] = int(index)
        for env, key in ((ENV_LIVENESS_TIMEOUT, "liveness_timeout_seconds"),
                         (ENV_READINESS_TIMEOUT, "readiness_timeout_seconds")):
            if environ.get(env, "").strip():
                values[key] = _number(environ[env].strip(), env)
        values.update({k: v for k, v in overrides.items() if v is not None})
        # From the environment unless given: the flags' PrometheusAuth already holds the environment's.
        values.setdefault("prometheus_auth", PrometheusAuth.from_env(environ))
        if "prometheus_url" not in values:
            raise ConfigError(f"no Prometheus URL: pass --prometheus-url or set {ENV_PROMETHEUS_URL}",
                              field="prometheusUrl")
        if "model_store" not in values:
            raise ConfigError(f"no model store: pass --model-store or set {ENV_MODEL_STORE}", field="modelStore")
        return cls(**values)  # type: ignore[arg-type]


def _check_team_label(value: object) -> None:
    if value is not None and (not isinstance(value, str) or len(value) > 253 or not _LABEL_KEY.match(value)):
        raise ConfigError(f"team label {value!r} is not a Kubernetes label key; give e.g. team or "
                          f"example.com/team ({ENV_TEAM_LABEL}, --team-label)", field="teamLabel")


def _number(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise ConfigError(f"{name}={text!r} is not a number", field=name) from exc
    if not math.isfinite(value):
        raise ConfigError(f"{name}={text!r} is not a finite number", field=name)
    return value


def _port(text: str, name: str) -> int:
    value = _number(text, name)
    if not value.is_integer():
        raise ConfigError(f"{name}={text!r} is not a TCP port; give e.g. 6000, or off", field=name)
    return int(value)


def _optional(text: str | None, name: str, *, whole: bool) -> float | None:
    if text is None or not text.strip():
        return None
    value = _number(text.strip(), name)
    if whole and not value.is_integer():
        raise ConfigError(f"{name}={text!r} must be a whole number of GPUs", field=name)
    return value

"""Connecting: an ``ApiClient`` from the in-cluster ServiceAccount or a kubeconfig, with a kubeconfig
the kubernetes library would crash on refused up front (what is wrong, what to do)."""

from __future__ import annotations

import os
from functools import partial

from kubernetes.client import ApiClient

from predictive_scaler.errors import ConfigError
from predictive_scaler.kube.transport import TRANSPORT_RETRIES
from predictive_scaler.yaml_input import read_regular


def api_client_from_environment(
    kubeconfig: str | None = None, context: str | None = None
) -> ApiClient:
    """An ApiClient for the controller: in-cluster config when running in a pod
    (and no ``kubeconfig`` given), else the kubeconfig (``$KUBECONFIG`` or
    ``~/.kube/config``). Raises ConfigError when neither is usable."""
    from kubernetes import config as kube_config
    from kubernetes.client import Configuration

    configuration = Configuration()
    default_host = configuration.host
    in_cluster = kubeconfig is None and _in_cluster()
    where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    if not in_cluster:
        check_kubeconfig(kubeconfig, context)
    try:
        if in_cluster:
            kube_config.load_incluster_config(client_configuration=configuration)
        else:
            kube_config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
    except (kube_config.ConfigException, OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        # ValueError: bad base64 certificate data; Type/Key/AttributeError: a malformed entry
        raise ConfigError(
            f"cannot load Kubernetes credentials from {'the ServiceAccount' if in_cluster else where} "
            f"({type(exc).__name__}: {exc}); fix that file (`kubectl config view` shows what it holds), "
            "run in a pod with a ServiceAccount, or pass another --kubeconfig",
            field="kubeconfig",
        ) from exc
    if not in_cluster and (not configuration.host or configuration.host == default_host):
        raise ConfigError(
            f"kubeconfig {where}: the cluster of the current context has no server address; set "
            "clusters[].cluster.server (e.g. https://10.0.0.1:6443) or pass another --kubeconfig",
            field="kubeconfig",
        )
    configuration.retries = TRANSPORT_RETRIES
    return ApiClient(configuration)


def check_kubeconfig(path: str | None, context: str | None = None) -> None:  # noqa: C901
    """Refuse, with what is wrong and what to do, a kubeconfig the kubernetes library would crash on
    (not a file, not UTF-8, not YAML, not a mapping) or one whose exec plugin is not installed."""
    import shutil

    import yaml

    from predictive_scaler.yaml_input import check_size

    files = [path] if path else [f for f in os.environ.get("KUBECONFIG", "").split(os.pathsep) if f]
    if not files:
        files = [os.path.expanduser("~/.kube/config")]
        if not os.path.exists(files[0]):
            return  # the library says "no configuration found"
    for f in files:
        if not os.path.exists(f):
            if path:
                raise ConfigError(f"--kubeconfig {f}: no such file; give your kubeconfig (`kubectl config view "
                                  "--raw` prints it)", field="kubeconfig")
            continue
        if os.path.isdir(f):
            raise ConfigError(f"kubeconfig {f}: is a directory; give the kubeconfig file inside it (usually "
                              "~/.kube/config)", field="kubeconfig")
        try:
            # A regular file only (a FIFO would block for ever), of at most 10 MiB (a kubeconfig is kilobytes).
            text = read_regular(f, limit=10 * 1024 * 1024, what="a kubeconfig",
                                remedy="give your kubeconfig file (`kubectl config view --raw` prints one)",
                                error=partial(ConfigError, field="kubeconfig")).decode("utf-8")
            doc = check_size(yaml.safe_load(text), f"kubeconfig {f}", field="kubeconfig")
        except RecursionError as exc:
            raise ConfigError(f"kubeconfig {f}: nested too deeply to read; give your kubeconfig file",
                              field="kubeconfig") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"kubeconfig {f}: not text (not UTF-8 at byte {exc.start}); give a kubeconfig "
                              "YAML file (`kubectl config view --raw` prints one)", field="kubeconfig") from exc
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"kubeconfig {f}: not valid YAML{at} ({getattr(exc, 'problem', None) or exc}); fix "
                              "the file or export it again with `kubectl config view --raw`",
                              field="kubeconfig") from exc
        except OSError as exc:
            raise ConfigError(f"kubeconfig {f}: cannot be read ({exc.strerror or exc}); check its permissions",
                              field="kubeconfig") from exc
        if doc is None:
            continue  # empty: the library's own message names it
        if not isinstance(doc, dict):
            raise ConfigError(f"kubeconfig {f}: a kubeconfig is a YAML mapping (apiVersion, clusters, contexts, "
                              f"users), this is a {type(doc).__name__}; give your kubeconfig file",
                              field="kubeconfig")
        for section in ("clusters", "contexts", "users"):
            entries = doc.get(section)
            if entries is not None and (not isinstance(entries, list)
                                        or not all(isinstance(e, dict) for e in entries)):
                raise ConfigError(f"kubeconfig {f}: {section} must be a list of named entries; fix the file or "
                                  "export it again with `kubectl config view --raw`", field="kubeconfig")
        current = context or doc.get("current-context")
        ctx = next((c.get("context") for c in doc.get("contexts") or [] if c.get("name") == current), None)
        user_name = ctx.get("user") if isinstance(ctx, dict) else None
        user = next((u.get("user") for u in doc.get("users") or [] if u.get("name") == user_name), None)
        plugin = user.get("exec") if isinstance(user, dict) else None
        command = plugin.get("command") if isinstance(plugin, dict) else None
        if isinstance(command, str) and shutil.which(command) is None:
            raise ConfigError(f"kubeconfig {f}: user {user_name!r} logs in through the exec plugin {command!r}, "
                              "which is not installed here (not found on PATH); install it or use a kubeconfig "
                              "with a token or client certificate", field="kubeconfig")


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )

"""A real Kubernetes control plane for tests: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.

The API server, controller-manager and scheduler are Kubernetes 1.20.2 built
from Debian bookworm's source package by ``scripts/build-kube-apiserver.sh``
(cached outside the clone); etcd is Debian's ``etcd-server``. Everything listens on
free loopback ports and lives in a temporary directory.

The server runs the way a production cluster does where it matters here:
token authentication, ``--authorization-mode=RBAC``, service-account tokens
signed with a key pair, and the admission plugins a production cluster enables
(including ``OwnerReferencesPermissionEnforcement``, on by default in
OpenShift). ``--endpoint-reconciler-type=none``: there is no real network to
advertise. The controller-manager runs the controllers the project relies on:
deployment, replicaset, garbagecollector, namespace, and the service-account
ones that admission needs before any pod can be created. The scheduler runs
as ``system:kube-scheduler`` (its bootstrap RBAC) and binds pods to the nodes
tests add with :meth:`KubeApiServer.add_gpu_node`: Node objects made Ready by
hand, as there is no kubelet and no node controller. Bound pods stay Pending
(nothing runs them) unless a test writes their status; a bound pod deleted with
a grace period stays Terminating, as no kubelet confirms it.

:func:`apply_deploy` applies what of ``deploy/`` 1.20 serves (rendered with
``kubectl kustomize``); the retraining CronJob (batch/v1 with ``timeZone``,
Kubernetes 1.27+) stays with the offline validation and the stand-in.

If a binary is missing the tests FAIL and say how to get it — never skip.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from predictive_scaler import crd
from tests.support.processes import stop_process
from tests.support.prometheus import free_port

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-kube-apiserver.sh"
ADMIN_TOKEN = "e2e-admin-token"
SCHEDULER_TOKEN = "e2e-scheduler-token"
GPU = "nvidia.com/gpu"
#: The taints the API server's admission (TaintNodesByCondition) puts on a new node; the node
#: controller removes them once the kubelet reports Ready, and neither runs here.
NODE_STARTUP_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
#: The admission plugins of a production cluster that matter to this controller (1.20 names).
ADMISSION_PLUGINS = (
    "NamespaceLifecycle", "LimitRanger", "ServiceAccount", "DefaultTolerationSeconds", "Priority",
    "DefaultStorageClass", "StorageObjectInUseProtection", "PersistentVolumeClaimResize",
    "RuntimeClass", "MutatingAdmissionWebhook", "ValidatingAdmissionWebhook", "ResourceQuota",
    "OwnerReferencesPermissionEnforcement",
)
CONTROLLERS = ("deployment", "replicaset", "garbagecollector", "namespace", "serviceaccount",
               "serviceaccount-token")
#: Kinds in deploy/ that Kubernetes 1.20 does not serve as written (batch/v1 CronJob is 1.21+).
NOT_SERVED_BY_1_20 = {("batch/v1", "CronJob")}
READY_TIMEOUT_SECONDS = 120.0


def kube_bin_dir() -> Path:
    """Where the build script keeps (or would keep) the binaries for this source version."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "--print-bin-dir"], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        pytest.fail(f"{BUILD_SCRIPT} --print-bin-dir failed: {done.stderr}", pytrace=False)
    return Path(done.stdout.strip())


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    apiserver: Path
    controller_manager: Path
    scheduler: Path


def require_binaries() -> Binaries:
    """etcd and the Kubernetes binaries; fails with what to run when one is missing."""
    bin_dir = kube_bin_dir()
    apiserver, kcm, scheduler = (bin_dir / n for n in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"))
    if not (apiserver.is_file() and kcm.is_file() and scheduler.is_file()):
        pytest.fail(
            f"kube-apiserver/kube-controller-manager/kube-scheduler are not built (looked in {bin_dir}); the end-to-end "
            "tests need a real API server: run `bash scripts/build-kube-apiserver.sh` (about 6–10 min "
            "once; needs golang-go, dpkg-dev and a bookworm deb-src line — see docs/kubernetes-versions.md) "
            "or `make kube-apiserver`",
            pytrace=False)
    etcd = shutil.which("etcd")
    if etcd is None:
        pytest.fail("`etcd` is not installed; the end-to-end tests need it: apt-get install etcd-server",
                    pytrace=False)
    return Binaries(Path(etcd), apiserver, kcm, scheduler)


def _openssl(*args: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("`openssl` is needed to make the API server's keys: apt-get install openssl", pytrace=False)
    subprocess.run([openssl, *args], check=True, capture_output=True)


def make_pki(root: Path) -> dict[str, Path]:
    """A self-signed serving certificate for 127.0.0.1 and a service-account signing key pair."""
    root.mkdir(parents=True, exist_ok=True)
    paths = {"cert": root / "serving.crt", "key": root / "serving.key",
             "sa_key": root / "sa.key", "sa_pub": root / "sa.pub"}
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(paths["key"]),
             "-out", str(paths["cert"]))
    _openssl("genrsa", "-out", str(paths["sa_key"]), "2048")
    _openssl("rsa", "-in", str(paths["sa_key"]), "-pubout", "-out", str(paths["sa_pub"]))
    return paths


def kubeconfig_text(server: str, ca: Path, token: str, user: str) -> str:
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
        "clusters": [{"name": "e2e", "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
    }
    return yaml.safe_dump(config)


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        stop_process(self.popen, grace=15)


@dataclass
class KubeApiServer:
    """A running control plane. ``admin_kubeconfig`` is system:masters; use it to set up and inspect."""

    url: str
    root: Path
    ca: Path
    admin_kubeconfig: Path
    processes: list[Process]
    startup_seconds: float

    # -- admin access ---------------------------------------------------------------------------
    def kubectl(self, *args: str, kubeconfig: Path | None = None, stdin: str | None = None,
                check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        kubectl = shutil.which("kubectl")
        assert kubectl, "kubectl is required (it renders and applies deploy/)"
        done = subprocess.run([kubectl, f"--kubeconfig={kubeconfig or self.admin_kubeconfig}", *args],
                              input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
        return done

    def request(self, method: str, path: str, *, token: str = ADMIN_TOKEN, body: Any = None,
                content_type: str = "application/json", params: dict[str, str] | None = None) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        return requests.request(method, self.url + path, headers=headers, data=data, params=params,
                                verify=str(self.ca), timeout=30)

    def get(self, path: str, **kw: Any) -> dict[str, Any] | None:
        answer = self.request("GET", path, **kw)
        if answer.status_code == 404:
            return None
        assert answer.status_code == 200, f"GET {path}: {answer.status_code} {answer.text[:500]}"
        return dict(answer.json())

    def apply(self, objects: Sequence[dict[str, Any]]) -> None:
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(list(objects)))

    def service_account_token(self, namespace: str, name: str, seconds: int = 7200) -> str:
        """A bound token of the ServiceAccount (TokenRequest), as a pod would get."""
        answer = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                              body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                    "spec": {"expirationSeconds": seconds}})
        assert answer.status_code == 201, f"TokenRequest for {namespace}/{name}: {answer.status_code} {answer.text}"
        return str(answer.json()["status"]["token"])

    def service_account_kubeconfig(self, namespace: str, name: str) -> Path:
        token = self.service_account_token(namespace, name)
        path = self.root / f"kubeconfig-{namespace}-{name}"
        path.write_text(kubeconfig_text(self.url, self.ca, token, f"system:serviceaccount:{namespace}:{name}"))
        return path

    def can_i(self, token: str, verb: str, group: str, resource: str, namespace: str | None = None,
              subresource: str = "") -> bool:
        """A SelfSubjectAccessReview as the token's user: what `kubectl auth can-i` asks, answered by RBAC."""
        attributes = {"verb": verb, "group": group, "resource": resource, "subresource": subresource}
        if namespace:
            attributes["namespace"] = namespace
        answer = self.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", token=token,
                              body={"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                                    "spec": {"resourceAttributes": attributes}})
        assert answer.status_code == 201, answer.text
        return bool(answer.json()["status"].get("allowed"))

    def wait_for(self, what: str, predicate: Any, timeout: float = 90.0, interval: float = 0.25) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(interval)
        self.check_alive()
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")

    def audit(self, user: str | None = None) -> list[dict[str, Any]]:
        """Audit events (one per request) so far, optionally only those of ``user``."""
        events = []
        with open(self.root / "audit.log", encoding="utf-8") as log:
            for line in log:
                if line.strip():
                    event = json.loads(line)
                    if user is None or (event.get("user") or {}).get("username") == user:
                        events.append(event)
        return events

    # -- nodes -----------------------------------------------------------------------------------
    def add_gpu_node(self, name: str, gpus: int = 8, *, labels: dict[str, str] | None = None,
                     taints: Sequence[dict[str, str]] = ()) -> dict[str, Any]:
        """A Node with ``gpus`` of nvidia.com/gpu (and room for them: CPU, memory, pods), made Ready.

        What a kubelet and the node controller would do is done here: the status (capacity,
        allocatable, a Ready condition) is written, and the start-up taints admission added are
        removed, so the scheduler binds pods to it. Nothing renews the heartbeat, and nothing
        needs to: no node controller runs to mark the node NotReady again.
        """
        resources = {"cpu": "96", "memory": "1024Gi", "pods": "110", "ephemeral-storage": "1000Gi", GPU: str(gpus)}
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                      "kubernetes.io/arch": "amd64", **(labels or {})}},
                "spec": {"taints": [dict(t) for t in taints]}}
        answer = self.request("POST", "/api/v1/nodes", body=body)
        assert answer.status_code == 201, f"creating node {name}: {answer.status_code} {answer.text}"
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake node, made Ready by the tests",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}
        status = {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready],
                             "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                           {"type": "Hostname", "address": name}],
                             "nodeInfo": {"kubeletVersion": "v1.20.2", "kubeProxyVersion": "v1.20.2",
                                          "operatingSystem": "linux", "architecture": "amd64",
                                          "containerRuntimeVersion": "fake://0", "kernelVersion": "",
                                          "osImage": "", "machineID": "", "systemUUID": "", "bootID": ""}}}
        answer = self.request("PATCH", f"/api/v1/nodes/{name}/status", body=status,
                              content_type="application/merge-patch+json")
        assert answer.status_code == 200, f"node {name} status: {answer.status_code} {answer.text}"

        def untainted() -> dict[str, Any] | None:
            node = self.get(f"/api/v1/nodes/{name}")
            assert node is not None
            kept = [t for t in node["spec"].get("taints") or [] if t["key"] not in NODE_STARTUP_TAINTS]
            if kept == (node["spec"].get("taints") or []):
                return node
            # Against the version read, so a taint added meanwhile is not lost (409 -> read again).
            patch = {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"]}, "spec": {"taints": kept}}
            self.request("PATCH", f"/api/v1/nodes/{name}", body=patch, content_type="application/merge-patch+json")
            return None

        return dict(self.wait_for(f"node {name} without its start-up taints", untainted, timeout=30))

    def pods(self, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        answer = self.get(f"/api/v1/namespaces/{namespace}/pods",
                          params={"labelSelector": selector} if selector else None)
        assert answer is not None
        return list(answer["items"])

    def check_alive(self) -> None:
        for p in self.processes:
            if not p.alive():
                raise AssertionError(f"{p.name} exited with {p.popen.returncode}:\n{p.tail()}")

    def stop(self) -> None:
        for p in reversed(self.processes):
            p.stop()


def _start(name: str, argv: list[str], root: Path) -> Process:
    log = root / f"{name}.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=root)
    return Process(name, popen, log)


def _wait(what: str, proc: Process, check: Any, timeout: float = READY_TIMEOUT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            pytest.fail(f"{proc.name} exited with {proc.popen.returncode} at start-up:\n{proc.tail()}",
                        pytrace=False)
        try:
            if check():
                return
        except (requests.RequestException, OSError):
            pass
        time.sleep(0.2)
    pytest.fail(f"{what} not ready after {timeout:.0f}s:\n{proc.tail()}", pytrace=False)


@contextlib.contextmanager
def running_control_plane(root: Path) -> Iterator[KubeApiServer]:
    """Start etcd, kube-apiserver and kube-controller-manager under ``root``; stop them on exit."""
    binaries = require_binaries()
    t0 = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    pki = make_pki(root / "pki")
    audit_policy = root / "audit-policy.yaml"
    # Every request at Metadata level: who called what, and the answer's code (tests read it).
    audit_policy.write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n"
                            "rules:\n  - level: Metadata\n")
    tokens = root / "tokens.csv"
    # The scheduler authenticates as the user its bootstrap ClusterRoleBindings name.
    tokens.write_text(f'{ADMIN_TOKEN},e2e-admin,e2e-admin-uid,"system:masters"\n'
                      f'{SCHEDULER_TOKEN},system:kube-scheduler,e2e-scheduler-uid\n')
    processes: list[Process] = []
    try:
        client_port, peer_port = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{client_port}"
        processes.append(_start("etcd", [
            str(binaries.etcd), "--name=e2e", f"--data-dir={root / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=e2e=http://127.0.0.1:{peer_port}",
            "--log-level=warn", "--quota-backend-bytes=1073741824",
        ], root))
        _wait("etcd", processes[-1],
              lambda: requests.get(f"{etcd_url}/health", timeout=1).json().get("health") == "true")

        port = free_port()
        url = f"https://127.0.0.1:{port}"
        processes.append(_start("kube-apiserver", [
            str(binaries.apiserver), f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
            "--insecure-port=0", f"--tls-cert-file={pki['cert']}", f"--tls-private-key-file={pki['key']}",
            f"--token-auth-file={tokens}", "--anonymous-auth=false",
            "--authorization-mode=RBAC",
            f"--service-account-key-file={pki['sa_pub']}",
            f"--service-account-signing-key-file={pki['sa_key']}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--api-audiences=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.96.0.0/16", "--endpoint-reconciler-type=none",
            f"--enable-admission-plugins={','.join(ADMISSION_PLUGINS)}",
            "--enable-priority-and-fairness=true", "--profiling=false", "--v=1",
            f"--audit-policy-file={audit_policy}", f"--audit-log-path={root / 'audit.log'}",
            "--audit-log-mode=blocking",
        ], root))
        ca = pki["cert"]
        admin = root / "kubeconfig-admin"
        admin.write_text(kubeconfig_text(url, ca, ADMIN_TOKEN, "e2e-admin"))

        def healthy() -> bool:
            answer = requests.get(f"{url}/readyz", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                                  verify=str(ca), timeout=2)
            return answer.status_code == 200

        _wait("kube-apiserver", processes[-1], healthy)
        processes.append(_start("kube-controller-manager", [
            str(binaries.controller_manager), f"--kubeconfig={admin}", f"--controllers={','.join(CONTROLLERS)}",
            "--leader-elect=false", "--port=0", "--secure-port=0",
            f"--service-account-private-key-file={pki['sa_key']}", f"--root-ca-file={ca}",
            "--use-service-account-credentials=false", "--kube-api-qps=100", "--kube-api-burst=200",
            "--concurrent-deployment-syncs=5", "--concurrent-replicaset-syncs=5", "--concurrent-gc-syncs=5",
            "--v=1",
        ], root))
        server = KubeApiServer(url=url, root=root, ca=ca, admin_kubeconfig=admin, processes=processes,
                               startup_seconds=0.0)

        def default_account() -> bool:
            sa = server.get("/api/v1/namespaces/default/serviceaccounts/default")
            return bool(sa and sa.get("secrets"))

        _wait("kube-controller-manager (the default ServiceAccount and its token)", processes[-1],
              default_account)
        scheduler_kubeconfig = root / "kubeconfig-scheduler"
        scheduler_kubeconfig.write_text(kubeconfig_text(url, ca, SCHEDULER_TOKEN, "system:kube-scheduler"))
        # No serving ports (nothing probes it); --secure-port=0 also spares it the delegated
        # authentication it would otherwise read from kube-system.
        processes.append(_start("kube-scheduler", [
            str(binaries.scheduler), f"--kubeconfig={scheduler_kubeconfig}", "--leader-elect=false",
            "--port=0", "--secure-port=0", "--kube-api-qps=100", "--kube-api-burst=200", "--v=1",
        ], root))
        log = processes[-1].log

        def scheduler_started() -> bool:
            # It lists nodes and pods before it schedules; its informers' first LISTs are in the audit log.
            return any(e.get("user", {}).get("username") == "system:kube-scheduler" and e["verb"] == "list"
                       and e.get("objectRef", {}).get("resource") == "pods" for e in server.audit())

        _wait(f"kube-scheduler (see {log})", processes[-1], scheduler_started)
        server.startup_seconds = time.perf_counter() - t0
        yield server
    finally:
        for p in reversed(processes):
            p.stop()


def served(objects: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split rendered objects into (applied on 1.20, left out because 1.20 does not serve them).

    The CRD goes without its CEL rules, as docs/install.md tells users of servers before 1.25
    (`python -m predictive_scaler.crd --no-cel`): 1.20's CRD schema has no x-kubernetes-validations.
    """
    keep = [crd.without_cel(o) if o["kind"] == "CustomResourceDefinition" else o
            for o in objects if (o["apiVersion"], o["kind"]) not in NOT_SERVED_BY_1_20]
    left = [o for o in objects if (o["apiVersion"], o["kind"]) in NOT_SERVED_BY_1_20]
    return keep, left


def wait_established(server: KubeApiServer, name: str, timeout: float = 60) -> None:
    """Poll until the CRD's Established condition is True.

    `kubectl wait --for=condition=...` fails at once ("accessor error: <nil>") when it reads the CRD
    before the apiextensions controller has written any condition, so it cannot be used straight
    after the create.
    """
    query = '{.status.conditions[?(@.type=="Established")].status}'

    def established() -> bool:
        done = server.kubectl("get", f"crd/{name}", "-o", f"jsonpath={query}", check=False)
        return done.returncode == 0 and done.stdout.strip() == "True"

    server.wait_for(f"crd/{name} to be Established", established, timeout=timeout, interval=0.2)


def apply_deploy(server: KubeApiServer, objects: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Apply the rendered install (CRD first, then wait until it is Established). Returns what was left out."""
    keep, left = served(objects)
    crds = [o for o in keep if o["kind"] == "CustomResourceDefinition"]
    server.apply(crds)
    for definition in crds:
        wait_established(server, definition["metadata"]["name"])
    server.apply([o for o in keep if o["kind"] != "CustomResourceDefinition"])
    return left


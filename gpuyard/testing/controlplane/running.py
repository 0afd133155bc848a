"""A real Kubernetes control plane on this machine: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, built by `make k8s-bin`, started as child processes on free loopback ports.

    with ControlPlane(data_dir=tmp) as cp:      # or cp.start() ... cp.stop()
        cp.admin_kubeconfig                     # a self-contained admin kubeconfig (system:masters)

What it gives is what envtest gives controller-runtime projects, plus the controllers: TLS on the
secure port, client certificates and service-account tokens (`kubectl create token` works), RBAC and
Node authorization, the default admission chain plus `OwnerReferencesPermissionEnforcement` and
`NodeRestriction`, and in the controller manager the garbage collector, namespace, node lifecycle
(taint-based eviction) and service-account controllers. Node-monitor and eviction timings are short
for tests (`Timings`); a real cluster's defaults are one `Timings.upstream()` away.

Children are started from the calling thread with `PR_SET_PDEATHSIG`, so they die with it: call
`start()` from a thread that lives as long as the control plane (the main thread, a pytest session).
Each component logs to `<data_dir>/logs/<name>.log`; a component that fails to come up raises
`ControlPlaneError` with the end of its log.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from gpuyard.testing.controlplane.binaries import Binaries, find_binaries
from gpuyard.testing.controlplane.certs import ClientIdentity, Pki, make_pki

__all__ = ["ControlPlane", "ControlPlaneError", "Timings"]

SERVICE_RANGE = "10.0.0.0/24"
# Requests of the control plane's own components are left out; everyone else's at Metadata level.
_AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "None",
            "users": ["system:kube-controller-manager", "system:kube-scheduler", "system:apiserver"],
        },
        {"level": "None", "userGroups": ["system:serviceaccounts:kube-system", "system:nodes"]},
        {
            "level": "None",
            "nonResourceURLs": ["/healthz*", "/readyz*", "/livez*", "/version", "/openapi*", "/api*"],
        },
        {"level": "Metadata"},
    ],
}
ADMISSION = "NodeRestriction,OwnerReferencesPermissionEnforcement"


class ControlPlaneError(RuntimeError):
    """A component did not come up (or died); the message ends with its log's last lines."""


@dataclass(frozen=True)
class Timings:
    """How fast the control plane notices a dead node and moves its pods (seconds)."""

    node_monitor_period: float = 1
    node_monitor_grace_period: float = 8
    # the DefaultTolerationSeconds admission plugin gives every pod these tolerations of
    # node.kubernetes.io/not-ready and /unreachable: the taint manager evicts after them
    not_ready_toleration: int = 5
    unreachable_toleration: int = 5

    @classmethod
    def upstream(cls) -> Timings:
        """Kubernetes' own defaults."""
        return cls(
            node_monitor_period=5,
            node_monitor_grace_period=50,
            not_ready_toleration=300,
            unreachable_toleration=300,
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


@dataclass
class _Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]

    def tail(self, lines: int = 25) -> str:
        self.log.flush()
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


@dataclass
class ControlPlane:
    """One control plane; `start()` brings it up, `stop()` takes it down (idempotent)."""

    data_dir: Path | None = None
    bin_dir: Path | None = None
    timings: Timings = field(default_factory=Timings)
    start_timeout: float = 120.0
    extra_apiserver_args: tuple[str, ...] = ()
    scheduler_config: dict[str, Any] | None = None
    """Extra fields of kube-scheduler's KubeSchedulerConfiguration (e.g. `clientConnection.qps`);
    the client connection's kubeconfig and leader election are set here."""
    audit: bool = False
    """Write an audit log (`audit_log`, JSON lines, one per finished request of a client that is not
    a control-plane component): what tests read to see which calls gpuyard made."""

    binaries: Binaries | None = field(default=None, init=False)
    pki: Pki | None = field(default=None, init=False)
    url: str = field(default="", init=False)
    etcd_url: str = field(default="", init=False)
    admin_kubeconfig: Path = field(default=Path(), init=False)
    audit_log: Path | None = field(default=None, init=False)
    _children: list[_Child] = field(default_factory=list, init=False)
    _own_dir: bool = field(default=False, init=False)

    # ------------------------------------------------------------------ life cycle

    def start(self) -> ControlPlane:
        self.binaries = find_binaries(self.bin_dir)
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="gpuyard-control-plane-"))
            self._own_dir = True
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "logs").mkdir(exist_ok=True)
        self.pki = make_pki(self.data_dir / "pki")
        try:
            self._start_etcd()
            self._start_apiserver()
            self._start_controllers()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM every component, newest first; SIGKILL what has not exited after 10 s."""
        for child in reversed(self._children):
            if child.process.poll() is None:
                child.process.terminate()
                try:
                    child.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.process.kill()
                    child.process.wait()
            child.log.close()
        self._children.clear()
        if self._own_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def dead(self) -> list[str]:
        """Components that have exited (a healthy control plane answers [])."""
        return [c.name for c in self._children if c.process.poll() is not None]

    # ------------------------------------------------------------------ components

    def _spawn(self, name: str, argv: list[str]) -> _Child:
        assert self.data_dir is not None
        log_path = self.data_dir / "logs" / f"{name}.log"
        log = log_path.open("ab")
        process = subprocess.Popen(  # our own binaries, argv built here
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,  # only prctl: no lock is taken between fork and exec
            start_new_session=True,  # a terminal's Ctrl-C reaches us; we stop them in order
        )
        child = _Child(name=name, process=process, log_path=log_path, log=log)
        self._children.append(child)
        return child

    def _wait(self, child: _Child, ready: Any, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        last = ""
        while time.monotonic() < deadline:
            if child.process.poll() is not None:
                raise ControlPlaneError(
                    f"{child.name} exited with code {child.process.returncode} before {what}:\n{child.tail()}"
                )
            try:
                if ready():
                    return
            except (OSError, urllib.error.URLError, ValueError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise ControlPlaneError(
            f"{child.name}: no {what} within {self.start_timeout:.0f} s ({last}):\n{child.tail()}"
        )

    def _start_etcd(self) -> None:
        assert self.binaries and self.data_dir
        client, peer = _free_port(), _free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        child = self._spawn(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name=gpuyard",
                f"--data-dir={self.data_dir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=gpuyard=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",  # tests: speed over durability, as envtest does
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as answer:
                return bool(json.loads(answer.read()).get("health") == "true")

        self._wait(child, healthy, "healthy /health")

    def _start_apiserver(self) -> None:
        assert self.binaries and self.data_dir and self.pki
        pki, t = self.pki, self.timings
        port = _free_port()
        self.url = f"https://127.0.0.1:{port}"
        child = self._spawn(
            "kube-apiserver",
            [
                str(self.binaries.kube_apiserver),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none",  # a loopback address cannot back the kubernetes Service
                f"--secure-port={port}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                f"--service-account-key-file={pki.sa_public}",
                f"--service-account-signing-key-file={pki.sa_private}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_RANGE}",
                "--authorization-mode=Node,RBAC",
                f"--enable-admission-plugins={ADMISSION}",
                f"--default-not-ready-toleration-seconds={t.not_ready_toleration}",
                f"--default-unreachable-toleration-seconds={t.unreachable_toleration}",
                "--allow-privileged=true",
                "--profiling=false",
                *self._audit_args(),
                *self.extra_apiserver_args,
            ],
        )
        self.admin_kubeconfig = self._kubeconfig("admin", pki.admin)
        context = self._tls(pki.admin)

        def ready() -> bool:
            request = urllib.request.Request(f"{self.url}/readyz")
            try:
                with urllib.request.urlopen(request, timeout=3, context=context) as answer:
                    return bool(answer.status == 200)
            except urllib.error.HTTPError:  # 500 while post-start hooks run
                return False

        self._wait(child, ready, "ready /readyz")

    def _audit_args(self) -> list[str]:
        if not self.audit:
            return []
        assert self.data_dir
        policy = self.data_dir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(_AUDIT_POLICY, sort_keys=False))
        self.audit_log = self.data_dir / "audit.log"
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",  # a request's line is written before it is answered
            "--audit-log-maxsize=0",
        ]

    def _start_controllers(self) -> None:
        assert self.binaries and self.pki
        pki, t = self.pki, self.timings
        kcm = self._kubeconfig("controller-manager", pki.controller_manager)
        controllers = self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.kube_controller_manager),
                f"--kubeconfig={kcm}",
                f"--authentication-kubeconfig={kcm}",
                f"--authorization-kubeconfig={kcm}",
                "--bind-address=127.0.0.1",
                f"--secure-port={_free_port()}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki.sa_private}",
                f"--root-ca-file={pki.ca_cert}",
                f"--cluster-signing-cert-file={pki.ca_cert}",
                f"--cluster-signing-key-file={pki.ca_key}",
                f"--node-monitor-period={t.node_monitor_period}s",
                f"--node-monitor-grace-period={t.node_monitor_grace_period}s",
                "--concurrent-gc-syncs=10",
            ],
        )
        sched = self._kubeconfig("scheduler", pki.scheduler)
        config = self._scheduler_config(sched)
        self._spawn(
            "kube-scheduler",
            [
                str(self.binaries.kube_scheduler),
                f"--config={config}",
                f"--authentication-kubeconfig={sched}",
                f"--authorization-kubeconfig={sched}",
                "--bind-address=127.0.0.1",
                f"--secure-port={_free_port()}",
            ],
        )
        # The service-account controller's first act: a namespace's `default` ServiceAccount. Pods
        # are refused (ServiceAccount admission) until it exists, so wait for it in `default`.
        context = self._tls(pki.admin)

        def accounts() -> bool:
            url = f"{self.url}/api/v1/namespaces/default/serviceaccounts/default"
            try:
                with urllib.request.urlopen(url, timeout=3, context=context) as answer:
                    return bool(answer.status == 200)
            except urllib.error.HTTPError:
                return False

        self._wait(controllers, accounts, "default ServiceAccount (controllers running)")

    def _scheduler_config(self, kubeconfig: Path) -> Path:
        assert self.data_dir
        extra = dict(self.scheduler_config or {})
        connection = {**extra.pop("clientConnection", {}), "kubeconfig": str(kubeconfig)}
        doc = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": connection,
            "leaderElection": {"leaderElect": False},
            **extra,
        }
        path = self.data_dir / "kube-scheduler.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    # ------------------------------------------------------------------ clients

    def _tls(self, identity: ClientIdentity) -> ssl.SSLContext:
        assert self.pki
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(identity.cert), str(identity.key))
        return context

    def _kubeconfig(self, stem: str, identity: ClientIdentity) -> Path:
        assert self.data_dir and self.pki
        path = self.data_dir / f"{stem}.kubeconfig"
        write_kubeconfig(
            path,
            server=self.url,
            ca=self.pki.ca_cert,
            user={
                "client-certificate-data": _b64(identity.cert),
                "client-key-data": _b64(identity.key),
            },
            user_name=identity.user,
        )
        return path

    def token_kubeconfig(self, path: Path, *, token: str, user: str) -> Path:
        """A kubeconfig for this control plane that authenticates with a bearer token (a
        ServiceAccount's, from `kubectl create token`)."""
        assert self.pki
        return write_kubeconfig(
            path, server=self.url, ca=self.pki.ca_cert, user={"token": token}, user_name=user
        )


def write_kubeconfig(path: Path, *, server: str, ca: Path, user: dict[str, str], user_name: str) -> Path:
    """A self-contained kubeconfig (certificates embedded), mode 0600."""
    name = "gpuyard-control-plane"
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": _b64(ca)}}],
        "users": [{"name": user_name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user_name}}],
        "current-context": name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        yaml.safe_dump(doc, out, sort_keys=False)
    return path

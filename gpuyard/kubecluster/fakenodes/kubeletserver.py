"""The fake nodes' kubelet port: `GET /containerLogs/{namespace}/{pod}/{container}`, over HTTPS.

An API server answers `pods/{name}/log` (`kubectl logs`, gpuyard's log route on Kubernetes) by
asking the kubelet of the pod's node, at the node's address (its InternalIP here) and the port in
its `status.daemonEndpoints.kubeletEndpoint.Port`, always over HTTPS (kube-apiserver does not check
the kubelet's certificate unless given `--kubelet-certificate-authority`). One server answers for
every fake node, as KWOK's does; each Node names it. It serves a self-signed certificate made at
start (EC P-256, for the listening address and `localhost`; the `cryptography` package, of the
`kubernetes` extra).

The log is the one both simulated kubelets keep (`gpuyard.devices.fakepods.container_logs`: when
and where the container started, its training environment, how it exited), of the pod as
fake-nodes last saw it. The options kubectl sends: `tailLines` (the last N lines), `follow` (the
answer stays open and gets each new line until the pod has finished or is deleted); the others
(`timestamps`, `previous`, `sinceSeconds`, `limitBytes`) are taken and ignored, as the lines start
with their time already. Answers as a kubelet's: 404 for a pod not bound to these nodes or a
container it does not have, 400 `container "c" in pod "p" is waiting to start: ContainerCreating`
before it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import socket
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog
from aiohttp import web

from gpuyard.apis.core import Pod
from gpuyard.devices.fakepods import container_logs

__all__ = ["KubeletEndpoint", "KubeletServer", "self_signed_context"]

log = structlog.get_logger(__name__)
FINISHED = ("Succeeded", "Failed")
CHECK_SECONDS = 5.0  # while a followed log is quiet, how often to look whether its client left


@dataclass(frozen=True, slots=True)
class KubeletEndpoint:
    """Where the kubelet port listens: `address` (also each Node's InternalIP, so it must be one
    the API server can reach) and `port` (0: a free one, then named in each Node)."""

    address: str = "127.0.0.1"
    port: int = 0


def self_signed_context(address: str) -> ssl.SSLContext:
    """A server TLS context with a new self-signed certificate for `address` and `localhost`.
    Raises ImportError where the `cryptography` package is missing."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuyard-fake-kubelet")])
    sans: list[x509.GeneralName] = [x509.DNSName("localhost")]
    try:
        sans.append(x509.IPAddress(ipaddress.ip_address(address)))
    except ValueError:
        sans.append(x509.DNSName(address))
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(key, hashes.SHA256())
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory(prefix="gpuyard-kubelet-") as tmp:
        cert_file, key_file = Path(tmp) / "kubelet.crt", Path(tmp) / "kubelet.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        context.load_cert_chain(cert_file, key_file)
    return context


def _text(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message + "\n", content_type="text/plain")


def _tail_lines(raw: str | None) -> int | None:
    if raw is None or not raw.lstrip("-").isdigit():
        return None
    value = int(raw)
    return value if value >= 0 else None


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


class KubeletServer:
    """The kubelet port of a set of fake nodes (see the module docstring). `pod(ns, name)` is the
    pod as the nodes last saw it (None: not one of theirs); `changes()` an event set at the next
    change of any of their pods."""

    def __init__(
        self,
        endpoint: KubeletEndpoint,
        *,
        pod: Callable[[str, str], Pod | None],
        changes: Callable[[], asyncio.Event],
    ) -> None:
        self.endpoint = endpoint
        self.pod = pod
        self.changes = changes
        self.port = endpoint.port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Listen (raises OSError when the address cannot be bound, ImportError without
        `cryptography`); `port` is the port bound."""
        context = self_signed_context(self.endpoint.address)
        app = web.Application()
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self.container_logs)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await runner.setup()
        family = socket.AF_INET6 if ":" in self.endpoint.address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.endpoint.address, self.endpoint.port))
            await web.SockSite(runner, sock, ssl_context=context).start()
        except BaseException:
            sock.close()
            await runner.cleanup()
            raise
        self.port = sock.getsockname()[1]
        self._runner = runner
        log.info("fakenodes.kubelet_port", address=self.endpoint.address, port=self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def container_logs(self, request: web.Request) -> web.StreamResponse:
        ns, name = request.match_info["namespace"], request.match_info["pod"]
        container = request.match_info["container"]
        pod = self.pod(ns, name)
        if pod is None:
            return _text(404, f'pod "{ns}/{name}" not found on these nodes')
        if container not in {c.name for c in pod.spec.containers}:
            return _text(404, f'container "{container}" not found in pod "{ns}/{name}"')
        if pod.status.phase == "Pending":
            return _text(
                400, f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating'
            )
        lines = container_logs(pod).get(container, [])
        tail = _tail_lines(request.query.get("tailLines"))
        follow = request.query.get("follow", "").lower() in ("true", "1")
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionResetError):
            first = 0 if tail is None else max(0, len(lines) - tail)
            await response.write("".join(f"{line}\n" for line in lines[first:]).encode())
            sent = len(lines)
            seen: Pod | None = pod
            while follow and seen is not None and seen.status.phase not in FINISHED:
                changed = self.changes()
                seen = self.pod(ns, name)
                if seen is None:
                    break
                now = container_logs(seen).get(container, [])
                if len(now) > sent:
                    await response.write("".join(f"{line}\n" for line in now[sent:]).encode())
                    sent = len(now)
                if seen.status.phase in FINISHED:
                    break
                try:
                    await asyncio.wait_for(changed.wait(), CHECK_SECONDS)
                except TimeoutError:
                    if _gone(request):
                        break
            await response.write_eof()
        return response

"""Load: many clients submitting jobs to a real `gpuyard serve` with its journal, then a SIGKILL.

Starts `python -m gpuyard.cli serve` (fake cluster `configs/clusters/demo.yaml`, journal in a
temporary data dir) as a subprocess and, from `--clients` concurrent httpx clients, POSTs
`--jobs` one-GPU PyTorchJobs (`POST /api/v1/jobs`). Meanwhile a separate poller asks `/healthz`
every 20 ms. Reports throughput, submit latency p50/p99, `/healthz` p99 during the load, errors
(non-2xx or failed requests: 0 expected), lost (an accepted job missing from the paginated
`GET /api/v1/jobs` afterwards: 0 expected) and the server's peak RSS (`VmHWM` of /proc).

Phase two does the same on a fresh data dir, but kills the server with SIGKILL once half the
jobs are accepted and starts it again on the same data dir; clients retry what failed while it
was down. `accepted_then_lost` (a 201 answer whose job is not listed after the restart) must
be 0. Targets (issue 15): p99 <= 250 ms, /healthz p99 <= 50 ms, peak RSS <= 1 GiB at 10,000 jobs.

Phase three (`hostile`, issue 26) starts a server with tokens and times single hostile requests
(a viewer's 3.6 MiB POST, a flat mapping of 350,000 keys, 20,000 merge keys, a 5,000-digit
integer, an XML body, a tenant's system priority class), then has `--tenants` tenants each send
3 bodies at the size limit at once (YAML of 350,000 keys and 4 MiB of JSON) while `/healthz` is
polled from a process of its own: its p99 during the burst (target < 50 ms), and the server's
RSS (VmRSS) before and 2 s after the burst (target: within 50 MiB), with the RSS of its body
decoding processes (`worker_rss_*_mib`; the burst starts once they are up and idle:
`waited_for_idle_decoders_s`). Then a valid body of 1,500 jobs (~720 KiB of JSON,
refused after decoding for an unknown priority class: nothing stored) is sent 3 times: answer
times and `/healthz` during them (`valid_body`), and what sending its decoded jobs back from a
decoding process costs, measured in this process (`decoded_transfer`: the pickle's size, the
worker's `dumps`, the server's `loads`, against decoding it in a thread of the server).

Usage: `python bench/load.py [--jobs 10000] [--clients 50] [--small] [--hostile-only]` (prints JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`gpuyard serve` on a loopback port with a journal in `data_dir`."""

    def __init__(
        self, data_dir: Path, *, log: Path, clock: str = "real", env: dict[str, str] | None = None
    ) -> None:
        self.env = env or {}
        self.data_dir = data_dir
        self.clock = clock
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUYARD__LOGGING__LEVEL": "warning", **self.env}
        cmd = [
            sys.executable, "-m", "gpuyard.cli", "serve", "--config", str(ROOT / "configs" / "gpuyard.yaml"),
            "--cluster", str(ROOT / "configs" / "clusters" / "demo.yaml"),
            "--host", "127.0.0.1", "--port", str(self.port), "--data-dir", str(self.data_dir),
            "--clock", self.clock,
        ]  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"gpuyard serve exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
                )
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("gpuyard serve did not get ready within 60 s")

    def peak_rss_mib(self) -> float:
        """The process's peak resident set (VmHWM), MiB."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def rss_mib(self) -> float:
        """The process's resident set now (VmRSS), MiB."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def children_rss_mib(self) -> dict[int, float]:
        """The resident set (VmRSS, MiB) of each child process of the server (its body decoders)."""
        assert self.proc is not None
        out: dict[int, float] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) != self.proc.pid:
                    continue
                for line in (entry / "status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        out[int(entry.name)] = round(int(line.split()[1]) / 1024, 1)
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
        return out

    def wait_for_idle_children(self, count: int, *, timeout_s: float = 20.0) -> float:
        """Wait until the server has `count` child processes (its body decoders) using no CPU for
        0.3 s (up and waiting for bodies, not importing); the seconds waited."""
        started = time.perf_counter()
        while time.perf_counter() - started < timeout_s:
            before = self._children_cpu()
            time.sleep(0.3)
            after = self._children_cpu()
            if len(after) >= count and after == before:
                break
        return round(time.perf_counter() - started, 1)

    def _children_cpu(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for pid in self.children_rss_mib():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                out[pid] = int(fields[11]) + int(fields[12])  # utime + stime
            except (OSError, ValueError, IndexError):
                continue
        return out

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)
            self.proc = None


def job(name: str) -> dict[str, Any]:
    container = {
        "name": "pytorch",
        "image": "train:1",
        "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "1", "memory": "2Gi"}},
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "load"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": {
                        "metadata": {"annotations": {"fake.gpuyard.io/duration": "2h"}},
                        "spec": {"containers": [container]},
                    },
                }
            }
        },
    }


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Run:
    latencies: list[float] = field(default_factory=list)
    health: list[float] = field(default_factory=list)
    accepted: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    retried: int = 0


async def _poll_health(server: Server, run: Run, stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=5) as client:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                r = await client.get(f"{server.url}/healthz")
                if r.status_code == 200:
                    run.health.append(time.perf_counter() - started)
            except httpx.HTTPError:
                pass  # down during a restart: not a latency
            await asyncio.sleep(0.02)


def _poll_health_process(url: str) -> None:
    """The `/healthz` poller in a process of its own (`--health-poller URL`): asks every 20 ms on
    one kept-alive connection until a line (or EOF) arrives on stdin, then prints the latencies
    (seconds, JSON). A process of its own so that the figure is the server's answer time, not
    the time this benchmark's own event loop, busy with 50 clients, takes to read the answer."""
    import http.client
    import threading
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    latencies: list[float] = []
    conn: http.client.HTTPConnection | None = None
    while not stop.is_set():
        started = time.perf_counter()
        try:
            if conn is None:
                conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=5)
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                latencies.append(time.perf_counter() - started)
        except (OSError, http.client.HTTPException):
            conn = None  # down during a restart: not a latency
        time.sleep(0.02)
    print(json.dumps(latencies))


class HealthPoller:
    """Runs :func:`_poll_health_process` beside the load; `stop()` returns its latencies."""

    def __init__(self, url: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--health-poller", url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def stop(self) -> list[float]:
        out, _ = self.proc.communicate(b"stop\n", timeout=30)
        return [float(x) for x in json.loads(out)]


async def _client(
    server: Server, names: asyncio.Queue[str], run: Run, *, down: asyncio.Event, retry: bool
) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        while True:
            try:
                name = names.get_nowait()
            except asyncio.QueueEmpty:
                return
            while True:
                await down.wait()  # the server is up
                started = time.perf_counter()
                try:
                    r = await client.post(f"{server.url}/api/v1/jobs", json=job(name))
                except httpx.HTTPError as exc:
                    if retry:
                        run.retried += 1
                        await asyncio.sleep(0.05)
                        continue
                    run.errors.append(f"{name}: {type(exc).__name__}")
                    break
                if r.status_code == 409 and retry:  # accepted before the kill, answer lost
                    run.accepted.add(name)
                    break
                if r.status_code not in (200, 201):
                    run.errors.append(f"{name}: HTTP {r.status_code} {r.text[:200]}")
                    break
                run.latencies.append(time.perf_counter() - started)
                run.accepted.add(name)
                break


def listed(server: Server, namespace: str = "load") -> set[str]:
    """The names of the jobs the server lists in `namespace`, every page."""
    names: set[str] = set()
    token: str | None = None
    with httpx.Client(base_url=server.url, timeout=60) as http:
        while True:
            params = {"namespace": namespace, "limit": "500"}
            if token:
                params["continue"] = token
            r = http.get("/api/v1/jobs", params=params)
            r.raise_for_status()
            body = r.json()
            names.update(item["metadata"]["name"] for item in body["items"])
            token = (body.get("metadata") or {}).get("continue")  # pages where the API paginates
            if not token:
                return names


async def _load(
    server: Server, *, jobs: int, clients: int, prefix: str, kill_at: int | None
) -> dict[str, Any]:
    run = Run()
    names: asyncio.Queue[str] = asyncio.Queue()
    for i in range(jobs):
        names.put_nowait(f"{prefix}-{i:05d}")
    up = asyncio.Event()
    up.set()
    stop = asyncio.Event()
    poller = asyncio.create_task(_poll_health(server, run, stop))
    apart = HealthPoller(server.url)
    started = time.perf_counter()
    workers = [
        asyncio.create_task(_client(server, names, run, down=up, retry=kill_at is not None))
        for _ in range(clients)
    ]
    restart_s = None
    rss_before = 0.0
    if kill_at is not None:
        while len(run.accepted) < kill_at and not all(w.done() for w in workers):  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # a plain poll: the clients add to a set
        rss_before = server.peak_rss_mib()
        server.kill()
        up.clear()  # clients wait: nothing is submitted while the server is down
        t0 = time.perf_counter()
        await asyncio.to_thread(server.start)
        restart_s = time.perf_counter() - t0
        up.set()
    await asyncio.gather(*workers)
    wall = time.perf_counter() - started
    stop.set()
    await poller
    health_apart = await asyncio.to_thread(apart.stop)
    rss = max(rss_before, server.peak_rss_mib())
    names = await asyncio.to_thread(listed, server)
    lost = sorted(run.accepted - names)
    out: dict[str, Any] = {
        "jobs": jobs,
        "clients": clients,
        "accepted": len(run.accepted),
        "errors": len(run.errors),
        "error_examples": run.errors[:3],
        "lost" if kill_at is None else "accepted_then_lost": len(lost),
        "wall_s": round(wall, 2),
        "throughput_per_s": round(len(run.latencies) / wall, 1) if wall else 0.0,
        "submit_p50_ms": round(_pct(run.latencies, 0.50) * 1000, 1),
        "submit_p99_ms": round(_pct(run.latencies, 0.99) * 1000, 1),
        "healthz_p50_ms": round(_pct(health_apart, 0.50) * 1000, 1),
        "healthz_p99_ms": round(_pct(health_apart, 0.99) * 1000, 1),
        "healthz_samples": len(health_apart),
        "healthz_p99_in_client_ms": round(_pct(run.health, 0.99) * 1000, 1),
        "peak_rss_mib": round(rss, 1),
    }
    if kill_at is not None:
        out |= {
            "killed_after_accepted": kill_at,
            "restart_s": round(restart_s or 0.0, 2),
            "retried": run.retried,
        }
    return out


# --- phase three: hostile bodies from tenants with tokens --------------------------------------

TENANT_TOKENS = [f"tenant-{i}-secret" for i in range(8)]
VIEWER_TOKEN = "viewer-secret"


def _tokens_env(tenants: int) -> dict[str, str]:
    import hashlib

    def entry(token: str, user: str, role: str, namespaces: list[str]) -> dict[str, Any]:
        digest = hashlib.sha256(token.encode()).hexdigest()
        return {"sha256": digest, "user": user, "role": role, "namespaces": namespaces}

    tokens = [entry(TENANT_TOKENS[i], f"t{i}", "user", [f"t{i}"]) for i in range(tenants)]
    tokens.append(entry(VIEWER_TOKEN, "viewer", "viewer", ["t0"]))
    return {"GPUYARD__SERVER__TOKENS": json.dumps(tokens)}


def _flat_yaml(keys: int = 350_000) -> bytes:
    return "".join(f"k{i}: v\n" for i in range(keys)).encode()


def _flat_json(limit: int) -> bytes:
    body, i = ["{"], 0
    size = 1
    while size < limit - 64:
        item = f'"key{i}": "value-{i}",'
        body.append(item)
        size += len(item)
        i += 1
    body.append('"end": 0}')
    return "".join(body).encode()


def _hostile_requests() -> list[tuple[str, str, bytes, str]]:
    """(what, token, body, content type) of the single hostile requests that are timed."""
    big_int = "9" * 5000
    system = json.dumps(job("sys") | {"metadata": {"name": "sys", "namespace": "t0"}})
    system = system.replace(
        '"spec": {',
        '"spec": {"runPolicy": {"schedulingPolicy": {"priorityClass": "system-node-critical"}}, ',
        1,
    )
    return [
        ("viewer_post_3_6_mib", VIEWER_TOKEN, _flat_yaml(), "application/yaml"),
        ("flat_mapping_350000_keys", TENANT_TOKENS[0], _flat_yaml(), "application/yaml"),
        (
            "merge_keys_20000",
            TENANT_TOKENS[0],
            ("a: &a {x: 1}\nb:\n" + "  <<: *a\n" * 20_000).encode(),
            "application/yaml",
        ),
        (
            "integer_5000_digits",
            TENANT_TOKENS[0],
            f"kind: PyTorchJob\nspec: {{x: {big_int}}}\n".encode(),
            "application/yaml",
        ),
        ("xml_body", TENANT_TOKENS[0], b"<job/>", "application/xml"),
        ("system_priority_class", TENANT_TOKENS[0], system.encode(), "application/json"),
    ]


async def _burst(server: Server, *, tenants: int, per_tenant: int, limit: int) -> dict[str, Any]:
    yaml_body, json_body = _flat_yaml(), _flat_json(limit)
    statuses: list[int] = []
    durations: list[float] = []

    async def tenant(i: int) -> None:
        headers = {"Authorization": f"Bearer {TENANT_TOKENS[i]}"}
        async with httpx.AsyncClient(timeout=120, headers=headers) as client:
            for n in range(per_tenant):
                body, kind = (
                    (yaml_body, "application/yaml") if (i + n) % 2 == 0 else (json_body, "application/json")
                )
                started = time.perf_counter()
                r = await client.post(
                    f"{server.url}/api/v1/jobs", content=body, headers={"Content-Type": kind}
                )
                durations.append(time.perf_counter() - started)
                statuses.append(r.status_code)

    apart = HealthPoller(server.url)
    await asyncio.sleep(0.5)  # a few samples before the burst too
    started = time.perf_counter()
    await asyncio.gather(*(tenant(i) for i in range(tenants)))
    wall = time.perf_counter() - started
    await asyncio.sleep(0.3)
    health = await asyncio.to_thread(apart.stop)
    return {
        "tenants": tenants,
        "bodies": len(statuses),
        "body_mib": [round(len(yaml_body) / 2**20, 2), round(len(json_body) / 2**20, 2)],
        "statuses": sorted(set(statuses)),
        "wall_s": round(wall, 2),
        "answer_p50_ms": round(_pct(durations, 0.5) * 1000, 1),
        "answer_max_ms": round(max(durations) * 1000, 1),
        "healthz_p50_ms": round(_pct(health, 0.50) * 1000, 1),
        "healthz_p99_ms": round(_pct(health, 0.99) * 1000, 1),
        "healthz_max_ms": round(max(health) * 1000, 1) if health else 0.0,
        "healthz_samples": len(health),
    }


def _decode_processes() -> int:
    """How many decoding processes the server starts (0 for a version without them)."""
    sys.path.insert(0, str(ROOT))
    try:
        from gpuyard.platform.api.decoders import DECODE_PROCESSES
    except ImportError:
        return 0
    return DECODE_PROCESSES


VALID_JOBS = 1500


def _valid_jobs(jobs: int = VALID_JOBS) -> bytes:
    """A JSON list of valid jobs in namespace t0 naming a priority class that does not exist: the
    whole body is decoded and validated, then refused (422), nothing stored."""
    docs = []
    for i in range(jobs):
        doc = job(f"v{i:05d}")
        doc["metadata"]["namespace"] = "t0"
        doc["spec"]["runPolicy"] = {"schedulingPolicy": {"priorityClass": "no-such-class"}}
        docs.append(doc)
    return json.dumps(docs).encode()


async def _valid_body(server: Server, body: bytes, *, sends: int = 3) -> dict[str, Any]:
    statuses: list[int] = []
    durations: list[float] = []
    apart = HealthPoller(server.url)
    await asyncio.sleep(0.5)
    headers = {"Authorization": f"Bearer {TENANT_TOKENS[0]}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=120, headers=headers) as client:
        for _ in range(sends):
            started = time.perf_counter()
            r = await client.post(f"{server.url}/api/v1/jobs", content=body)
            durations.append(time.perf_counter() - started)
            statuses.append(r.status_code)
    await asyncio.sleep(0.3)
    health = await asyncio.to_thread(apart.stop)
    return {
        "jobs": VALID_JOBS,
        "body_kib": len(body) // 1024,
        "statuses": sorted(set(statuses)),
        "answer_ms": [round(d * 1000) for d in durations],
        "healthz_p50_ms": round(_pct(health, 0.50) * 1000, 1),
        "healthz_p99_ms": round(_pct(health, 0.99) * 1000, 1),
        "healthz_max_ms": round(max(health) * 1000, 1) if health else 0.0,
        "healthz_samples": len(health),
    }


def _decoded_transfer(body: bytes, *, repeat: int = 3) -> dict[str, Any]:
    """The cost of the decoded jobs' round trip, in this process: the best of `repeat`."""
    import pickle

    sys.path.insert(0, str(ROOT))
    from gpuyard.platform.api.jobs import _decode_jobs

    text = body.decode()
    decode, dumps, loads = [], [], []
    data = b""
    for _ in range(repeat):
        started = time.perf_counter()
        decoded = _decode_jobs(
            text, json_body=True, max_bytes=4 * 1024 * 1024, limit_name="server.max_body_bytes"
        )
        decode.append(time.perf_counter() - started)
        started = time.perf_counter()
        data = pickle.dumps((True, decoded), protocol=pickle.HIGHEST_PROTOCOL)
        dumps.append(time.perf_counter() - started)
        started = time.perf_counter()
        pickle.loads(data)
        loads.append(time.perf_counter() - started)
    return {
        "jobs": VALID_JOBS,
        "decode_ms": round(min(decode) * 1000, 1),
        "result_kib": len(data) // 1024,
        "worker_dumps_ms": round(min(dumps) * 1000, 1),
        "server_loads_ms": round(min(loads) * 1000, 1),
    }


def _hostile(base: Path, log: Path, *, tenants: int) -> dict[str, Any]:
    server = Server(base / "hostile", log=log, env=_tokens_env(tenants))
    server.start()
    try:
        refusals: dict[str, Any] = {}
        with httpx.Client(base_url=server.url, timeout=120) as http:
            for what, token, body, kind in _hostile_requests():
                started = time.perf_counter()
                r = http.post(
                    "/api/v1/jobs",
                    content=body,
                    headers={"Authorization": f"Bearer {token}", "Content-Type": kind},
                )
                refusals[what] = {
                    "status": r.status_code,
                    "ms": round((time.perf_counter() - started) * 1000, 1),
                }
            stored = len(
                http.get("/api/v1/jobs", headers={"Authorization": f"Bearer {TENANT_TOKENS[0]}"}).json()[
                    "items"
                ]
            )
        time.sleep(1.0)
        waited = server.wait_for_idle_children(_decode_processes())
        rss_before, workers_before = server.rss_mib(), server.children_rss_mib()
        burst = asyncio.run(_burst(server, tenants=tenants, per_tenant=3, limit=4 * 1024 * 1024))
        time.sleep(2.0)
        rss_after, workers_after = server.rss_mib(), server.children_rss_mib()
        valid = _valid_jobs()
        valid_body = asyncio.run(_valid_body(server, valid))
        return {
            "refusals": refusals,
            "stored_after_refusals": stored,
            "burst": burst,
            "waited_for_idle_decoders_s": waited,
            "rss_before_mib": round(rss_before, 1),
            "rss_after_mib": round(rss_after, 1),
            "rss_growth_mib": round(rss_after - rss_before, 1),
            "worker_rss_before_mib": sorted(workers_before.values()),
            "worker_rss_after_mib": sorted(workers_after.values()),
            "worker_pids_kept": sorted(set(workers_before) & set(workers_after)) == sorted(workers_after),
            "valid_body": valid_body,
            "decoded_transfer": _decoded_transfer(valid),
        }
    finally:
        server.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--small", action="store_true", help="1,000 jobs from 20 clients (CI)")
    parser.add_argument("--health-poller", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--serve-log", type=Path, help="keep the servers' output in this file")
    parser.add_argument("--tenants", type=int, default=4, help="tenants sending size-limit bodies at once")
    parser.add_argument("--hostile-only", action="store_true", help="run only phase three (hostile bodies)")
    args = parser.parse_args()
    if args.health_poller:
        _poll_health_process(args.health_poller)
        return
    jobs, clients = (1000, 20) if args.small else (args.jobs, args.clients)
    out: dict[str, Any] = {
        "benchmark": "load",
        "targets": {"submit_p99_ms": 250, "healthz_p99_ms": 50, "peak_rss_mib": 1024},
    }
    if args.hostile_only:
        with tempfile.TemporaryDirectory(prefix="gpuyard-load-") as tmp:
            hostile = _hostile(Path(tmp), args.serve_log or Path(tmp) / "serve.log", tenants=args.tenants)
        print(json.dumps({"benchmark": "load", "hostile": hostile, "ok": _hostile_ok(hostile)}, indent=2))
        return
    with tempfile.TemporaryDirectory(prefix="gpuyard-load-") as tmp:
        base = Path(tmp)
        log = args.serve_log or base / "serve.log"
        out["hostile"] = _hostile(base, log, tenants=args.tenants)
        server = Server(base / "steady", log=log)
        server.start()
        try:
            out["steady"] = asyncio.run(_load(server, jobs=jobs, clients=clients, prefix="s", kill_at=None))
        finally:
            server.kill()
        server = Server(base / "killed", log=log)
        server.start()
        try:
            out["sigkill"] = asyncio.run(
                _load(server, jobs=jobs, clients=clients, prefix="k", kill_at=jobs // 2)
            )
        finally:
            server.kill()
    steady, killed = out["steady"], out["sigkill"]
    out["ok"] = (
        steady["errors"] == 0
        and steady["lost"] == 0
        and killed["accepted_then_lost"] == 0
        and killed["errors"] == 0
        and _hostile_ok(out["hostile"])
    )
    print(json.dumps(out, indent=2))
    if not out["ok"]:
        sys.exit(1)


def _hostile_ok(hostile: dict[str, Any]) -> bool:
    """Every hostile request refused (4xx, nothing stored) and no burst body accepted."""
    refused = all(400 <= r["status"] < 500 for r in hostile["refusals"].values())
    return (
        refused
        and hostile["stored_after_refusals"] == 0
        and all(s >= 400 for s in hostile["burst"]["statuses"])
        and hostile["valid_body"]["statuses"] == [422]
    )


if __name__ == "__main__":
    main()

"""Fault tests: a real `gpuyard serve` process, killed and started again on the same data dir."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`python -m gpuyard.cli serve --clock virtual` on a loopback port and a data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / "serve.log"

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        cmd = [
            sys.executable, "-m", "gpuyard.cli", "serve", "--config", str(ROOT / "configs" / "gpuyard.yaml"),
            "--cluster", str(ROOT / "configs" / "clusters" / "demo.yaml"), "--clock", "virtual",
            "--host", "127.0.0.1", "--port", str(self.port), "--data-dir", str(self.data_dir),
        ]  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gpuyard serve exited {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"gpuyard serve did not get ready:\n{self.log.read_text()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(timeout=10)
        self.proc = None

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "data")
    yield srv
    if srv.proc is not None:
        srv.kill()

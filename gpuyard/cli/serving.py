"""`gpuyard serve`, `gpuyard demo` and `gpuyard token hash`: the commands that run the platform.

`serve` runs it from the settings (fake or Kubernetes backend); `demo` serves the bundled demo
cluster and submits the sample jobs in `configs/demo` through the HTTP API, as a user would.
Imported only when one of these commands runs (`gpuyard.cli.lazy`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import signal
import sys
from pathlib import Path
from typing import Any

import click

from gpuyard.apis.devicematching import LABEL_GPU_MODEL
from gpuyard.cli.common import fail
from gpuyard.devices.scenarios import ScenarioError, load_scenario
from gpuyard.state.config import ConfigError, Settings, load_settings
from gpuyard.state.logs import configure_logging

__all__ = ["demo", "resolve_path", "serve", "token"]

DEMO_SCENARIO = "configs/clusters/demo.yaml"
DEMO_JOBS = "configs/demo"


def resolve_path(path: str) -> Path:
    """A path as given, else relative to the source checkout (for the bundled configs)."""
    p = Path(path)
    if p.exists() or p.is_absolute():
        return p
    bundled = Path(__file__).resolve().parents[2] / path
    return bundled if bundled.exists() else p


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def _serve(settings: Settings, *, banner: str | None = None, jobs: list[Path] | None = None) -> None:
    from gpuyard.platform.runtime import Platform

    scenario = None
    if settings.backend.kind == "fake":
        scenario = load_scenario(resolve_path(settings.backend.cluster))
    platform = Platform(settings, scenario=scenario)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, platform.stop)
    task = asyncio.create_task(platform.run())
    serving = asyncio.create_task(platform.serving.wait())
    done, _ = await asyncio.wait({task, serving}, return_when=asyncio.FIRST_COMPLETED)
    serving.cancel()
    if serving in done and jobs:
        await _submit_demo_jobs(platform, jobs)
        await _settle(platform.store, task)
    if serving in done and banner and not task.done():
        # last, after the start-up log lines, so it is the line on the user's screen
        click.echo(banner.format(url=platform.url), err=True)
    await task


async def _settle(store: Any, task: asyncio.Task[Any], *, quiet: float = 0.5, limit: float = 30.0) -> None:
    """Wait until the sample jobs' pods have started (none Pending) and the store has not changed
    for `quiet` seconds, so their log lines are written; at most `limit` seconds, or until the
    platform stops."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit
    last, since = store.resource_version, loop.time()
    while not task.done() and loop.time() < end:
        await asyncio.sleep(0.05)
        if store.resource_version != last:
            last, since = store.resource_version, loop.time()
        elif loop.time() - since >= quiet and not any(p.status.phase == "Pending" for p in store.list("Pod")):
            return


async def _submit_demo_jobs(platform: Any, files: list[Path]) -> None:
    """Submit the demo's sample jobs through the HTTP API, as a user would."""
    import aiohttp

    await platform.backend.synced.wait()
    models = {n.metadata.labels.get(LABEL_GPU_MODEL) for n in platform.store.list("Node")} - {None, ""}
    for _ in range(100):  # the default ResourceClass per GPU model appears right after start
        if platform.store.count("ResourceClass") >= len(models):
            break
        await asyncio.sleep(0.05)
    submitted = 0
    async with aiohttp.ClientSession() as http:
        for path in files:
            body = await asyncio.to_thread(path.read_bytes)
            async with http.post(
                f"{platform.url}/api/v1/jobs", data=body, headers={"Content-Type": "application/yaml"}
            ) as resp:
                if resp.status >= 300:
                    click.echo(f"demo: {path.name}: {(await resp.json())['error']['message']}", err=True)
                else:
                    submitted += 1
    click.echo(f"demo: submitted {submitted} sample jobs (gpuyard get jobs)", err=True)


def _run_server(settings: Settings, *, banner: str | None = None, jobs: list[Path] | None = None) -> None:
    configure_logging(level=settings.logging.level, fmt=settings.logging.format)
    if not settings.server.tokens:
        if not _is_loopback(settings.server.host) and not settings.server.insecure:
            fail(
                f"server.host: {settings.server.host} is not a loopback address and no API tokens are configured; "
                "pass --insecure to serve without authentication"
            )
        click.echo(
            f"note: no API tokens configured (server.tokens): every caller is admin"
            f"{'' if settings.server.insecure else '; serving on loopback only'}",
            err=True,
        )
    try:
        asyncio.run(_serve(settings, banner=banner, jobs=jobs))
    except (ConfigError, ScenarioError) as exc:
        fail(str(exc))
    except ExceptionGroup as group:
        match, rest = group.split(OSError)
        if match is None or rest is not None:
            raise
        first = match.exceptions[0]
        fail(
            f"cannot serve on {settings.server.host}:{settings.server.port}: {getattr(first, 'strerror', None) or first}",
            code=1,
        )


def _load(config: str | None, **sections: dict[str, Any]) -> Settings:
    try:
        return load_settings(
            config, **{k: v for k, v in sections.items() if any(x is not None for x in v.values())}
        )
    except ConfigError as exc:
        fail(str(exc))


@click.command()
@click.option(
    "--config", "config", type=click.Path(dir_okay=False), help="Config file (default configs/gpuyard.yaml)."
)
@click.option("--backend", type=click.Choice(["fake", "kubernetes"]), help="Cluster backend.")
@click.option("--cluster", help="Fake cluster scenario file.")
@click.option("--host", help="Address to bind (default 127.0.0.1).")
@click.option("--port", type=int, help="Port to bind (default 8080).")
@click.option("--data-dir", help="Journal directory (default ./.gpuyard).")
@click.option("--clock", type=click.Choice(["real", "virtual"]), help="Real or virtual time (fake backend).")
@click.option(
    "--insecure", is_flag=True, default=None, help="Allow a non-loopback address without API tokens."
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    help="Kubeconfig file (kubernetes backend; default $KUBECONFIG, then in-cluster).",
)
@click.option("--context", "kube_context", help="Kubeconfig context (kubernetes backend).")
def serve(
    config: str | None,
    backend: str | None,
    cluster: str | None,
    host: str | None,
    port: int | None,
    data_dir: str | None,
    clock: str | None,
    insecure: bool | None,
    kubeconfig: str | None,
    kube_context: str | None,
) -> None:
    """Run the platform: HTTP API, controllers, scheduler and the cluster backend.

    `--backend kubernetes --kubeconfig FILE` runs over a Kubernetes API server (docs/kubernetes.md).
    """
    settings = _load(
        config,
        server={"host": host, "port": port, "insecure": insecure},
        backend={"kind": backend, "cluster": cluster, "data_dir": data_dir, "clock": clock},
    )
    if kubeconfig is not None or kube_context is not None:
        kube = settings.backend.kubernetes.model_copy(
            update={
                k: v for k, v in {"kubeconfig": kubeconfig, "context": kube_context}.items() if v is not None
            }
        )
        settings = settings.model_copy(
            update={"backend": settings.backend.model_copy(update={"kubernetes": kube})}
        )
    _check_scenario(settings)
    _run_server(settings, banner="gpuyard serving on {url}")


def _check_scenario(settings: Settings) -> None:
    """Check the backend settings (kind, the fake cluster's scenario) before anything starts."""
    from gpuyard.platform.backends import plan_backend

    cluster = str(resolve_path(settings.backend.cluster))
    resolved = settings.model_copy(
        update={"backend": settings.backend.model_copy(update={"cluster": cluster})}
    )
    try:
        plan_backend(resolved)
    except (ConfigError, ScenarioError) as exc:
        fail(str(exc))


@click.command()
@click.option("--host", help="Address to bind (default: server.host of the settings, 127.0.0.1).")
@click.option("--port", type=int, help="Port to bind (default: server.port of the settings, 8080).")
@click.option(
    "--insecure", is_flag=True, default=None, help="Allow a non-loopback address without API tokens."
)
@click.option("--cluster", default=DEMO_SCENARIO, show_default=True, help="Scenario file.")
@click.option("--data-dir", default=None, help="Keep state in this directory (default: in memory).")
@click.option(
    "--jobs", "jobs", default=DEMO_JOBS, show_default=True, help="Folder of sample jobs to submit at start."
)
@click.option("--no-jobs", is_flag=True, help="Start with no sample jobs.")
def demo(
    host: str | None,
    port: int | None,
    insecure: bool | None,
    cluster: str,
    data_dir: str | None,
    jobs: str,
    no_jobs: bool,
) -> None:
    """Serve the bundled demo cluster, submit sample jobs, and print the URL.

    Host and port come from the settings (`configs/gpuyard.yaml`, then `GPUYARD__SERVER__HOST` /
    `GPUYARD__SERVER__PORT`), 127.0.0.1:8080 unless changed there; `--host` / `--port` win.
    """
    settings = _load(
        None,
        server={"host": host, "port": port, "insecure": insecure},
        backend={"kind": "fake", "cluster": cluster},
    )
    settings = settings.model_copy(
        update={"backend": settings.backend.model_copy(update={"data_dir": data_dir})}
    )
    _check_scenario(settings)
    jobs_dir = None if no_jobs else resolve_path(jobs)
    if jobs_dir is not None and not jobs_dir.is_dir():
        fail(f"--jobs: {jobs} is not a folder")
    files = sorted(jobs_dir.glob("*.yaml")) if jobs_dir is not None else []
    _run_server(
        settings, banner="gpuyard demo: open {url}/ (health: {url}/healthz) — Ctrl-C to stop", jobs=files
    )


@click.group()
def token() -> None:
    """API tokens."""


@token.command("hash")
@click.argument("value", required=False)
def token_hash(value: str | None) -> None:
    """Print the SHA-256 of a token (read from stdin when not given) for `server.tokens`."""
    from gpuyard.platform.api.auth import hash_token

    raw = value if value is not None else sys.stdin.readline().strip()
    if not raw:
        fail("no token given")
    click.echo(hash_token(raw))

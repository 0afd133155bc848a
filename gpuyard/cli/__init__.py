"""The `gpuyard` command line: `serve`, `demo`, `version`, and the client commands.

Exit codes: 0 success, 2 bad input (config, scenario, job file, flags), 1 server or network
errors. Bad input is reported as one line naming the file and field path.

Start-up is kept short (`gpuyard version` and `gpuyard get jobs` import neither the platform nor
the simulator): every command is named here by `"module:attribute"` and imported when it runs
(`gpuyard.cli.lazy.LazyGroup`). `bench/cli_startup.py` measures it.
"""

from __future__ import annotations

import click

from gpuyard.cli.lazy import LazyGroup

__all__ = ["main"]

_CLI = "gpuyard.cli"

_ROOT: dict[str, str] = {
    "serve": f"{_CLI}.serving:serve",
    "demo": f"{_CLI}.serving:demo",
    "token": f"{_CLI}.serving:token",
    "devices": f"{_CLI}.devices:devices",
    "validate": f"{_CLI}.validate:validate_command",
    "install": f"{_CLI}.install:install",
    "fake-nodes": f"{_CLI}.fakenodes:fake_nodes",
    "agent": f"{_CLI}.agent:agent_command",
    "submit": f"{_CLI}.jobs:submit",
    "logs": f"{_CLI}.logs:logs",
    "events": f"{_CLI}.cluster:events",
    "apply": f"{_CLI}.quotas:apply",
    "fault": f"{_CLI}.faults:fault",
    "fake-apiserver": f"{_CLI}.fakeapiserver:fake_apiserver",
    "control-plane": f"{_CLI}.controlplane:control_plane",  # register_control_plane's command
    "reschedule": f"{_CLI}.updates:reschedule",
    "check": f"{_CLI}.check:check",
}
"""Top-level commands, imported when run."""

_VERBS: dict[str, dict[str, str]] = {
    "get": {
        "jobs": f"{_CLI}.jobs:get_jobs",
        "pods": f"{_CLI}.jobs:get_pods",
        "nodes": f"{_CLI}.cluster:get_nodes",
        "resourceclasses": f"{_CLI}.cluster:get_resourceclasses",
        "quotas": f"{_CLI}.quotas:get_quotas",
        "queues": f"{_CLI}.quotas:get_queues",
        "priorityclasses": f"{_CLI}.updates:get_priority_classes",
        "crons": f"{_CLI}.crons:get_crons",
    },
    "describe": {
        "job": f"{_CLI}.jobs:describe_job",
        "node": f"{_CLI}.nodes:describe_node",
        "queue": f"{_CLI}.quotas:describe_queue",
        "cron": f"{_CLI}.crons:describe_cron",
    },
    "delete": {"job": f"{_CLI}.jobs:delete_job"},
    "top": {"nodes": f"{_CLI}.cluster:top_nodes"},
    "watch": {"jobs": f"{_CLI}.cluster:watch_jobs"},
    "suspend": {"job": f"{_CLI}.updates:suspend_job"},
    "resume": {"job": f"{_CLI}.updates:resume_job"},
    "patch": {"job": f"{_CLI}.updates:patch_job"},
}
"""Verb groups and their resource sub-commands (kubectl's aliases resolve in `LazyGroup`)."""

_VERB_HELP = {
    "get": "List objects: jobs, pods, nodes, queues, quotas, priority and resource classes, crons.",
    "describe": "Show one object in detail: a job, node, queue or cron.",
    "delete": "Delete an object.",
    "top": "Show resource use.",
    "watch": "Follow changes as they happen (Server-Sent Events).",
    "suspend": "Suspend an object: its pods stop and its GPUs are released.",
    "resume": "Resume a suspended object.",
    "patch": "Change an object after submit.",
}


@click.group(cls=LazyGroup, lazy=_ROOT, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """gpuyard: gang + topology scheduling, job queue and quota for AI training on GPU clusters."""


@main.command(name="version")
def version_cmd() -> None:
    """Print the gpuyard version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        click.echo(f"gpuyard {version('gpuyard')}")
    except PackageNotFoundError:
        click.echo("gpuyard (not installed)")


@main.group(
    cls=LazyGroup,
    lazy={"openb": "gpuyard.sim.openb_cli:openb", "replay": "gpuyard.sim.replay_cli:replay"},
)
def simulate() -> None:
    """Trace-driven simulations on the fake cluster."""


def _verb(name: str, commands: dict[str, str]) -> click.Group:
    def callback() -> None:
        pass

    return LazyGroup(name, callback=callback, lazy=commands, help=_VERB_HELP[name])


for _name, _commands in _VERBS.items():
    main.add_command(_verb(_name, _commands))

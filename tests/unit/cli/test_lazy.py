"""The command line's lazy command table: every command is there, `version` imports none of the
heavy parts, kubectl's resource names (singular, plural, short) reach the same command."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

import click
import pytest
from click.testing import CliRunner

from gpuyard.apis.jobspecs import JobConditionType
from gpuyard.cli import _ROOT, _VERBS, main
from gpuyard.cli.jobs import JOB_PHASES
from gpuyard.cli.lazy import RESOURCE_ALIASES, LazyGroup, _module_exists


def test_every_lazy_entry_names_a_click_command() -> None:
    ctx = click.Context(main)
    for name, target in _ROOT.items():
        if not _module_exists(target.partition(":")[0]):
            continue  # a command whose module this checkout lacks is not listed
        assert isinstance(main.get_command(ctx, name), click.Command), name
    for verb, commands in _VERBS.items():
        group = main.get_command(ctx, verb)
        assert isinstance(group, LazyGroup)
        for name in commands:
            assert isinstance(group.get_command(ctx, name), click.Command), f"{verb} {name}"


def test_version_imports_neither_the_platform_nor_the_simulator_nor_numpy() -> None:
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from gpuyard.cli import main\n"
        "r = CliRunner().invoke(main, ['version'])\n"
        "assert r.exit_code == 0 and r.output.startswith('gpuyard'), r.output\n"
        "heavy = ['numpy', 'gpuyard.platform', 'gpuyard.sim', 'gpuyard.scheduler', 'aiohttp', 'pydantic']\n"
        "print(' '.join(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_get_jobs_needs_no_job_models() -> None:
    code = (
        "import sys\n"
        "from gpuyard.cli import main\n"
        "import click\n"
        "main.get_command(click.Context(main), 'get').get_command(click.Context(main), 'jobs')\n"
        "print(' '.join(m for m in ['gpuyard.apis.jobs', 'pydantic', 'numpy'] if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_phase_choices_are_the_job_phases() -> None:
    assert JOB_PHASES == get_args(JobConditionType)


@pytest.mark.parametrize(
    ("verb", "names", "command"),
    [
        ("get", ["job", "jobs", "JOBS"], "get_jobs"),
        ("get", ["pod", "pods", "po"], "get_pods"),
        ("get", ["node", "nodes", "no"], "get_nodes"),
        ("get", ["queue", "queues"], "get_queues"),
        ("get", ["quota", "quotas"], "get_quotas"),
        ("get", ["pc", "priorityclass", "priorityclasses"], "get_priority_classes"),
        ("describe", ["job", "jobs"], "describe_job"),
        ("describe", ["node", "nodes", "no"], "describe_node"),
        ("describe", ["queue", "queues"], "describe_queue"),
        ("delete", ["job", "jobs"], "delete_job"),
        ("top", ["node", "nodes", "no"], "top_nodes"),
        ("watch", ["job", "jobs"], "watch_jobs"),
    ],
)
def test_singular_plural_and_short_names_reach_one_command(verb: str, names: list[str], command: str) -> None:
    ctx = click.Context(main)
    group = main.get_command(ctx, verb)
    assert isinstance(group, click.Group)
    found = {name: group.get_command(ctx, name) for name in names}
    assert all(c is not None and c.callback is not None for c in found.values()), found
    assert {c.callback.__name__ for c in found.values() if c and c.callback} == {command}


def test_an_unknown_resource_is_a_usage_error_listing_nothing_wrongly() -> None:
    result = CliRunner().invoke(main, ["get", "widgets"])
    assert result.exit_code == 2 and "No such command 'widgets'" in result.output
    assert "pods" in RESOURCE_ALIASES.values()


def test_help_lists_the_commands() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for name in ("serve", "demo", "version", "get", "logs", "submit", "validate", "simulate"):
        assert f"  {name} " in result.output, name

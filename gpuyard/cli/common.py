"""What every client command shares: one-line errors with exit codes, the `--server` /
`--token` / `-o` / `--validate` options, the server's warnings on stderr, reading YAML files, and
mounting sub-commands into the root group.

Exit codes: 2 for bad input (a 4xx answer, an unreadable or malformed file), 1 for server or
network errors (`ClientError.exit_code` carries which).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

import click

from gpuyard.cli.client import ApiClient, ClientError
from gpuyard.cli.output import OutputFormat

__all__ = [
    "KUBELET_PICKS_GPUS",
    "OUTPUTS",
    "call",
    "client_options",
    "fail",
    "mount",
    "print_warnings",
    "read_yaml_files",
    "split_ref",
    "validate_option",
]

OUTPUTS = OutputFormat()

KUBELET_PICKS_GPUS = (
    "GPUs are picked by the kubelet here (backend.kubernetes.gpu_resource: nvidia.com/gpu, count-only): "
    "the GPU indices below are the scheduler's; NVIDIA's device plugin chooses which GPUs a container gets"
)
"""What `describe job` and `describe node` say when the server answers `gpusPickedBy: kubelet`."""


def fail(message: str, code: int = 2) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def split_ref(ref: str, namespace: str | None = None, *, option: str = "") -> tuple[str, str]:
    """`NAMESPACE/NAME`, or a bare `NAME` in `namespace` (else `default`); a malformed one exits 2
    (its message names `option` when the reference came from one)."""
    if "/" not in ref:
        return namespace or "default", ref
    ns, _, name = ref.partition("/")
    if not ns or not name or "/" in name:
        fail(f"{option + ': ' if option else ''}{ref!r} is not NAMESPACE/NAME", 2)
    return ns, name


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(...)`, turning a client error into its one line and exit code."""
    try:
        return fn(*args, **kwargs)
    except ClientError as exc:
        fail(exc.message, exc.exit_code)


def client_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option(
        "--token", default=None, help="Bearer token (default $GPUYARD_TOKEN or the config file)."
    )(fn)
    fn = click.option(
        "--server",
        default=None,
        metavar="URL",
        help="gpuyard server (default $GPUYARD_SERVER, the config file, or http://127.0.0.1:8080).",
    )(fn)
    return click.option(
        "-o",
        "--output",
        type=OUTPUTS,
        default="table",
        show_default=True,
        help="Output format: table, wide, json, yaml, name or jsonpath=TEMPLATE (kubectl's).",
    )(fn)


def validate_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--validate strict|warn|ignore` (kubectl's): what the server does with unknown fields."""
    return click.option(
        "--validate",
        type=click.Choice(["strict", "warn", "ignore"], case_sensitive=False),
        default="warn",
        show_default=True,
        help="Unknown fields: strict refuses the request naming them, warn accepts it and prints "
        "a warning per field, ignore accepts it silently.",
    )(fn)


def print_warnings(client: ApiClient) -> None:
    """Print the server's `Warning` headers (unknown fields, ...) on stderr, one line each."""
    for text in client.warnings:
        click.echo(f"warning: {text}", err=True)


def read_yaml_files(files: Iterable[str]) -> list[tuple[str, str, list[Any]]]:
    """(file, text, documents) per file (`-` is stdin); an unreadable or malformed file fails
    with its name and the line and column of the problem."""
    import yaml

    from gpuyard.apis.decoding import DocumentLimitError, yaml_load_all

    out = []
    for name in files:
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_text()
        except OSError as exc:
            fail(f"{name}: cannot read: {exc.strerror or exc}")
        try:
            docs = [d for d in yaml_load_all(text) if d is not None]
        except DocumentLimitError as exc:
            fail(f"{name}: {exc.message}")
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
            fail(f"{name}{where}: not valid YAML or JSON: {getattr(exc, 'problem', None) or exc}")
        out.append((name, text, docs))
    return out


def mount(
    root: click.Group, *, commands: Iterable[click.Command] = (), groups: Iterable[click.Group] = ()
) -> None:
    """Add commands to the root group; a group whose name is taken is merged into the existing one."""
    for command in commands:
        root.add_command(command)
    for group in groups:
        existing = root.commands.get(group.name or "")
        if isinstance(existing, click.Group) and existing is not group:
            for name, cmd in group.commands.items():
                existing.add_command(cmd, name)
        else:
            root.add_command(group)

"""How client commands print: aligned tables, streamed rows that line up with their header, ages,
and kubectl's `-o table|wide|json|yaml|name|jsonpath=TEMPLATE`."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

__all__ = ["OUTPUT_FORMATS", "OutputFormat", "StreamRows", "age", "emit", "object_name", "table"]

OUTPUT_FORMATS = ("table", "wide", "json", "yaml", "name", "jsonpath=TEMPLATE")


if TYPE_CHECKING:
    _StrParamType = click.ParamType[str]
else:  # click.ParamType is generic from click 8.4 on; this package accepts 8.1 and later
    _StrParamType = click.ParamType


class OutputFormat(_StrParamType):
    """`-o`: one of `OUTPUT_FORMATS`; `jsonpath=` takes kubectl's template (quoted or not)."""

    name = "format"

    def get_metavar(self, param: click.Parameter, *args: Any) -> str:
        return "[table|wide|json|yaml|name|jsonpath=...]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if text in OUTPUT_FORMATS[:-1]:
            return text
        if text.startswith(("jsonpath=", "jsonpath-as-json=")):
            from gpuyard.cli.jsonpath import JsonPathError, parse

            template = text.partition("=")[2]
            if len(template) >= 2 and template[0] == template[-1] and template[0] in "'\"":
                template = template[1:-1]
            try:
                parse(template)
            except JsonPathError as exc:
                self.fail(str(exc), param, ctx)
            return f"jsonpath={template}"
        self.fail(
            f"{text!r} is not an output format; use one of {', '.join(OUTPUT_FORMATS)} "
            "(e.g. -o jsonpath='{.items[*].metadata.name}')",
            param,
            ctx,
        )


def table(headers: list[str], rows: list[list[Any]], *, keep_blank: bool = False) -> None:
    """Aligned columns; `None` prints as `-`, and so does `""` unless `keep_blank` (tree rows)."""
    cells = [["-" if c is None or (c == "" and not keep_blank) else str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    click.echo("   ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for r in cells:
        click.echo("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


class StreamRows:
    """Streamed table rows that line up with their header: each column is at least as wide as its
    header and its given default, and widens (for this row and the ones after) when a value is
    longer. `None` and `""` print as `-`."""

    def __init__(self, headers: list[str], widths: list[int] | None = None, *, header: bool = True) -> None:
        defaults = widths or [0] * len(headers)
        self.widths = [max(len(h), w) for h, w in zip(headers, defaults, strict=True)]
        if header:
            self.echo(headers)

    def line(self, cells: list[Any]) -> str:
        texts = ["-" if c is None or c == "" else str(c) for c in cells]
        self.widths = [max(w, len(c)) for w, c in zip(self.widths, texts, strict=True)]
        return "   ".join(c.ljust(w) for c, w in zip(texts, self.widths, strict=True)).rstrip()

    def echo(self, cells: list[Any]) -> None:
        click.echo(self.line(cells))


def object_name(obj: Any, kind: str | None = None) -> str:
    """kubectl's `-o name`: `KIND/NAME` (the kind lower-cased)."""
    if not isinstance(obj, dict):
        return str(obj)
    meta = obj.get("metadata") or {}
    name = meta.get("name") or obj.get("name") or "?"
    return f"{str(obj.get('kind') or kind or 'object').lower()}/{name}"


def emit(data: Any, output: str, render: Callable[[bool], None], *, kind: str | None = None) -> None:
    """JSON or YAML of `data`; its names (`-o name`); a JSONPath template applied to it (a list
    as kubectl's `List` object, so `{.items[*].metadata.name}` works); else `render(wide)`."""
    if output == "json":
        click.echo(json.dumps(data, indent=2))
    elif output == "yaml":
        import yaml

        click.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip())
    elif output == "name":
        for item in data if isinstance(data, list) else [data]:
            click.echo(object_name(item, kind))
    elif output.startswith("jsonpath="):
        from gpuyard.cli.jsonpath import JsonPathError
        from gpuyard.cli.jsonpath import render as render_path

        subject = {"apiVersion": "v1", "kind": "List", "items": data} if isinstance(data, list) else data
        try:
            click.echo(render_path(output.partition("=")[2], subject))
        except JsonPathError as exc:
            raise click.UsageError(f"-o jsonpath: {exc}") from None
    else:
        render(output == "wide")


def age(stamp: str | None) -> str:
    """`5s`, `3m`, `2h`, `4d` since an ISO timestamp; `-` when there is none."""
    if not stamp:
        return "-"
    try:
        then = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return "-"
    secs = max(0, int((datetime.now(UTC) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{secs}s"

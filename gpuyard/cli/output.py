"""How client commands print: aligned tables, ages, and `-o table|wide|json|yaml`."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import click
import yaml

__all__ = ["age", "emit", "table"]


def table(headers: list[str], rows: list[list[Any]], *, keep_blank: bool = False) -> None:
    """Aligned columns; `None` prints as `-`, and so does `""` unless `keep_blank` (tree rows)."""
    cells = [["-" if c is None or (c == "" and not keep_blank) else str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    click.echo("   ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for r in cells:
        click.echo("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def emit(data: Any, output: str, render: Callable[[bool], None]) -> None:
    """JSON or YAML of `data`, else `render(wide)` for `table` / `wide`."""
    if output == "json":
        click.echo(json.dumps(data, indent=2))
    elif output == "yaml":
        click.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip())
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

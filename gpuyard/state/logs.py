"""structlog set-up: console renderer on a terminal, JSON lines otherwise.

Console tracebacks never show local variables (rich would by default): a frame's locals can hold
a request's bearer token. `merge_contextvars` comes first so `structlog.contextvars.bind_contextvars(job=..., cycle=...)`
tags every line a component writes while handling that job or cycle.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

__all__ = ["configure_logging"]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def _traceback_formatter() -> structlog.typing.ExceptionRenderer:
    """Tracebacks without local variables: a frame's locals can hold a request's bearer token."""
    if structlog.dev.rich is not None:
        return structlog.dev.RichTracebackFormatter(show_locals=False)
    return structlog.dev.plain_traceback


def configure_logging(*, level: str = "info", fmt: Literal["auto", "console", "json"] = "auto") -> None:
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(exception_formatter=_traceback_formatter())
        if use_console
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info if not use_console else structlog.dev.set_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )

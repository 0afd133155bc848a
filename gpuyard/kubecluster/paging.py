"""LIST in pages, as client-go's pager (`k8s.io/client-go/tools/pager`) does.

:func:`list_pages` asks for `page_size` objects at a time (`limit`) and follows the server's
`continue` token, so no answer (and no buffer here) holds a whole large resource: every page is of
the first page's snapshot, and the list's resourceVersion (the one a watch resumes from) is the
first page's. A `continue` token that expired between two pages (410 Gone: the server compacted
the snapshot away) restarts the list from its first page, once; should that second list expire too,
the pager falls back to one unpaginated list (client-go's `FullListIfExpired`), which cannot
expire. Each restart is announced on the page it yields (`restarted`), so the caller forgets what
the aborted list gave (an informer clears the keys it saw). A 410 on a first page (no token) is
not an expired token: it goes to the caller.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from gpuyard.state.store import Gone

__all__ = ["DEFAULT_PAGE_SIZE", "FetchPage", "Page", "list_pages"]

DEFAULT_PAGE_SIZE = 500
PAGED_TRIES = 2  # paginated lists before the unpaginated one

log = structlog.get_logger(__name__)

# (limit or None for all, continue token or None) -> (items, the list's resourceVersion, next token)
FetchPage = Callable[[int | None, str | None], Awaitable[tuple[list[dict[str, Any]], str, str]]]


@dataclass(frozen=True)
class Page:
    """One answer of a LIST: its objects, the list's resourceVersion, and whether it starts the
    list over (what earlier pages gave belongs to an aborted list)."""

    items: list[dict[str, Any]]
    resource_version: str
    restarted: bool = False
    last: bool = False
    paginated: bool = True


async def list_pages(
    fetch: FetchPage, *, page_size: int = DEFAULT_PAGE_SIZE, what: str = ""
) -> AsyncIterator[Page]:
    """The pages of one LIST; see the module docstring."""
    tries = 0
    restarted = False
    while True:
        limit: int | None = page_size if tries < PAGED_TRIES else None
        token: str | None = None
        rv = ""
        try:
            while True:
                items, page_rv, token_next = await fetch(limit, token)
                rv = rv or page_rv
                last = not token_next or limit is None
                yield Page(items, rv, restarted=restarted, last=last, paginated=limit is not None)
                restarted = False
                if last:
                    return
                token = token_next
        except Gone as exc:
            if token is None or limit is None:
                raise  # not an expired continue token
            tries += 1
            restarted = True
            log.info(
                "list.continue_expired",
                resource=what,
                next="paginated list" if tries < PAGED_TRIES else "full list",
                error=str(exc),
            )

"""The LIST pager (`kubecluster/paging.py`): pages follow `continue`, the list's resourceVersion is
the first page's, an expired token restarts the list once and then falls back to one full list, and
a 410 that is not about a token goes to the caller."""

from __future__ import annotations

from typing import Any

import pytest

from gpuyard.kubecluster.paging import Page, list_pages
from gpuyard.state.store import Gone


class Server:
    """A resource of `n` objects served in pages; `expire` tokens answer 410 (one each)."""

    def __init__(self, n: int, *, expire: int = 0) -> None:
        self.names = [f"o{i:02d}" for i in range(n)]
        self.rv = 100
        self.expire = expire
        self.calls: list[tuple[int | None, str | None]] = []

    async def fetch(self, limit: int | None, token: str | None) -> tuple[list[dict[str, Any]], str, str]:
        self.calls.append((limit, token))
        if token is not None and self.expire > 0:
            self.expire -= 1
            self.rv += 10  # compacted, and written since: the next list is of a newer snapshot
            raise Gone("410 Expired: the provided continue parameter is too old")
        start = int(token.split(":")[1]) if token else 0
        end = len(self.names) if limit is None else start + limit
        items = [{"metadata": {"name": name}} for name in self.names[start:end]]
        rv = int(token.split(":")[0]) if token else self.rv
        more = end < len(self.names)
        return items, str(rv), f"{rv}:{end}" if more else ""


async def collect(server: Server, page_size: int) -> list[Page]:
    return [page async for page in list_pages(server.fetch, page_size=page_size)]


def names(pages: list[Page]) -> list[str]:
    """What a caller that forgets an aborted list's pages ends up with."""
    out: list[str] = []
    for page in pages:
        if page.restarted:
            out = []
        out += [item["metadata"]["name"] for item in page.items]
    return out


async def test_pages_follow_continue_with_the_first_page_s_version() -> None:
    server = Server(5)
    pages = await collect(server, 2)
    assert [len(p.items) for p in pages] == [2, 2, 1]
    assert names(pages) == ["o00", "o01", "o02", "o03", "o04"]
    assert {p.resource_version for p in pages} == {"100"}
    assert [p.last for p in pages] == [False, False, True]
    assert server.calls == [(2, None), (2, "100:2"), (2, "100:4")]


async def test_an_expired_token_restarts_the_list_from_its_first_page() -> None:
    server = Server(5, expire=1)
    pages = await collect(server, 2)
    assert names(pages) == ["o00", "o01", "o02", "o03", "o04"]
    assert [p.restarted for p in pages] == [False, True, False, False]
    assert pages[-1].resource_version == "110"  # the watch resumes from the new snapshot's version
    assert all(p.paginated for p in pages)
    assert server.calls[1:3] == [(2, "100:2"), (2, None)]


async def test_a_second_expired_token_falls_back_to_one_full_list() -> None:
    server = Server(5, expire=2)
    pages = await collect(server, 2)
    assert names(pages) == ["o00", "o01", "o02", "o03", "o04"]
    assert server.calls[-1] == (None, None)  # no limit: cannot expire
    assert pages[-1].restarted and not pages[-1].paginated and pages[-1].last
    assert pages[-1].resource_version == "120"


async def test_a_410_on_a_first_page_is_the_caller_s() -> None:
    async def gone(limit: int | None, token: str | None) -> tuple[list[dict[str, Any]], str, str]:
        raise Gone("410: too old resource version")

    with pytest.raises(Gone):
        _ = [page async for page in list_pages(gone, page_size=2)]

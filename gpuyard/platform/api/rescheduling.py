"""placeholder"""

from aiohttp import web


def setup(app: web.Application) -> None:
    pass

"""The HTTP API (aiohttp): `/api/v1/...`, `/healthz`, `/readyz`, `/metrics`.

`app.py` builds the application and the one error shape; each resource group adds its routes
from its own module (`jobs.py`, ...), registered in `app.ROUTE_MODULES`.
"""

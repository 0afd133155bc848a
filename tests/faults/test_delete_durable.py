"""An acknowledged delete survives a killed process (the write path waits for the journal)."""

from __future__ import annotations

import signal

import pytest

from tests.faults.conftest import Server
from tests.faults.test_restart import _submit, _wait_for_events

pytestmark = pytest.mark.faults


def test_a_deleted_job_stays_deleted_after_sigkill(server: Server) -> None:
    server.start()
    with server.client() as http:
        _submit(http, "doomed")
        _wait_for_events(http, "doomed")
        r = http.delete("/api/v1/namespaces/team-a/jobs/doomed")
        assert r.status_code == 200, r.text
    server.kill(signal.SIGKILL)  # at once: only what the journal held survives

    server.start()
    with server.client() as http:
        assert http.get("/api/v1/namespaces/team-a/jobs/doomed").status_code == 404
        assert all(j["metadata"]["name"] != "doomed" for j in http.get("/api/v1/jobs").json()["items"])

"""The restart-policy table (docs/jobs.md), one row per case."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpuyard.controllers.restarting import (
    Ending,
    ending_of,
    is_retryable,
    needs_new_placement,
    should_restart,
)
from gpuyard.fakecluster.kubelet import terminate
from tests.builders import make_pod

FAILED = "Failed"


@pytest.mark.parametrize(
    ("policy", "exit_code", "reason", "restart"),
    [
        # ExitCode: retryable signals and infrastructure reasons restart ...
        ("ExitCode", 130, None, True),
        ("ExitCode", 137, None, True),
        ("ExitCode", 138, None, True),
        ("ExitCode", 143, None, True),
        ("ExitCode", 137, "OOMKilled", True),
        ("ExitCode", None, "OOMKilled", True),
        ("ExitCode", None, "Evicted", True),
        ("ExitCode", None, "DeviceUnhealthy", True),
        ("ExitCode", None, "NodeLost", True),
        # ... every other exit code is permanent
        ("ExitCode", 1, "Error", False),
        ("ExitCode", 2, None, False),
        ("ExitCode", 126, None, False),
        ("ExitCode", 127, None, False),
        ("ExitCode", 128, None, False),
        ("ExitCode", 139, None, False),
        ("ExitCode", 255, None, False),
        ("ExitCode", 3, None, False),
        # OnFailure and Always restart any failure
        ("OnFailure", 1, None, True),
        ("OnFailure", 137, None, True),
        ("OnFailure", None, "NodeLost", True),
        ("Always", 2, None, True),
        # Never never restarts
        ("Never", 137, None, False),
        ("Never", None, "NodeLost", False),
        ("Never", 1, None, False),
    ],
)
def test_failed_pod(policy: str, exit_code: int | None, reason: str | None, restart: bool) -> None:
    assert should_restart(policy, Ending(FAILED, exit_code, reason)) is restart


@pytest.mark.parametrize(
    ("policy", "restart"), [("Always", True), ("OnFailure", False), ("Never", False), ("ExitCode", False)]
)
def test_succeeded_pod_restarts_only_under_always(policy: str, restart: bool) -> None:
    assert should_restart(policy, Ending("Succeeded", 0, "Completed")) is restart


@pytest.mark.parametrize("phase", ["Pending", "Running", "Unknown"])
def test_live_pods_are_never_restarted(phase: str) -> None:
    assert not should_restart("OnFailure", Ending(phase))


def test_retryable_and_placement() -> None:
    assert is_retryable(137, None) and is_retryable(None, "Evicted") and not is_retryable(1, "Error")
    assert needs_new_placement(Ending(FAILED, None, "NodeLost"))
    assert needs_new_placement(Ending(FAILED, None, "DeviceUnhealthy"))
    assert not needs_new_placement(Ending(FAILED, 137, "OOMKilled"))


def test_ending_reads_the_default_container() -> None:
    pod = make_pod("p")
    pod.spec.containers[0].name = "tensorflow"
    terminate(pod, exit_code=137, reason="OOMKilled", message=None, now=datetime.now(UTC))
    ending = ending_of(pod, container="tensorflow")
    assert ending == Ending(FAILED, 137, "OOMKilled")


@pytest.mark.parametrize(
    "reason", ["OutOfcpu", "OutOfmemory", "OutOfnvidia.com/gpu", "UnexpectedAdmissionError"]
)
@pytest.mark.parametrize("policy", ["Never", "OnFailure", "ExitCode", "Always"])
def test_a_pod_the_kubelet_refused_at_admission_is_placed_again_under_every_policy(
    policy: str, reason: str
) -> None:
    ending = Ending(phase="Failed", reason=reason)
    assert should_restart(policy, ending)
    assert needs_new_placement(ending)


def test_a_workload_failure_is_no_admission_rejection() -> None:
    assert not should_restart("Never", Ending(phase="Failed", exit_code=1, reason="Error"))
    assert not needs_new_placement(Ending(phase="Failed", exit_code=1, reason="Error"))

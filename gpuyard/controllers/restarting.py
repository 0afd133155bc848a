"""The restart-policy table: given a replica's policy and how its pod ended, restart or not.

Pure functions, used by the reconciler for every finished pod. The table (also in docs/jobs.md):

==========  =====================================================================================
Policy      A pod that ended ...
==========  =====================================================================================
Never       is never restarted; a failure fails the job.
OnFailure   is restarted after any failure (any exit code or reason).
Always      is restarted after any failure, and after success while the job is still running.
ExitCode    is restarted when the failure is *retryable*: exit code 130 (SIGINT), 137 (SIGKILL,
            e.g. OOM), 138 (SIGUSR1) or 143 (SIGTERM), or reason OOMKilled, Evicted,
            DeviceUnhealthy or NodeLost. Every other exit code (1, 2, 126, 127, 128, 139 (SIGSEGV),
            ...) is *permanent* and fails the job.
==========  =====================================================================================

Every restart, under every policy, counts against the job's `backoffLimit`. A failure whose
reason is NodeLost or DeviceUnhealthy also means the pod's placement is unusable: the restarted
pod is placed again (see `needs_new_placement`). A pod the kubelet refused at admission
(`OutOf<resource>`: another scheduler filled the node between gpuyard's decision and its binding)
never ran: it is restarted under every policy, Never included, and placed again.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuyard.apis.core import Pod

__all__ = [
    "INFRASTRUCTURE_REASONS",
    "PERMANENT_EXIT_CODES",
    "RETRYABLE_EXIT_CODES",
    "RETRYABLE_REASONS",
    "Ending",
    "ending_of",
    "is_retryable",
    "needs_new_placement",
    "should_restart",
]

RETRYABLE_EXIT_CODES = frozenset({130, 137, 138, 143})
RETRYABLE_REASONS = frozenset({"OOMKilled", "Evicted", "DeviceUnhealthy", "NodeLost"})
PERMANENT_EXIT_CODES = frozenset(
    {1, 2, 126, 127, 128, 139}
)  # documented examples; any other code is permanent too
INFRASTRUCTURE_REASONS = frozenset({"NodeLost", "DeviceUnhealthy"})
# The kubelet refused the pod at admission (it never started): `OutOf<resource>` when another
# scheduler filled the node first, and its other admission failures.
ADMISSION_REASONS = frozenset({"UnexpectedAdmissionError", "NodeAffinity", "NodeName", "InvalidNodeInfo"})


@dataclass(frozen=True, slots=True)
class Ending:
    """How a pod ended: its phase, the main container's exit code and the reason."""

    phase: str
    exit_code: int | None = None
    reason: str | None = None


def ending_of(pod: Pod, *, container: str | None = None) -> Ending:
    """The pod's ending as the reference operators read it: the default container's termination."""
    code: int | None = None
    reason = pod.status.reason
    statuses = pod.status.container_statuses
    chosen = [cs for cs in statuses if cs.name == container] or statuses
    for cs in chosen:
        term = cs.state.terminated or {}
        if cs.exit_code is not None:
            code = cs.exit_code
        elif "exitCode" in term:
            code = int(term["exitCode"])
        if code is not None:
            reason = reason or term.get("reason")
            break
    return Ending(phase=pod.status.phase, exit_code=code, reason=reason)


def is_retryable(exit_code: int | None, reason: str | None) -> bool:
    return (reason in RETRYABLE_REASONS) or (exit_code in RETRYABLE_EXIT_CODES)


def rejected_at_admission(ending: Ending) -> bool:
    """The kubelet refused the pod before it ran (`OutOfcpu`, `OutOfnvidia.com/gpu`, ...)."""
    reason = ending.reason or ""
    return ending.phase == "Failed" and (reason.startswith("OutOf") or reason in ADMISSION_REASONS)


def should_restart(policy: str, ending: Ending) -> bool:
    """Restart this replica? (Backoff limits are the caller's business.)"""
    if ending.phase == "Succeeded":
        return policy == "Always"
    if ending.phase != "Failed":
        return False
    if rejected_at_admission(ending):
        return True  # it never ran, whatever its policy: place it again
    if policy in ("OnFailure", "Always"):
        return True
    if policy == "ExitCode":
        return is_retryable(ending.exit_code, ending.reason)
    return False


def needs_new_placement(ending: Ending) -> bool:
    """The failure says the node or device is gone, or the node had no room for it: the
    replacement must be placed again."""
    return ending.reason in INFRASTRUCTURE_REASONS or rejected_at_admission(ending)

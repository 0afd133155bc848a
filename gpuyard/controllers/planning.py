"""Planning a reconcile pass: from what a job owns to what to write, as plain data.

The middle of the operator's three steps (observe -> plan -> apply). :func:`plan` is a pure
function of the job, its plugin, the :class:`~gpuyard.controllers.observing.Observed` snapshot
and the time; it returns a :class:`Plan` that `applying.py` carries out through the writer:

1. conditions first seen: Created; a finished job: clean up (cleanPodPolicy), delete its
   PodGroup (the scheduler then collects its Reservations), TTL; a suspended job: stop its pods
   and release every Reservation (`spec.release`), keep the job and its PodGroup;
2. finished pods through the restart-policy table (`restarting.py`, `judging.py`): restart
   (counted against `backoffLimit`, except a spot interruption), or end the job;
   `activeDeadlineSeconds`; a PodGroup the scheduler failed (`ScheduleTimeout`: not placed
   within `scheduleTimeoutSeconds`) fails the job with the same reason and an Event, and the
   finished path deletes the PodGroup;
3. a restarted pod that must move (host network, NodeLost/DeviceUnhealthy, its node or GPU no
   longer usable) gets its Reservation released and `spec.preferredNodes[pod]` = the node it ran
   on; the scheduler places it again. A pod the scheduler evicts (`status.evictions`: priority
   preemption, quota reclaim, migration) is stopped without counting a restart, then its
   Reservation released; a running pod whose Reservation vanished without a release (a lost
   node, a recreated PodGroup) is stopped likewise;
4. the PodGroup from the job (`podgroups.py`): created once any Reservations of an earlier gang
   of the same name are collected, its spec rebuilt when the job's generation changes, the
   release and failover requests added, done releases pruned;
5. one Service per held Reservation (host network: targetPort = the Reservation's host port),
   then, once the PodGroup's status says Placed, the pods of held Reservations, in start order
   (`ordering.py`), built by `materializing.py`;
6. delegate mode (`delegating.py`): once the PodGroup is Placed, the gang scheduler's own PodGroup
   (`apis/gangs.py`) is created before the pods that name it, its spec kept equal to the job's,
   and it is deleted when the job finishes or is suspended (or belongs to an earlier job of the
   same name).

The status (conditions, replica statuses, restart records) is written before anything is
deleted, so a crash never loses or double-counts a restart: each restart is recorded with the
uid of the failed pod it replaces.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime

from gpuyard.apis.core import Pod, Service
from gpuyard.apis.gangs import GangPodGroup
from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.jobspecs import PodRestart
from gpuyard.apis.priorityclasses import (
    PriorityClass,
    ResolvedPriority,
    missing_spot_class,
    resolve_priority,
)
from gpuyard.apis.scheduling import PodGroup, Reservation
from gpuyard.controllers.delegating import PodScheduling, gang_pod_group
from gpuyard.controllers.judging import Replica, judge, spot_interrupted, uncounted
from gpuyard.controllers.materializing import GPUYARD_PLACES, build_pod, build_service
from gpuyard.controllers.observing import Observed, job_owner_uid
from gpuyard.controllers.ordering import can_start, dependencies_of
from gpuyard.controllers.podgroups import (
    ANNOTATION_JOB_GENERATION,
    PodGroupChange,
    build_pod_group,
    pod_group_metadata,
    pod_group_spec,
)
from gpuyard.controllers.reporting import (
    PREEMPTED,
    Launch,
    Report,
    deadline_after,
    progress,
    replica_statuses,
    status_changes,
)
from gpuyard.controllers.restarting import Ending, needs_new_placement
from gpuyard.controllers.workloads.base import WorkloadPlugin

__all__ = ["ACTIVE", "MISSING_CLASS_RECHECK", "SCHEDULE_TIMEOUT", "Plan", "plan"]

ACTIVE = ("Pending", "Running", "Unknown")
MISSING_CLASS_RECHECK = 30.0
"""Seconds between looks at a job whose PriorityClass does not exist (a new class also wakes it)."""
SCHEDULE_TIMEOUT = "ScheduleTimeout"
"""The PodGroup status reason (and the job's Failed condition reason) of a gang not placed within
its `scheduleTimeoutSeconds`."""


@dataclass(slots=True)
class Plan:
    """What one pass writes, in the order `applying.py` writes it."""

    report: Report  # the status draft, its events and phase transitions
    status: dict[str, object] = field(default_factory=dict)  # job status fields to patch ({}: none)
    launch: Launch | None = None  # pods of the job run (launch-delay metrics)
    delete_pods: list[Pod] = field(default_factory=list)
    delete_services: list[str] = field(default_factory=list)
    delete_pod_group: PodGroup | None = None
    create_pod_group: PodGroup | None = None
    pod_group: PodGroupChange = field(default_factory=PodGroupChange)
    services: list[Service] = field(default_factory=list)  # to create or update, before the pods
    gang_group: GangPodGroup | None = None  # delegate mode: to create (no resourceVersion) or update
    delete_gang_group: GangPodGroup | None = None  # delegate mode: the job no longer needs it
    create_pods: list[Pod] = field(default_factory=list)
    held: dict[str, str] = field(default_factory=dict)  # pod name -> uid of each Reservation it may use
    requeue: float | None = None  # look again after this many seconds
    delete_job: bool = False  # ttlSecondsAfterFinished ran out


def plan(
    job: TrainingJob,
    *,
    plugin: WorkloadPlugin,
    observed: Observed,
    now: datetime,
    cluster_domain: str = "",
    scheduling: PodScheduling = GPUYARD_PLACES,
    priority_classes: Iterable[PriorityClass] = (),
) -> Plan:
    """Decide one pass for `job` (see the module docstring); `scheduling`: who places its pods; its
    priority is resolved through
    `priority_classes` (a job whose class is missing waits Queuing, its PodGroup not created or
    not changed, with a condition naming the class)."""
    obs = observed
    priority_classes = list(priority_classes)
    priority = resolve_priority(job, priority_classes)
    if priority.missing is None and (spot := missing_spot_class(job, priority_classes)) is not None:
        priority = replace(priority, missing=spot[0], field=spot[1])  # spot pods need theirs too
    report = Report(job, now)
    out = Plan(report)
    status = report.status
    out.delete_pods.extend(obs.stale_pods)
    out.delete_pod_group = obs.stale_group  # the gang of an earlier job of the same name
    gang = obs.gang_group
    if gang is not None and job_owner_uid(gang) not in (None, job.metadata.uid):
        out.delete_gang_group = gang  # an earlier job's: made again for this one once it is placed
    if status.condition("Created") is None:
        report.set("Created", reason=report.reason("Created"), message=f"{report.name} is created.")
    if status.finished:
        return _finished(out, job=job, obs=obs)
    if job.suspended:
        return _suspended(
            out, job=job, plugin=plugin, obs=obs, cluster_domain=cluster_domain, priority=priority
        )
    if status.is_true("Suspended"):
        status.start_time = None
        report.set(
            "Suspended", reason=report.reason("Resumed"), message=f"{report.name} is resumed.", true=False
        )
        status.phase = "Created"

    verdict = judge(job, plugin, status, obs.replicas, now)
    if verdict.terminal is not None:
        type_, reason, message = verdict.terminal
        status.completion_time = now
        report.set(type_, reason=reason, message=message, warning=type_ == "Failed")
        replica_statuses(job, status, replicas=obs.replicas)
        return _finished(out, job=job, obs=obs)

    pg = obs.pod_group
    if pg is not None and pg.status.phase == "Failed" and pg.status.reason == SCHEDULE_TIMEOUT:
        status.completion_time = now  # the scheduler gave up on the gang: the job fails
        report.set(
            "Failed",
            reason=SCHEDULE_TIMEOUT,
            message=f"{report.name} failed: {pg.status.message}",
            warning=True,
        )
        replica_statuses(job, status, replicas=obs.replicas)
        return _finished(out, job=job, obs=obs)
    released = pg.spec.release if pg is not None else {}  # asked for before: never used again
    evictions = pg.status.evictions if pg is not None else {}
    release: dict[str, str] = {}  # new requests of this pass
    moves: dict[str, str] = {}
    wanted = {r.name for r in obs.replicas}
    for name, res in obs.reservations.items():
        if name not in wanted and released.get(name) != res.metadata.uid:
            release[name] = res.metadata.uid  # scaled in: a replica no longer wanted
    restarted = _restart(out, job=job, obs=obs, restarts=verdict.restarts, release=release, moves=moves)
    held = {
        name: res
        for name, res in obs.reservations.items()
        if name in wanted
        and released.get(name) != res.metadata.uid
        and name not in release
        and name not in evictions
    }
    live = {r.name: r.pod for r in obs.replicas if r.pod is not None and r.name not in restarted}
    stopped = _stop_unplaced(out, obs, live=live, held=held, evictions=evictions)
    for name in evictions:  # stopped above (or already gone): the scheduler may take the devices back
        evicted = obs.reservations.get(name)
        if evicted is not None and released.get(name) != evicted.metadata.uid:
            release[name] = evicted.metadata.uid
    out.delete_pods.extend(obs.extra_pods)
    _gang(
        out,
        job=job,
        plugin=plugin,
        obs=obs,
        cluster_domain=cluster_domain,
        release=release,
        moves=moves,
        priority=priority,
    )
    out.held = {name: res.metadata.uid for name, res in held.items()}
    _services(out, job=job, plugin=plugin, obs=obs, held=held)
    _creates(
        out,
        job=job,
        plugin=plugin,
        obs=obs,
        live=live,
        held=held,
        cluster_domain=cluster_domain,
        scheduling=scheduling,
    )
    if scheduling.delegated:
        _delegated_gang(out, job=job, obs=obs, scheduling=scheduling)
    out.launch = progress(
        report,
        replicas=obs.replicas,
        live=live,
        pod_group=pg,
        restarting=bool(restarted or stopped),
    )
    if priority.missing is not None and pg is None and status.phase in ("", "Created", "Queuing"):
        report.set(
            "Queuing",
            reason="PriorityClassNotFound",
            message=f"{report.name} is queuing: PriorityClass {priority.missing!r} ({priority.field}) "
            "does not exist; create it to go on.",
            warning=True,
        )
    replica_statuses(job, status, replicas=obs.replicas, live=live)
    out.status = status_changes(job.status, status, now=now)
    out.requeue = deadline_after(job, status, now=now)
    if priority.missing is not None:
        out.requeue = min(out.requeue or MISSING_CLASS_RECHECK, MISSING_CLASS_RECHECK)
    return out


# --- restarts and lost placements ------------------------------------------------------------


def _restart(
    out: Plan,
    *,
    job: TrainingJob,
    obs: Observed,
    restarts: list[tuple[Replica, Ending]],
    release: dict[str, str],
    moves: dict[str, str],
) -> set[str]:
    """Record and stop the replicas to restart; release the placements they cannot keep."""
    if not restarts:
        return set()
    report = out.report
    status = report.status
    per_role: dict[str, int] = {}
    exited_ok = 0
    counted = False  # `status.restarts` counts job failures: pods failing together count once
    for rep, ending in restarts:
        assert rep.pod is not None
        if uncounted(status, rep):
            record = status.pod_restarts.setdefault(rep.name, PodRestart())
            record.count += 1
            record.last_uid = rep.pod.metadata.uid
            spot = spot_interrupted(job, rep, ending)  # never counted against backoffLimit
            if not counted and not spot:
                status.restarts += 1
                counted = True
            pod_ref = f"Pod: {rep.pod.metadata.namespace}.{rep.name}"
            if ending.exit_code is not None:
                why = f" ({ending.reason})" if ending.reason not in (None, "Error", "Completed") else ""
                report.note("ExitedWithCode", f"{pod_ref} exited with code {ending.exit_code}{why}")
            elif ending.reason:  # no exit code: the kubelet's reason (DeviceUnhealthy, NodeLost, Evicted)
                detail = rep.pod.status.message
                report.note(
                    ending.reason,
                    f"{pod_ref} failed: {ending.reason}"
                    + (f" ({detail})" if detail else "")
                    + ("; a spot interruption, not counted against backoffLimit" if spot else ""),
                    warning=True,
                )
        out.delete_pods.append(rep.pod)
        if ending.phase == "Failed":
            per_role[rep.role] = per_role.get(rep.role, 0) + 1
        else:
            exited_ok += 1
        res = rep.reservation
        if job.host_network or needs_new_placement(ending) or (res is not None and rep.name in obs.unusable):
            if res is not None:
                release[rep.name] = res.metadata.uid
            node = res.spec.node if res is not None else rep.pod.spec.node_name
            if node:
                moves[rep.name] = node
    if per_role:
        parts = ", ".join(f"{n} {role}" for role, n in per_role.items())
        message = f"{report.name} is restarting because {parts} replica(s) failed."
    else:
        message = (
            f"{report.name} is restarting because {exited_ok} replica(s) exited and restartPolicy is Always."
        )
    report.restarting(message)
    return {rep.name for rep, _ in restarts}


def _stop_unplaced(
    out: Plan,
    obs: Observed,
    *,
    live: dict[str, Pod],
    held: dict[str, Reservation],
    evictions: dict[str, str],
) -> bool:
    """Stop the active pods that have no Reservation to keep: evicted, or placement lost."""
    preempted: list[str] = []
    lost: list[str] = []
    for rep in obs.replicas:
        pod = live.get(rep.name)
        if pod is None or rep.name in held or pod.status.phase not in ACTIVE:
            continue
        out.delete_pods.append(pod)
        del live[rep.name]
        (preempted if rep.name in evictions else lost).append(rep.name)
    if not (preempted or lost):
        return False
    report = out.report
    if preempted and not lost and not live:
        # nothing of the job runs any more: it waits to be placed again, for the preemption's sake
        why = "; ".join(dict.fromkeys(evictions[n] for n in preempted if evictions[n]))
        report.set(
            "Queuing",
            reason=PREEMPTED,
            message=f"{report.name} is queuing again: {len(preempted)} replica(s) were preempted"
            + (f" ({why})" if why else "")
            + f": {', '.join(preempted)}.",
            warning=True,
            force_event=True,
        )
        return True
    parts = []
    if preempted:
        why = "; ".join(dict.fromkeys(evictions[n] for n in preempted if evictions[n]))
        parts.append(
            f"{len(preempted)} replica(s) were preempted"
            + (f" ({why})" if why else "")
            + f": {', '.join(preempted)}"
        )
    if lost:
        parts.append(f"{len(lost)} replica(s) lost their placement: {', '.join(lost)}")
    report.restarting(f"{report.name} is restarting because {' and '.join(parts)}.")
    return True


# --- gang, services, pods ---------------------------------------------------------------------


def _gang(
    out: Plan,
    *,
    job: TrainingJob,
    plugin: WorkloadPlugin,
    obs: Observed,
    cluster_domain: str,
    release: dict[str, str],
    moves: dict[str, str],
    priority: ResolvedPriority | None = None,
) -> None:
    """Create the PodGroup, or plan the change of its spec (job generation, requests). A job
    whose PriorityClass is missing gets no PodGroup and no new spec until the class exists."""
    pg = obs.pod_group
    generation = str(job.metadata.generation)
    missing = priority is not None and priority.missing is not None
    if pg is None:
        if not obs.leftovers and obs.stale_group is None and not missing:  # an earlier gang's is not ours
            out.create_pod_group = build_pod_group(
                job, plugin, cluster_domain=cluster_domain, preferred_nodes=moves, priority=priority
            )
        return
    respec = pg.metadata.annotations.get(ANNOTATION_JOB_GENERATION) != generation and not missing
    existing = {name: res.metadata.uid for name, res in obs.reservations.items()}
    labels, annotations = pod_group_metadata(job)
    carried = {k: v for k, v in pg.metadata.annotations.items() if k != ANNOTATION_JOB_GENERATION}
    relabel = labels != pg.metadata.labels or annotations != carried  # the job's labels were patched
    out.pod_group = PodGroupChange(
        spec=pod_group_spec(job, plugin, cluster_domain=cluster_domain, priority=priority)
        if respec
        else None,
        generation=generation,
        preferred=moves,
        release=release,
        existing=existing,
        prune=any(existing.get(pod) != uid for pod, uid in pg.spec.release.items()),
        metadata=(labels, annotations) if relabel else None,
    )


def _reserved_port(job: TrainingJob, res: Reservation) -> int | None:
    """The host port the scheduler reserved for a host-network pod."""
    return res.spec.host_ports[0] if job.host_network and res.spec.host_ports else None


def _services(
    out: Plan, *, job: TrainingJob, plugin: WorkloadPlugin, obs: Observed, held: dict[str, Reservation]
) -> None:
    """One Service per held replica, written when it differs (before its pod: the targetPort)."""
    for rep in obs.replicas:
        res = held.get(rep.name)
        if res is None:
            continue
        desired = build_service(job, rep.role, rep.index, plugin=plugin, host_port=_reserved_port(job, res))
        current = obs.services.get(rep.name)
        if (
            current is None
            or current.spec != desired.spec
            or current.metadata.labels != desired.metadata.labels
        ):
            out.services.append(desired)


def _creates(
    out: Plan,
    *,
    job: TrainingJob,
    plugin: WorkloadPlugin,
    obs: Observed,
    live: dict[str, Pod],
    held: dict[str, Reservation],
    cluster_domain: str,
    scheduling: PodScheduling,
) -> None:
    """The pods to create now: the gang is Placed (its minimum before any pod starts), start order."""
    pg = obs.pod_group
    if pg is None or pg.status.phase != "Placed":
        return
    wanted = [r for r in obs.replicas if r.name in held and r.name not in live]
    if not wanted:
        return
    started = out.report.status.start_time is not None or bool(live)
    if not started and len(held) < max(1, pg.spec.minimum()):
        return  # the whole gang (its minimum) is placed before any pod starts
    deps = dependencies_of(job, plugin)
    replicas = {r: s.count for r, s in job.replica_specs.items()}
    phases: dict[str, dict[int, str]] = {}
    for rep in obs.replicas:
        pod = live.get(rep.name)
        if pod is not None:
            phases.setdefault(rep.role, {})[rep.index] = pod.status.phase
    for rep in wanted:
        # a gang scheduler places a group only once its minimum of pods exists: no start order then
        if scheduling.delegated or can_start(rep.role, deps=deps, replicas=replicas, phases=phases):
            res = held[rep.name]
            out.create_pods.append(
                build_pod(
                    job,
                    rep.role,
                    rep.index,
                    plugin=plugin,
                    reservation=res,
                    host_port=_reserved_port(job, res),
                    cluster_domain=cluster_domain,
                    peers=held,
                    scheduling=scheduling,
                )
            )


def _delegated_gang(out: Plan, *, job: TrainingJob, obs: Observed, scheduling: PodScheduling) -> None:
    """Delegate mode: the gang scheduler's PodGroup exists, as the job says, once gpuyard placed the gang."""
    pg = obs.pod_group
    if pg is None or pg.status.phase != "Placed" or out.delete_gang_group is not None:
        return
    desired = gang_pod_group(job, pg.spec, scheduling=scheduling)
    current = obs.gang_group
    if current is None:
        out.gang_group = desired
        return
    if current.api_version != desired.api_version:  # another gang scheduler was configured
        out.delete_gang_group = current
        return
    # only the fields gpuyard sets: what the gang scheduler's webhooks default stays theirs
    wanted = desired.spec.model_dump(by_alias=False, exclude_none=True)
    have = current.spec.model_dump(by_alias=False)
    if any(have.get(k) != v for k, v in wanted.items()):
        changed = current.clone()
        changed.spec = current.spec.model_copy(update=wanted)
        out.gang_group = changed


def _drop_gang_group(out: Plan, obs: Observed) -> None:
    if obs.gang_group is not None:
        out.delete_gang_group = obs.gang_group


# --- suspension and completion ------------------------------------------------------------------


def _suspended(
    out: Plan,
    *,
    job: TrainingJob,
    plugin: WorkloadPlugin,
    obs: Observed,
    cluster_domain: str,
    priority: ResolvedPriority,
) -> Plan:
    """Stop every pod and release every Reservation; the job and its PodGroup (spec.suspend) stay."""
    report = out.report
    status = report.status
    if not status.is_true("Suspended"):
        status.start_time = None
        report.set("Suspended", reason=report.reason("Suspended"), message=f"{report.name} is suspended.")
    replica_statuses(job, status, replicas=obs.replicas, live={})
    out.delete_pods.extend(r.pod for r in obs.replicas if r.pod is not None)
    out.delete_pods.extend(obs.extra_pods)
    release = {name: res.metadata.uid for name, res in obs.reservations.items()}
    _drop_gang_group(out, obs)
    _gang(
        out,
        job=job,
        plugin=plugin,
        obs=obs,
        cluster_domain=cluster_domain,
        release=release,
        moves={},
        priority=priority,
    )
    out.status = status_changes(job.status, status, now=report.now)
    return out


def _finished(out: Plan, *, job: TrainingJob, obs: Observed) -> Plan:
    """cleanPodPolicy, the PodGroup deleted (its Reservations go with it), TTL."""
    report = out.report
    status = report.status
    now = report.now
    policy = job.run_policy.clean_pod_policy or "Running"
    for pod in [*(r.pod for r in obs.replicas if r.pod is not None), *obs.extra_pods]:
        if policy == "All" or (policy == "Running" and pod.status.phase in ACTIVE):
            out.delete_pods.append(pod)
            if pod.metadata.name in obs.services:
                out.delete_services.append(pod.metadata.name)
    if obs.pod_group is not None:
        out.delete_pod_group = obs.pod_group
    _drop_gang_group(out, obs)
    out.status = status_changes(job.status, status, now=now)
    ttl = job.run_policy.ttl_seconds_after_finished
    if ttl is not None:
        remaining = (status.completion_time or now).timestamp() + ttl - now.timestamp()
        if remaining > 0:
            out.requeue = remaining
        else:
            out.delete_job = True
    return out

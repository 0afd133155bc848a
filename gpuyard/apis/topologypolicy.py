"""A job's topology policy: wait for one node (or network block), or split over several.

A job chooses, with annotations on the job (copied by the operator to its PodGroup):

* `gpuyard.io/topology-policy`: `required` (wait until one node/block has room for the whole
  gang; with `gpuyard.io/topology-wait` only that long, then placed as `preferred` and its status
  says why), `preferred` (the closest placement available now, split if it must: what gpuyard has
  always done), or `none` (no topology wait at all);
* `gpuyard.io/topology-level`: `node` (one node, the label `kubernetes.io/hostname`) or `block`
  (one network block, the label `topology.gpuyard.io/block`); default `node`;
* `gpuyard.io/topology-wait`: a duration (`90s`, `5m`, `300`) bounding the wait of `required`.

Kueue's topology-aware scheduling annotations are read too, on a role's pod template:
`kueue.x-k8s.io/podset-required-topology` / `kueue.x-k8s.io/podset-preferred-topology`, whose
value is the label key of the level (`kubernetes.io/hostname` or `topology.gpuyard.io/block`).
The operator copies them to the PodGroup (:func:`kueue_podgroup_annotations`); the job's own
`gpuyard.io/topology-policy` wins over them.

A gang of one-GPU workers that states no policy waits for one node for the scheduler's
`scheduler.topology_wait_seconds` before it splits (the scheduler's part: `cycle/topowait.py`).

:func:`topology_policy_problems` is the submit-time check (`[{field, reason}]`, naming the
annotation and what is allowed); :func:`parse_topology_policy` the scheduler's reading, which
raises ValueError with the same words.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuyard.apis.devicematching import LABEL_BLOCK
from gpuyard.apis.durations import parse_duration

__all__ = [
    "ANNOTATION_TOPOLOGY_LEVEL",
    "ANNOTATION_TOPOLOGY_POLICY",
    "ANNOTATION_TOPOLOGY_WAIT",
    "KUEUE_PREFERRED",
    "KUEUE_REQUIRED",
    "LABEL_HOSTNAME",
    "TopologyPolicy",
    "TopologyPolicyError",
    "kueue_podgroup_annotations",
    "parse_topology_policy",
    "topology_policy_problems",
]

ANNOTATION_TOPOLOGY_POLICY = "gpuyard.io/topology-policy"
ANNOTATION_TOPOLOGY_LEVEL = "gpuyard.io/topology-level"
ANNOTATION_TOPOLOGY_WAIT = "gpuyard.io/topology-wait"
KUEUE_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
LABEL_HOSTNAME = "kubernetes.io/hostname"

POLICIES = ("required", "preferred", "none")
LEVELS = ("node", "block")
_LEVEL_OF_LABEL = {LABEL_HOSTNAME: "node", LABEL_BLOCK: "block"}
_KEYS = (
    ANNOTATION_TOPOLOGY_POLICY,
    ANNOTATION_TOPOLOGY_LEVEL,
    ANNOTATION_TOPOLOGY_WAIT,
    KUEUE_REQUIRED,
    KUEUE_PREFERRED,
)


class TopologyPolicyError(ValueError):
    """A bad topology annotation: `annotation` and what is allowed (`reason`)."""

    def __init__(self, annotation: str, reason: str) -> None:
        super().__init__(f"{annotation}: {reason}")
        self.annotation = annotation
        self.reason = reason


@dataclass(frozen=True, slots=True)
class TopologyPolicy:
    """What a job asked of its topology: `policy` None when it said nothing (the scheduler's
    default then applies); `wait` seconds `required` waits (None: as long as it takes)."""

    policy: str | None = None
    level: str = "node"
    wait: float | None = None
    source: str = ""
    """The annotation the policy came from (for messages)."""


def _kueue(annotations: Mapping[str, str]) -> tuple[str, str, str] | None:
    """(policy, level, annotation) from Kueue's annotations; TopologyPolicyError for another label key."""
    for key, policy in ((KUEUE_REQUIRED, "required"), (KUEUE_PREFERRED, "preferred")):
        raw = annotations.get(key)
        if raw is None:
            continue
        level = _LEVEL_OF_LABEL.get(raw.strip())
        if level is None:
            raise TopologyPolicyError(key, f"must be one of {', '.join(_LEVEL_OF_LABEL)}, got {raw!r}")
        return policy, level, key
    return None


def parse_topology_policy(annotations: Mapping[str, str]) -> TopologyPolicy:
    """The topology policy the annotations ask for (see the module docstring).

    Raises :class:`TopologyPolicyError` for a bad value: the annotation and what is allowed."""
    raw = annotations.get(ANNOTATION_TOPOLOGY_POLICY)
    level_raw = annotations.get(ANNOTATION_TOPOLOGY_LEVEL)
    wait_raw = annotations.get(ANNOTATION_TOPOLOGY_WAIT)
    policy: str | None = None
    level = "node"
    source = ""
    if raw is not None:
        policy = raw.strip().lower()
        if policy not in POLICIES:
            raise TopologyPolicyError(
                ANNOTATION_TOPOLOGY_POLICY, f"must be one of {', '.join(POLICIES)}, got {raw!r}"
            )
        source = ANNOTATION_TOPOLOGY_POLICY
    if level_raw is not None:
        level = level_raw.strip().lower()
        if level not in LEVELS:
            raise TopologyPolicyError(
                ANNOTATION_TOPOLOGY_LEVEL,
                f"must be one of node ({LABEL_HOSTNAME}), block ({LABEL_BLOCK}), got {level_raw!r}",
            )
    kueue = _kueue(annotations)
    if policy is None and kueue is not None:
        policy, level, source = kueue
    wait: float | None = None
    if wait_raw is not None:
        try:
            wait = parse_duration(wait_raw)
        except ValueError as exc:
            raise TopologyPolicyError(ANNOTATION_TOPOLOGY_WAIT, str(exc)) from None
    return TopologyPolicy(policy, level, wait, source)


def topology_policy_problems(annotations: Mapping[str, object], prefix: str) -> list[dict[str, str]]:
    """`[{field, reason}]` for topology-policy annotations among `annotations` that are not valid."""
    if not any(k in annotations for k in _KEYS):
        return []
    text = {k: v for k, v in annotations.items() if isinstance(v, str)}
    try:
        parse_topology_policy(text)
    except TopologyPolicyError as exc:
        return [{"field": f"{prefix}.annotations.{exc.annotation}", "reason": exc.reason}]
    if KUEUE_REQUIRED in text and KUEUE_PREFERRED in text:
        return [
            {
                "field": f"{prefix}.annotations.{KUEUE_PREFERRED}",
                "reason": f"give {KUEUE_REQUIRED} or {KUEUE_PREFERRED}, not both",
            }
        ]
    return []


def kueue_podgroup_annotations(templates: Iterable[Mapping[str, object]]) -> dict[str, str]:
    """Kueue's topology annotations of a job's role pod templates, as one for its PodGroup (a
    gang is placed as one): required when any role requires, at the tightest level asked."""
    required: list[str] = []
    preferred: list[str] = []
    for ann in templates:
        for key, into in ((KUEUE_REQUIRED, required), (KUEUE_PREFERRED, preferred)):
            value = ann.get(key)
            if isinstance(value, str) and value.strip() in _LEVEL_OF_LABEL:
                into.append(value.strip())
    chosen, key = (required, KUEUE_REQUIRED) if required else (preferred, KUEUE_PREFERRED)
    if not chosen:
        return {}
    return {key: LABEL_HOSTNAME if LABEL_HOSTNAME in chosen else chosen[0]}

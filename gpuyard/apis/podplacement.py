"""Pod placement rules a pod template asks for: inter-pod (anti-)affinity and topology spread.

Kubernetes' `affinity.podAffinity`, `affinity.podAntiAffinity` and `topologySpreadConstraints`
(core/v1), parsed once per pod template into frozen, hashable values the gang scheduler's
`inter-pod-affinity` and `pod-topology-spread` plugins read. The pod models keep these fields as
written (they are `extra` fields of `PodSpec` and `Affinity`), so a pod made from the template
carries them unchanged; this module only reads them.

* :class:`LabelSelector` — `matchLabels` + `matchExpressions` (`In`, `NotIn`, `Exists`,
  `DoesNotExist`); an empty selector matches every pod, a missing one (None) none.
* :class:`AffinityTerm` — a `PodAffinityTerm` (with `weight` when it came from a preferred term):
  `namespaces` and `namespaceSelector` as Kubernetes defines them (neither: the pod's own
  namespace; `namespaceSelector: {}`: every namespace; a selector is matched against the
  namespace's `kubernetes.io/metadata.name` label, the one label every namespace carries), and
  `matchLabelKeys` / `mismatchLabelKeys` merged into the selector with the pod's own values.
* :class:`SpreadConstraint` — `maxSkew`, `topologyKey`, `whenUnsatisfiable`, `labelSelector`,
  `minDomains`, `matchLabelKeys`, `nodeAffinityPolicy`, `nodeTaintsPolicy`.
* :func:`rules_of` — all of a pod's rules as one :class:`PodRules` (None when it has none), or a
  :class:`~gpuyard.apis.resourceclasses.RequestError` naming the field and what is allowed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuyard.apis.core import PodSpec
from gpuyard.apis.resourceclasses import RequestError

__all__ = [
    "ANNOTATION_ANTI_AFFINITY",
    "LABEL_NAMESPACE_NAME",
    "AffinityTerm",
    "LabelSelector",
    "PodRules",
    "SpreadConstraint",
    "anti_terms_from_json",
    "anti_terms_to_json",
    "has_rules",
    "rules_of",
]

LABEL_NAMESPACE_NAME = "kubernetes.io/metadata.name"
"""The label Kubernetes puts on every namespace: its name (what a namespaceSelector can see here)."""

ANNOTATION_ANTI_AFFINITY = "gpuyard.io/pod-anti-affinity"
"""On a Reservation: the required anti-affinity terms of the pod it holds room for (JSON), so
pods placed later keep out of its way as Kubernetes' symmetric anti-affinity rule says."""

_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
_WHEN = ("DoNotSchedule", "ScheduleAnyway")
_POLICIES = ("Honor", "Ignore")

Requirement = tuple[str, str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A metav1.LabelSelector: every label and expression must hold (empty: every pod)."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        for key, value in self.match_labels:
            if labels.get(key) != value:
                return False
        for key, op, values in self.match_expressions:
            if op == "In":
                if labels.get(key) not in values:
                    return False
            elif op == "NotIn":
                if key in labels and labels[key] in values:
                    return False
            elif op == "Exists":
                if key not in labels:
                    return False
            elif key in labels:  # DoesNotExist
                return False
        return True

    def to_json(self) -> dict[str, Any]:
        return {
            "matchLabels": dict(self.match_labels),
            "matchExpressions": [
                {"key": k, "operator": o, "values": list(v)} for k, o, v in self.match_expressions
            ],
        }


@dataclass(frozen=True, slots=True)
class AffinityTerm:
    """A pod (anti-)affinity term. `selector` None matches no pod; `namespaces` None with
    `namespace_selector` None means the owner's namespace (`own_namespace`)."""

    topology_key: str
    selector: LabelSelector | None
    namespaces: tuple[str, ...] = ()
    namespace_selector: LabelSelector | None = None
    own_namespace: str = ""
    weight: int = 0

    def namespace_ok(self, namespace: str) -> bool:
        if not self.namespaces and self.namespace_selector is None:
            return namespace == self.own_namespace
        if namespace in self.namespaces:
            return True
        sel = self.namespace_selector
        return sel is not None and sel.matches({LABEL_NAMESPACE_NAME: namespace})

    def matches(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether a pod of `namespace` with `labels` is one this term is about."""
        return self.selector is not None and self.namespace_ok(namespace) and self.selector.matches(labels)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"topologyKey": self.topology_key, "namespaces": list(self.namespaces)}
        if self.selector is not None:
            out["labelSelector"] = self.selector.to_json()
        if self.namespace_selector is not None:
            out["namespaceSelector"] = self.namespace_selector.to_json()
        out["ownNamespace"] = self.own_namespace
        return out


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    """A topologySpreadConstraint, with `matchLabelKeys` already merged into `selector`."""

    max_skew: int
    topology_key: str
    hard: bool
    selector: LabelSelector | None
    min_domains: int = 1
    honor_affinity: bool = True
    honor_taints: bool = False

    def matches(self, labels: Mapping[str, str]) -> bool:
        return self.selector is not None and self.selector.matches(labels)


@dataclass(frozen=True, slots=True)
class PodRules:
    """Every inter-pod rule of one pod template (a role's pods share it)."""

    namespace: str
    affinity: tuple[AffinityTerm, ...] = ()
    anti_affinity: tuple[AffinityTerm, ...] = ()
    preferred_affinity: tuple[AffinityTerm, ...] = ()
    preferred_anti_affinity: tuple[AffinityTerm, ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()

    @property
    def hard_spread(self) -> tuple[SpreadConstraint, ...]:
        return tuple(c for c in self.spread if c.hard)

    @property
    def soft_spread(self) -> tuple[SpreadConstraint, ...]:
        return tuple(c for c in self.spread if not c.hard)

    @property
    def filters(self) -> bool:
        return bool(self.affinity or self.anti_affinity or self.hard_spread)

    @property
    def scores(self) -> bool:
        return bool(self.preferred_affinity or self.preferred_anti_affinity or self.soft_spread)


# --- parsing ------------------------------------------------------------------------------------


def _get(raw: Mapping[str, Any], camel: str) -> Any:
    """A field as written on the wire (camelCase) or by Python code (snake_case)."""
    if camel in raw:
        return raw[camel]
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)
    return raw.get(snake)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise RequestError(where, f"{where} must be an object, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise RequestError(where, f"{where} must be a list, got {type(value).__name__}")
    return value


def _strings(value: Any, where: str) -> tuple[str, ...]:
    items = _list(value, where)
    if not all(isinstance(v, str) for v in items):
        raise RequestError(where, f"{where} must be a list of strings")
    return tuple(items)


def parse_selector(raw: Any, where: str) -> LabelSelector | None:
    """A metav1.LabelSelector (None stays None: it selects nothing)."""
    if raw is None:
        return None
    raw = _mapping(raw, where)
    labels = _get(raw, "matchLabels") or {}
    labels = _mapping(labels, f"{where}.matchLabels")
    exprs = []
    for i, item in enumerate(_list(_get(raw, "matchExpressions"), f"{where}.matchExpressions")):
        at = f"{where}.matchExpressions[{i}]"
        item = _mapping(item, at)
        key, op = item.get("key"), item.get("operator")
        if not isinstance(key, str) or not key:
            raise RequestError(f"{at}.key", f"{at}.key is required (a label key)")
        if op not in _OPERATORS:
            raise RequestError(
                f"{at}.operator", f"{at}.operator must be one of {', '.join(_OPERATORS)}, got {op!r}"
            )
        values = _strings(item.get("values"), f"{at}.values")
        if op in ("In", "NotIn") and not values:
            raise RequestError(f"{at}.values", f"{at}.values: operator {op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and values:
            raise RequestError(f"{at}.values", f"{at}.values: operator {op} takes no values")
        exprs.append((key, str(op), values))
    return LabelSelector(
        tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        tuple(exprs),
    )


def _with_label_keys(
    selector: LabelSelector | None,
    match: tuple[str, ...],
    mismatch: tuple[str, ...],
    labels: Mapping[str, str],
    where: str,
) -> LabelSelector | None:
    """`matchLabelKeys` / `mismatchLabelKeys`: `key In (the pod's value)` / `key NotIn (...)`
    added to the selector for each key the pod has (Kubernetes ignores keys it lacks)."""
    if not match and not mismatch:
        return selector
    if selector is None:
        raise RequestError(where, f"{where}: matchLabelKeys/mismatchLabelKeys need a labelSelector")
    extra = [(k, "In", (labels[k],)) for k in match if k in labels]
    extra += [(k, "NotIn", (labels[k],)) for k in mismatch if k in labels]
    return LabelSelector(selector.match_labels, selector.match_expressions + tuple(extra))


def _term(
    raw: Any, where: str, *, namespace: str, labels: Mapping[str, str], weight: int = 0
) -> AffinityTerm:
    raw = _mapping(raw, where)
    key = _get(raw, "topologyKey")
    if not isinstance(key, str) or not key:
        raise RequestError(f"{where}.topologyKey", f"{where}.topologyKey is required (a node label key)")
    selector = parse_selector(_get(raw, "labelSelector"), f"{where}.labelSelector")
    match = _strings(_get(raw, "matchLabelKeys"), f"{where}.matchLabelKeys")
    mismatch = _strings(_get(raw, "mismatchLabelKeys"), f"{where}.mismatchLabelKeys")
    selector = _with_label_keys(selector, match, mismatch, labels, where)
    namespaces = _strings(_get(raw, "namespaces"), f"{where}.namespaces")
    ns_selector = parse_selector(_get(raw, "namespaceSelector"), f"{where}.namespaceSelector")
    return AffinityTerm(key, selector, tuple(sorted(set(namespaces))), ns_selector, namespace, weight)


def _terms(
    raw: Mapping[str, Any] | None, where: str, *, namespace: str, labels: Mapping[str, str]
) -> tuple[tuple[AffinityTerm, ...], tuple[AffinityTerm, ...]]:
    """(required terms, preferred terms with their weights) of a podAffinity / podAntiAffinity."""
    if raw is None:
        return (), ()
    raw = _mapping(raw, where)
    req_at = f"{where}.requiredDuringSchedulingIgnoredDuringExecution"
    required = tuple(
        _term(t, f"{req_at}[{i}]", namespace=namespace, labels=labels)
        for i, t in enumerate(_list(_get(raw, "requiredDuringSchedulingIgnoredDuringExecution"), req_at))
    )
    pref_at = f"{where}.preferredDuringSchedulingIgnoredDuringExecution"
    preferred = []
    for i, item in enumerate(_list(_get(raw, "preferredDuringSchedulingIgnoredDuringExecution"), pref_at)):
        at = f"{pref_at}[{i}]"
        item = _mapping(item, at)
        weight = item.get("weight")
        if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100:
            raise RequestError(
                f"{at}.weight", f"{at}.weight must be an integer within 1..100, got {weight!r}"
            )
        term = _get(item, "podAffinityTerm")
        if term is None:
            raise RequestError(f"{at}.podAffinityTerm", f"{at}.podAffinityTerm is required")
        preferred.append(
            _term(term, f"{at}.podAffinityTerm", namespace=namespace, labels=labels, weight=weight)
        )
    return required, tuple(preferred)


def _policy(raw: Mapping[str, Any], name: str, default: str, where: str) -> bool:
    value = _get(raw, name) or default
    if value not in _POLICIES:
        raise RequestError(f"{where}.{name}", f"{where}.{name} must be Honor or Ignore, got {value!r}")
    return bool(value == "Honor")


def _spread(raw: Any, where: str, *, labels: Mapping[str, str]) -> SpreadConstraint:
    raw = _mapping(raw, where)
    skew = _get(raw, "maxSkew")
    if not isinstance(skew, int) or isinstance(skew, bool) or skew < 1:
        raise RequestError(f"{where}.maxSkew", f"{where}.maxSkew must be an integer >= 1, got {skew!r}")
    key = _get(raw, "topologyKey")
    if not isinstance(key, str) or not key:
        raise RequestError(f"{where}.topologyKey", f"{where}.topologyKey is required (a node label key)")
    when = _get(raw, "whenUnsatisfiable")
    if when not in _WHEN:
        raise RequestError(
            f"{where}.whenUnsatisfiable",
            f"{where}.whenUnsatisfiable must be one of {', '.join(_WHEN)}, got {when!r}",
        )
    min_domains = _get(raw, "minDomains")
    if min_domains is None:
        min_domains = 1
    elif not isinstance(min_domains, int) or isinstance(min_domains, bool) or min_domains < 1:
        raise RequestError(
            f"{where}.minDomains", f"{where}.minDomains must be an integer >= 1, got {min_domains!r}"
        )
    elif when != "DoNotSchedule":
        raise RequestError(f"{where}.minDomains", f"{where}.minDomains is allowed only with DoNotSchedule")
    selector = parse_selector(_get(raw, "labelSelector"), f"{where}.labelSelector")
    match = _strings(_get(raw, "matchLabelKeys"), f"{where}.matchLabelKeys")
    selector = _with_label_keys(selector, match, (), labels, where)
    return SpreadConstraint(
        max_skew=skew,
        topology_key=key,
        hard=when == "DoNotSchedule",
        selector=selector,
        min_domains=min_domains,
        honor_affinity=_policy(raw, "nodeAffinityPolicy", "Honor", where),
        honor_taints=_policy(raw, "nodeTaintsPolicy", "Ignore", where),
    )


def has_rules(spec: PodSpec) -> bool:
    """Whether the pod asks for inter-pod (anti-)affinity or topology spread (cheap)."""
    extra = spec.model_extra
    if extra and (extra.get("topologySpreadConstraints") or extra.get("topology_spread_constraints")):
        return True
    aff = spec.affinity
    if aff is None or not aff.model_extra:
        return False
    return any(
        aff.model_extra.get(k)
        for k in ("podAffinity", "podAntiAffinity", "pod_affinity", "pod_anti_affinity")
    )


def rules_of(
    spec: PodSpec, *, namespace: str, labels: Mapping[str, str], where: str = "spec"
) -> PodRules | None:
    """The pod's inter-pod rules (None when it has none); `labels` are the pod's own labels (for
    matchLabelKeys), `where` prefixes field names in errors."""
    if not has_rules(spec):
        return None
    aff: Mapping[str, Any] = (spec.affinity.model_extra or {}) if spec.affinity is not None else {}
    affinity, preferred = _terms(
        _get(aff, "podAffinity"), f"{where}.affinity.podAffinity", namespace=namespace, labels=labels
    )
    anti, preferred_anti = _terms(
        _get(aff, "podAntiAffinity"), f"{where}.affinity.podAntiAffinity", namespace=namespace, labels=labels
    )
    extra = spec.model_extra or {}
    at = f"{where}.topologySpreadConstraints"
    spread = tuple(
        _spread(c, f"{at}[{i}]", labels=labels)
        for i, c in enumerate(_list(_get(extra, "topologySpreadConstraints"), at))
    )
    seen = set()
    for i, c in enumerate(spread):
        if (c.topology_key, c.hard) in seen:
            raise RequestError(
                f"{at}[{i}]",
                f"{at}[{i}]: a topologyKey and whenUnsatisfiable pair may appear once, got {c.topology_key} twice",
            )
        seen.add((c.topology_key, c.hard))
    rules = PodRules(namespace, affinity, anti, preferred, preferred_anti, spread)
    if not (rules.filters or rules.scores):
        return None
    return rules


# --- the Reservation annotation ------------------------------------------------------------------


def anti_terms_to_json(terms: Sequence[AffinityTerm]) -> str:
    return json.dumps([t.to_json() for t in terms], separators=(",", ":"), sort_keys=True)


def _selector_from_json(raw: Any) -> LabelSelector | None:
    if raw is None:
        return None
    return LabelSelector(
        tuple(sorted((str(k), str(v)) for k, v in (raw.get("matchLabels") or {}).items())),
        tuple(
            (str(e["key"]), str(e["operator"]), tuple(str(v) for v in e.get("values") or ()))
            for e in raw.get("matchExpressions") or ()
        ),
    )


def anti_terms_from_json(text: str) -> tuple[AffinityTerm, ...]:
    """The terms `anti_terms_to_json` wrote; () for anything unreadable (never raises)."""
    try:
        raw = json.loads(text)
        return tuple(
            AffinityTerm(
                topology_key=str(t["topologyKey"]),
                selector=_selector_from_json(t.get("labelSelector")),
                namespaces=tuple(str(n) for n in t.get("namespaces") or ()),
                namespace_selector=_selector_from_json(t.get("namespaceSelector")),
                own_namespace=str(t.get("ownNamespace", "")),
            )
            for t in raw
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return ()

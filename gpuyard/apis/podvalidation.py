"""The pod fields Kubernetes' API server requires, checked in a job's pod templates at submit.

gpuyard makes pods from each role's `template`; a template the API server would refuse as a pod
(a container without `image`, say, because of a typo `imag:`) would otherwise be accepted and
then fail pod by pod, or on the fake cluster run a pod no kubelet could start. `parse_job`
(`apis/jobs.py`) calls :func:`template_problems` on the submitted document, so such a job is
refused with each field named (`spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].image:
required`) and no pod is ever made. The rules are those of Kubernetes' `ValidatePodSpec`
(`pkg/apis/core/validation`) for containers and init containers:

* `name`: required, a DNS-1123 label, unique among the pod's containers and init containers;
* `image`: required, without leading or trailing whitespace;
* `ports[]`: `containerPort` required (1..65535 is the model's), `name` an IANA service name
  (at most 15 characters: lower-case letters, digits and '-', at least one letter, no '--', no
  '-' at either end) unique within the container; a `hostPort`/`protocol`/`hostIP` used once per pod;
* `env[]`: `name` required, printable ASCII without '=' (Kubernetes 1.34's relaxed rule);
* `imagePullPolicy`: Always, IfNotPresent or Never;
* `resources`: a request no larger than its limit.

A required field that is missing next to an unknown key close to it is named with it: `required;
found unknown field 'imag': did you mean 'image'?`.

Wrong types are left to the models (pydantic names them); these checks skip what is not a
mapping or a list where one is expected.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from gpuyard.apis.meta import dns_label_problem
from gpuyard.apis.quantity import parse_quantity

__all__ = ["CONTAINER_FIELDS", "IMAGE_PULL_POLICIES", "template_problems"]

CONTAINER_FIELDS = frozenset(
    "args command env envFrom image imagePullPolicy lifecycle livenessProbe name ports "
    "readinessProbe resizePolicy resources restartPolicy restartPolicyRules securityContext "
    "startupProbe stdin stdinOnce terminationMessagePath terminationMessagePolicy tty "
    "volumeDevices volumeMounts workingDir".split()
)
"""The fields of Kubernetes' `core/v1` Container (Kubernetes 1.37)."""

IMAGE_PULL_POLICIES = ("Always", "IfNotPresent", "Never")

_SVC_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_LETTER = re.compile(r"[a-z]")
_REQUIRED = ("name", "image")

Problem = dict[str, str]


def _near_miss(container: Mapping[Any, Any], wanted: str) -> str | None:
    """An unknown key of `container` that looks like a misspelt `wanted` (`imag` for `image`)."""
    unknown = [k for k in container if isinstance(k, str) and k not in CONTAINER_FIELDS]
    found = difflib.get_close_matches(wanted, unknown, n=1, cutoff=0.6)
    return found[0] if found else None


def _required(container: Mapping[Any, Any], key: str, where: str) -> Problem | None:
    value = container.get(key)
    if isinstance(value, str) and value:
        return None
    if value is not None and not isinstance(value, str):
        return None  # a wrong type: the model says so
    reason = "required"
    near = _near_miss(container, key)
    if near is not None:
        reason += f"; found unknown field {near!r}: did you mean {key!r}?"
    return {"field": f"{where}.{key}", "reason": reason}


def _port_name_problem(name: str) -> str | None:
    if len(name) > 15:
        return f"{name!r} is longer than 15 characters (an IANA service name)"
    if not _SVC_NAME.match(name):
        return f"{name!r} must be lower-case letters, digits and '-', starting and ending alphanumeric"
    if "--" in name:
        return f"{name!r} must not contain '--'"
    if not _LETTER.search(name):
        return f"{name!r} must contain at least one letter"
    return None


def _ports(ports: Any, where: str, host_ports: dict[tuple[Any, ...], str]) -> list[Problem]:
    out: list[Problem] = []
    if not isinstance(ports, list):
        return out
    names: set[str] = set()
    for j, port in enumerate(ports):
        if not isinstance(port, Mapping):
            continue
        at = f"{where}.ports[{j}]"
        if port.get("containerPort") is None:
            out.append({"field": f"{at}.containerPort", "reason": "required: a port number 1..65535"})
        name = port.get("name")
        if isinstance(name, str) and name:
            problem = _port_name_problem(name)
            if problem is not None:
                out.append({"field": f"{at}.name", "reason": problem})
            elif name in names:
                out.append(
                    {"field": f"{at}.name", "reason": f"duplicate port name {name!r} in this container"}
                )
            names.add(name)
        host = port.get("hostPort")
        if isinstance(host, int) and host > 0:
            key = (host, port.get("protocol") or "TCP", port.get("hostIP") or "")
            if key in host_ports:
                out.append(
                    {
                        "field": f"{at}.hostPort",
                        "reason": f"hostPort {host}/{key[1]} is used twice in one pod (first at {host_ports[key]})",
                    }
                )
            else:
                host_ports[key] = f"{at}.hostPort"
    return out


def _env(env: Any, where: str) -> list[Problem]:
    out: list[Problem] = []
    if not isinstance(env, list):
        return out
    for j, var in enumerate(env):
        if not isinstance(var, Mapping):
            continue
        name = var.get("name")
        at = f"{where}.env[{j}].name"
        if name is None or name == "":
            out.append({"field": at, "reason": "required"})
        elif isinstance(name, str) and ("=" in name or not all(" " <= c <= "~" for c in name)):
            out.append({"field": at, "reason": f"{name!r} must be printable ASCII characters other than '='"})
    return out


def _quantity(value: Any) -> Decimal | None:
    try:
        return parse_quantity(value)
    except (ValueError, TypeError, ArithmeticError):
        return None  # the model names a bad quantity


def _resources(resources: Any, where: str) -> list[Problem]:
    if not isinstance(resources, Mapping):
        return []
    requests, limits = resources.get("requests"), resources.get("limits")
    if not isinstance(requests, Mapping) or not isinstance(limits, Mapping):
        return []
    out: list[Problem] = []
    for name, raw in requests.items():
        if name not in limits:
            continue
        request, limit = _quantity(raw), _quantity(limits[name])
        if request is not None and limit is not None and request > limit:
            out.append(
                {
                    "field": f"{where}.resources.requests.{name}",
                    "reason": f"{raw} must be less than or equal to the {name} limit ({limits[name]})",
                }
            )
    return out


def _container(
    container: Mapping[Any, Any], where: str, names: dict[str, str], host_ports: dict[tuple[Any, ...], str]
) -> list[Problem]:
    out = [p for key in _REQUIRED if (p := _required(container, key, where)) is not None]
    name = container.get("name")
    if isinstance(name, str) and name:
        problem = dns_label_problem(name)
        if problem is not None:
            out.append({"field": f"{where}.name", "reason": problem})
        elif name in names:
            out.append(
                {
                    "field": f"{where}.name",
                    "reason": f"duplicate container name {name!r} (first at {names[name]})",
                }
            )
        else:
            names[name] = f"{where}.name"
    image = container.get("image")
    if isinstance(image, str) and image and image.strip() != image:
        out.append({"field": f"{where}.image", "reason": "must not have leading or trailing whitespace"})
    policy = container.get("imagePullPolicy")
    if policy is not None and policy not in IMAGE_PULL_POLICIES:
        out.append(
            {
                "field": f"{where}.imagePullPolicy",
                "reason": f"Unsupported value {policy!r}; allowed: {', '.join(IMAGE_PULL_POLICIES)}",
            }
        )
    out += _ports(container.get("ports"), where, host_ports)
    out += _env(container.get("env"), where)
    out += _resources(container.get("resources"), where)
    return out


def pod_spec_problems(spec: Mapping[Any, Any], where: str) -> list[Problem]:
    """The problems of one pod spec (`where`: its field path, e.g. `spec....template.spec`)."""
    out: list[Problem] = []
    names: dict[str, str] = {}
    for field in ("initContainers", "containers"):
        containers = spec.get(field)
        if not isinstance(containers, list):
            continue
        host_ports: dict[tuple[Any, ...], str] = {}  # per list, as Kubernetes' AccumulateUniqueHostPorts
        for i, container in enumerate(containers):
            if isinstance(container, Mapping):
                out += _container(container, f"{where}.{field}[{i}]", names, host_ports)
    return out


def template_problems(spec: Any, replica_field: str) -> list[Problem]:
    """The problems of every role's pod template in a job document's `spec` mapping."""
    roles = spec.get(replica_field) if isinstance(spec, Mapping) else None
    if not isinstance(roles, Mapping):
        return []
    out: list[Problem] = []
    for role, replica in roles.items():
        template = replica.get("template") if isinstance(replica, Mapping) else None
        pod = template.get("spec") if isinstance(template, Mapping) else None
        if isinstance(pod, Mapping):
            out += pod_spec_problems(pod, f"spec.{replica_field}.{role}.template.spec")
    return out

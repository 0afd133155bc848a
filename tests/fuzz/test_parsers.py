"""Property fuzzing of the parsers that read untrusted text: each returns a typed value or raises
its documented error with a message, never another exception; round trips hold where they exist.

Bounded for `make test`: a few hundred examples per property, derandomised (the same examples
on every run), no deadline. Parsers covered: the bounded YAML/JSON decoder and the job manifest
validator (`apis/decoding.py`, `apis/jobs.py`), quantities (`apis/quantity.py`), durations
(`apis/durations.py`), cluster scenarios (`devices/scenarios.py`), `nvidia-smi topo -m` import
(`devices/topo_import.py`) and topology presets (`devices/presets.py`).
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuyard.apis.decoding import MAX_DEPTH, DocumentLimitError, json_loads, yaml_load_all
from gpuyard.apis.durations import MAX_DURATION, parse_duration, parse_pod_duration
from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.jobs import JobValidationError, load_documents, parse_job
from gpuyard.apis.quantity import QuantityError, format_quantity, parse_quantity
from gpuyard.devices.presets import PRESETS, get_preset
from gpuyard.devices.scenarios import Scenario, ScenarioError, parse_scenario
from gpuyard.devices.topo_import import TopologyParseError, import_topology

ROOT = Path(__file__).resolve().parents[2]
TOPO = ROOT / "tests" / "data" / "topo"

FUZZ = settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
FEW = settings(FUZZ, max_examples=150)

# --- JSON-like values and mutations of valid documents ---------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(
        ["", "-1", "1e400", "Worker", "4", "nvidia.com/gpu", "inf", "40s", "2Gi", "kubeflow.org/v1"]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.one_of(st.text(max_size=12), st.sampled_from(["spec", "metadata", "kind"])), inner, max_size=4
        ),
    ),
    max_leaves=20,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        return {**doc, head: _replace(doc[head], rest, value)}
    copy = list(doc)
    copy[head] = _replace(copy[head], rest, value)
    return copy


def _delete(doc: Any, path: tuple[Any, ...]) -> Any:
    if not path:
        return None
    if len(path) == 1:
        if isinstance(doc, dict):
            return {k: v for k, v in doc.items() if k != path[0]}
        return [v for i, v in enumerate(doc) if i != path[0]]
    head = path[0]
    if isinstance(doc, dict):
        return {**doc, head: _delete(doc[head], path[1:])}
    copy = list(doc)
    copy[head] = _delete(copy[head], path[1:])
    return copy


@st.composite
def mutated(draw: st.DrawFn, base: Any) -> Any:
    """`base` with a few leaves or subtrees replaced by arbitrary values, or deleted."""
    doc = base
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)))
        if path and draw(st.booleans()):
            doc = _delete(doc, path)
        else:
            doc = _replace(doc, path, draw(values))
    return doc


JOB = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "ddp", "namespace": "team-a", "annotations": {"gpuyard.io/expected-duration": "1h"}},
    "spec": {
        "runPolicy": {"cleanPodPolicy": "None", "backoffLimit": 3},
        "pytorchReplicaSpecs": {
            "Master": {
                "replicas": 1,
                "restartPolicy": "ExitCode",
                "template": {
                    "metadata": {"annotations": {"fake.gpuyard.io/duration": "40s"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "pytorch",
                                "image": "x",
                                "resources": {"limits": {"nvidia.com/gpu": 4, "cpu": "8", "memory": "32Gi"}},
                            }
                        ]
                    },
                },
            },
            "Worker": {
                "replicas": 3,
                "template": {
                    "spec": {
                        "containers": [
                            {"name": "pytorch", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 4}}}
                        ]
                    }
                },
            },
        },
    },
}

SCENARIO = {
    "name": "fuzz",
    "kubelet": {"startDelay": 1, "duration": "60s", "exitCode": 0},
    "nodeGroups": [
        {
            "name": "node",
            "count": 2,
            "cpu": "64",
            "memory": "512Gi",
            "gpu": {"model": "v100", "count": 8},
            "topology": "dgx1-v100",
            "block": "block-a",
        },
        {"name": "cpu", "count": 1, "cpu": "32", "memory": "64Gi"},
    ],
}


# --- decoding and job manifests ---------------------------------------------------------------------


@FUZZ
@given(st.text(max_size=300))
def test_yaml_text_decodes_or_is_refused_with_the_documented_errors(text: str) -> None:
    try:
        yaml_load_all(text, max_bytes=10_000)
    except DocumentLimitError as exc:
        assert exc.status in (413, 422) and str(exc)
    except yaml.YAMLError:
        pass


@FUZZ
@given(st.text(alphabet="{}[]:,\"'0123456789-.e truefalsn\\\n", max_size=300))
def test_json_text_decodes_or_is_refused_with_the_documented_errors(text: str) -> None:
    try:
        json_loads(text)
    except DocumentLimitError as exc:
        assert exc.status == 422 and str(exc)
    except json.JSONDecodeError:
        pass


@FEW
@given(st.integers(1, 3 * MAX_DEPTH), st.sampled_from(["[", "{a: "]), st.booleans())
def test_nesting_is_refused_beyond_the_limit_and_read_within_it(depth: int, opener: str, flow: bool) -> None:
    closer = "]" if opener == "[" else "}"
    text = opener * depth + "1" + closer * depth
    try:
        yaml_load_all(text)
    except DocumentLimitError as exc:
        assert depth > MAX_DEPTH - 1 and exc.status == 422
    else:
        assert depth <= MAX_DEPTH


@FEW
@given(st.integers(1, 12), st.integers(2, 12))
def test_alias_expansion_is_measured_before_it_is_built(levels: int, fan: int) -> None:
    lines = ["a0: &a0 [x, y, z, w]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]")
    text = "\n".join(lines)
    try:
        docs = yaml_load_all(text, max_bytes=100_000)
    except DocumentLimitError as exc:
        assert exc.status == 413 and "100000" in str(exc)
    else:
        assert fan ** (levels - 1) * 4 < 100_000 and docs


@FUZZ
@given(st.one_of(values, mutated(JOB)))
def test_a_job_document_is_a_typed_job_or_a_job_validation_error(doc: Any) -> None:
    try:
        job = parse_job(doc)
    except JobValidationError as exc:
        assert str(exc)
        assert all(set(d) >= {"field", "reason"} for d in exc.details)
    else:
        assert isinstance(job, TrainingJob)


@FUZZ
@given(st.one_of(st.text(max_size=200), mutated(JOB).map(lambda d: yaml.safe_dump(d, sort_keys=False))))
def test_a_job_body_decodes_or_is_refused_with_the_documented_errors(text: str) -> None:
    try:
        docs = load_documents(text)
    except (JobValidationError, DocumentLimitError) as exc:
        assert str(exc)
        return
    assert docs
    for doc in docs:
        try:
            parse_job(doc)
        except JobValidationError as exc:
            assert str(exc)


# --- quantities -----------------------------------------------------------------------------------

SUFFIXES = ["", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u"]


@FUZZ
@given(st.one_of(st.text(max_size=30), st.text(alphabet="0123456789.+-eEkKMGTPinmu ", max_size=20), scalars))
def test_a_quantity_parses_or_raises_quantity_error(value: Any) -> None:
    try:
        parsed = parse_quantity(value)
    except QuantityError as exc:
        assert str(exc)
    else:
        assert isinstance(parsed, Decimal) and parsed.is_finite()


@FUZZ
@given(
    st.integers(0, 10**12) | st.decimals(min_value=0, max_value=10**9, places=3, allow_nan=False),
    st.sampled_from(SUFFIXES),
)
def test_quantity_format_then_parse_is_the_same_value(number: Any, suffix: str) -> None:
    value = parse_quantity(f"{number}{suffix}")
    assert parse_quantity(format_quantity(value)) == value


# --- durations ------------------------------------------------------------------------------------


@FUZZ
@given(st.one_of(st.text(max_size=20), st.text(alphabet="0123456789.hmsdinf+-e ", max_size=15), scalars))
def test_a_duration_parses_into_range_or_raises_value_error(value: Any) -> None:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        assert str(exc)
    else:
        assert 0 <= seconds <= MAX_DURATION and not math.isnan(seconds)
    if isinstance(value, str):
        try:
            pod = parse_pod_duration(value)
        except ValueError as exc:
            assert str(exc)
        else:
            assert pod is None or 0 <= pod <= MAX_DURATION


@FUZZ
@given(st.integers(0, 48), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999))
def test_go_style_durations_add_up(h: int, m: int, s: int, ms: int) -> None:
    text = f"{h}h{m}m{s}s{ms}ms"
    assert math.isclose(parse_duration(text), h * 3600 + m * 60 + s + ms / 1000)
    assert parse_duration(str(h * 3600 + m * 60 + s)) == h * 3600 + m * 60 + s


# --- scenarios and topologies ---------------------------------------------------------------------


@FUZZ
@given(st.one_of(values, mutated(SCENARIO)))
def test_a_scenario_is_a_typed_scenario_or_a_scenario_error(doc: Any) -> None:
    try:
        scenario = parse_scenario(doc, source="fuzz.yaml")
    except ScenarioError as exc:
        assert str(exc).startswith("fuzz.yaml")
        return
    assert isinstance(scenario, Scenario)
    if sum(g.count for g in scenario.node_groups) <= 64:
        nodes = scenario.nodes()
        assert len(nodes) == sum(g.count for g in scenario.node_groups)


MATRICES = sorted(p.read_text() for p in TOPO.glob("*.txt"))


@st.composite
def damaged_matrix(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(MATRICES))
    lines = text.splitlines()
    for _ in range(draw(st.integers(1, 4))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["drop", "dup", "cell", "text"]))
        if action == "drop":
            del lines[i]
        elif action == "dup":
            lines.insert(i, lines[i])
        elif action == "cell":
            cells = lines[i].split("\t")
            j = draw(st.integers(0, len(cells) - 1))
            cells[j] = draw(
                st.sampled_from(
                    ["X", " X ", "NV99", "NV0", "PIX", "", "SYS", "GPU9", "-1", "0-", "9-3", "zz"]
                )
            )
            lines[i] = "\t".join(cells)
        else:
            lines[i] = draw(st.text(max_size=40))
    return "\n".join(lines)


@FUZZ
@given(st.one_of(damaged_matrix(), st.text(max_size=200)))
def test_a_topology_matrix_imports_or_raises_topology_parse_error(text: str) -> None:
    try:
        topology = import_topology(text, name="fuzz")
    except TopologyParseError as exc:
        assert exc.message and exc.line >= 1 and exc.column >= 1
    else:
        assert topology.gpu_count >= 1
        assert [g.index for g in topology.spec.gpus] == list(range(topology.gpu_count))


def test_every_real_matrix_imports() -> None:
    for text in MATRICES:
        assert import_topology(text, name="real").gpu_count >= 1


@FEW
@given(
    st.one_of(st.sampled_from(list(PRESETS)), st.text(max_size=15)), st.lists(st.integers(-2, 10), max_size=4)
)
def test_a_preset_is_built_or_refused_with_value_error(name: str, unhealthy: list[int]) -> None:
    try:
        topology = get_preset(name, unhealthy=unhealthy)
    except ValueError as exc:
        if name in PRESETS:
            count = get_preset(name).gpu_count
            assert not set(unhealthy) <= set(range(count)) and f"0..{count - 1}" in str(exc)
        else:
            assert "unknown topology preset" in str(exc)
    else:
        assert name in PRESETS
        bad = {g.index for g in topology.spec.gpus if g.health != "Healthy"}
        assert bad == set(unhealthy)

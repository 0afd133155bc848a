"""Kubernetes quantities parse exactly; bad ones are rejected with the field path."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gpuyard.apis.core import Pod
from gpuyard.apis.quantity import QuantityError, format_quantity, parse_quantity, to_int, to_milli


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1024m", Decimal("1.024")),
        ("2Gi", Decimal(2 * 2**30)),
        ("500Mi", Decimal(500 * 2**20)),
        ("1.5", Decimal("1.5")),
        ("1e3", Decimal(1000)),
        ("1E-3", Decimal("0.001")),
        ("100k", Decimal(100_000)),
        ("1M", Decimal(1_000_000)),
        (".5", Decimal("0.5")),
        ("0", Decimal(0)),
        (3, Decimal(3)),
        (0.25, Decimal("0.25")),
    ],
)
def test_parse_exact(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["", "1.2.3", "Gi", "1GiB", "1 Gi", "one", "1e", "--1", True, None, [1]])
def test_parse_rejects(bad):
    with pytest.raises(QuantityError):
        parse_quantity(bad)


def test_milli_and_int_round_up():
    assert to_milli(parse_quantity("0.0001")) == 1
    assert to_milli(parse_quantity("1.5")) == 1500
    assert to_int(parse_quantity("1.2")) == 2
    assert to_int(parse_quantity("2Gi")) == 2 * 2**30


def test_format_is_exact_and_readable():
    assert format_quantity(parse_quantity("2Gi")) == "2Gi"
    assert format_quantity(parse_quantity("1536Mi")) == "1536Mi"
    assert format_quantity(parse_quantity("0.5")) == "500m"
    assert format_quantity(parse_quantity("8")) == "8"


@given(st.integers(min_value=0, max_value=10**15), st.sampled_from(["", "m", "k", "Ki", "Mi", "Gi"]))
def test_round_trip(n, suffix):
    q = parse_quantity(f"{n}{suffix}")
    assert parse_quantity(format_quantity(q)) == q


def test_invalid_quantity_in_a_pod_names_the_field():
    with pytest.raises(ValidationError) as err:
        Pod.model_validate(
            {
                "metadata": {"name": "p"},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "two"}}}]},
            }
        )
    loc = err.value.errors()[0]["loc"]
    assert loc == ("spec", "containers", 0, "resources", "limits", "cpu")
    assert "'two' is not a quantity" in str(err.value)


def test_pod_requests_sum_containers_and_respect_init_containers():
    pod = Pod.model_validate(
        {
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [{"name": "init", "resources": {"requests": {"cpu": "4"}}}],
                "containers": [
                    {
                        "name": "a",
                        "resources": {
                            "limits": {"cpu": "1", "nvidia.com/gpu": 2},
                            "requests": {"cpu": "500m"},
                        },
                    },
                    {"name": "b", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
                ],
            },
        }
    )
    req = pod.spec.requests()
    assert req["cpu"] == Decimal(4)  # the init container needs more than the sum 1.5
    assert req["nvidia.com/gpu"] == 2
    assert req["memory"] == 2**30


def test_unknown_kubernetes_fields_pass_through():
    raw = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": "c", "volumeMounts": [{"name": "v", "mountPath": "/d"}]}],
            "volumes": [{"name": "v"}],
        },
    }
    out = Pod.model_validate(raw).to_dict()
    assert out["spec"]["volumes"] == [{"name": "v"}]
    assert out["spec"]["containers"][0]["volumeMounts"] == [{"name": "v", "mountPath": "/d"}]

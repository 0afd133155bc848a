"""Kubernetes quantities parse exactly; bad ones are rejected with the field path."""

from __future__ import annotations

from decimal import ROUND_UP, Context, Decimal

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


# The examples documented with Kubernetes' quantity parser (the Python clients' `parse_quantity`):
# every suffix, fractions with binary suffixes, exponents, signs.
REFERENCE_EXAMPLES = [
    ("2", Decimal(2)),
    ("2.2", Decimal("2.2")),
    ("-2", Decimal(-2)),
    ("+2", Decimal(2)),
    ("2n", Decimal("2e-9")),
    ("123n", Decimal("123e-9")),
    ("2u", Decimal("2e-6")),
    ("2m", Decimal("0.002")),
    ("2k", Decimal(2000)),
    ("2M", Decimal(2 * 10**6)),
    ("2G", Decimal(2 * 10**9)),
    ("2T", Decimal(2 * 10**12)),
    ("2P", Decimal(2 * 10**15)),
    ("2E", Decimal(2 * 10**18)),
    ("2Ki", Decimal(2 * 1024)),
    ("2Mi", Decimal(2 * 1024**2)),
    ("2Gi", Decimal(2 * 1024**3)),
    ("2Ti", Decimal(2 * 1024**4)),
    ("2Pi", Decimal(2 * 1024**5)),
    ("2Ei", Decimal(2 * 1024**6)),
    ("2.5Ki", Decimal(2560)),
    ("0.5Gi", Decimal(2**29)),
    ("1.5Gi", Decimal(1536 * 2**20)),
    ("1.5k", Decimal(1500)),
    ("1e3", Decimal(1000)),
    ("1e+3", Decimal(1000)),
    ("1E3", Decimal(1000)),
    ("1E-3", Decimal("0.001")),
    ("1.5e2", Decimal(150)),
    ("-1.5Ki", Decimal(-1536)),
    ("1.", Decimal(1)),
    ("1.G", Decimal(10**9)),
    ("0Gi", Decimal(0)),
    ("007", Decimal(7)),
]


@pytest.mark.parametrize(("text", "value"), REFERENCE_EXAMPLES)
def test_parse_matches_the_kubernetes_examples(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "bad",
    [
        "",
        " ",
        "1.2.3",
        "Gi",
        "m",
        "1GiB",
        "1 Gi",
        "one",
        "1e",
        "--1",
        "-",
        "+",
        ".",
        "1ki",  # lower-case binary suffixes are not Kubernetes'
        "1K",  # nor an upper-case decimal kilo
        "1mi",
        "1ni",
        "1ii",
        "1i",
        "1Kii",
        "1Ki2",
        "1x",
        "1e2.3",  # exponents are integers
        "1e3k",  # no suffix after an exponent
        "1e2Mi",
        "1e99999999999",  # exponents are 32-bit
        "NaN",
        "Infinity",
        "-inf",
        "0x10",
        "1_000",
        "١",  # only ASCII digits
        True,
        None,
        [1],
        float("nan"),
        Decimal("Infinity"),
    ],
)
def test_parse_rejects(bad):
    with pytest.raises(QuantityError):
        parse_quantity(bad)


def test_surrounding_whitespace_is_ignored_as_the_api_server_does():
    assert parse_quantity(" 2Gi\n") == 2 * 2**30


def test_kubernetes_canonical_examples_render_the_same():
    # "1.5 will be serialized as 1500m; 1.5Gi will be serialized as 1536Mi"
    assert format_quantity(parse_quantity("1.5")) == "1500m"
    assert format_quantity(parse_quantity("1.5Gi")) == "1536Mi"


def test_values_are_held_as_kubernetes_holds_them():
    largest = 2**63 - 1  # magnitudes are capped
    assert parse_quantity("1e30") == largest
    assert parse_quantity("-8Ei") == -largest
    assert parse_quantity("1e2000000000") == largest
    assert parse_quantity(10**40) == largest
    assert parse_quantity("0.1n") == Decimal("1e-9")  # rounded up to whole nano units
    assert parse_quantity("1.5n") == Decimal("2e-9")
    assert parse_quantity("-0.0000000015") == Decimal("-2e-9")  # away from zero
    assert parse_quantity("1e-2000000000") == Decimal("1e-9")
    assert parse_quantity(Decimal("0.0000000001")) == Decimal("1e-9")


def test_long_numbers_and_floats_are_exact():
    assert parse_quantity("0" * 150 + "1Ki") == 1024
    assert parse_quantity("0." + "0" * 150 + "1Ki") == Decimal("1e-9")
    assert parse_quantity("1" * 27 + "n") == Decimal("1" * 18 + "." + "1" * 9)
    assert parse_quantity(1e-05) == Decimal("0.00001")
    assert parse_quantity(1e16) == 10**16
    assert parse_quantity(1e300) == 2**63 - 1


_SUFFIX_VALUES = {
    "": (10, 0),
    **{s: (10, p) for s, p in [("n", -9), ("u", -6), ("m", -3), ("k", 3), ("M", 6), ("G", 9)]},
    **{s: (10, p) for s, p in [("T", 12), ("P", 15), ("E", 18)]},
    **{s + "i": (2, 10 * (i + 1)) for i, s in enumerate("KMGTPE")},
}


@given(
    sign=st.sampled_from(["", "+", "-"]),
    whole=st.one_of(st.just(""), st.integers(min_value=0, max_value=10**8).map(str)),
    fraction=st.one_of(st.none(), st.integers(min_value=0, max_value=10**6).map(str)),
    suffix=st.one_of(
        st.sampled_from(sorted(_SUFFIX_VALUES)),
        st.tuples(st.sampled_from("eE"), st.sampled_from(["", "+", "-"]), st.integers(0, 12)).map(
            lambda t: f"{t[0]}{t[1]}{t[2]}"
        ),
    ),
)
def test_every_well_formed_quantity_has_the_kubernetes_value(sign, whole, fraction, suffix):
    number = whole + ("" if fraction is None else "." + fraction)
    if not whole and not fraction:
        return  # no digits: not a number
    text = f"{sign}{number}{suffix}"
    exact = Context(prec=200)
    amount = Decimal(sign + number)
    if suffix not in _SUFFIX_VALUES:  # an exponent
        expected = exact.multiply(amount, exact.power(10, int(suffix[1:])))
    else:
        base, power = _SUFFIX_VALUES[suffix]
        expected = exact.multiply(amount, exact.power(Decimal(base), power))
    if expected.copy_abs() > 2**63 - 1:
        expected = Decimal(2**63 - 1).copy_sign(expected)
    expected = expected.quantize(Decimal("1e-9"), rounding=ROUND_UP, context=exact)
    assert parse_quantity(text) == expected


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

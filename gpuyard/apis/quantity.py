"""Kubernetes resource quantities (`500m`, `2Gi`, `1.5`, `1e3`), parsed exactly.

Quantities are kept as :class:`decimal.Decimal` so that `0.1 + 0.2` CPU is exactly `300m` and
`2Gi` is exactly 2147483648 bytes. Models use the annotated :data:`Quantity` type; the scheduler
converts to integers once, at the edge (:func:`to_milli`, :func:`to_int`).
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, ROUND_UP, Context, Decimal
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

__all__ = ["Quantity", "QuantityError", "format_quantity", "parse_quantity", "to_int", "to_milli"]

# Kubernetes' suffixes (apimachinery resource.Quantity): the value is number * base ** power.
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_POWER = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
# <quantity> ::= <sign>? <number> <suffix>?; <number> ::= digits | digits.digits | digits. | .digits;
# <suffix> ::= binary SI | decimal SI | e|E <sign>? digits. `1E` is 10^18 (exa); `1e` is malformed.
_RE = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<binary>[KMGTPE]i)|[eE](?P<exponent>[+-]?[0-9]+)|(?P<decimal>[numkMGTPE]))?"
)
# Kubernetes reads the exponent of `1e3` as a 32-bit integer; anything wider is malformed.
_MAX_EXPONENT = 2**31 - 1
# What a Kubernetes Quantity can hold: magnitudes are capped at 2**63 - 1 and rounded up (away from
# zero) to whole nano units, so `1e30` is 9223372036854775807 and `0.1n` is `1n`.
_LARGEST = Decimal(2**63 - 1)
_NANO = Decimal("1e-9")
_EXACT = Context(prec=40)  # 19 integer and 9 fractional digits fit

ALLOWED = "a number with an optional suffix: n u m k M G T P E, Ki Mi Gi Ti Pi Ei, or an exponent (e.g. 500m, 2Gi, 1.5)"


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: Any) -> Decimal:
    """Parse a quantity given as a string, int or float; raise :class:`QuantityError` if invalid.

    Kubernetes' grammar and values (apimachinery's `ParseQuantity`; the Python clients'
    `parse_quantity` compute the same values): `500m` is 0.5, `2Gi` is 2 * 1024**3, `1.5k` is 1500,
    `1e3` and `1E-3` are exponents, `1E` is 10**18, `1.` and `.5` are numbers. Rejected as Kubernetes
    rejects them: an unknown or lower-case suffix (`1ki`, `1K`, `1mi`, `1GiB`), a suffix after an
    exponent (`1e3k`), a fractional exponent (`1e2.5`), a bare sign or suffix, spaces inside,
    `NaN`/`Infinity`, booleans. Surrounding whitespace is ignored, as the API server ignores it when
    it decodes a quantity from JSON; a float is read as its shortest decimal text (`0.1` is exactly
    0.1), as a JSON number reaches Kubernetes. The result is what a Kubernetes Quantity holds: at
    most 2**63 - 1 in magnitude, rounded up to whole nano units.
    """
    return _bounded(_parse(value))


def _parse(value: Any) -> Decimal:
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise QuantityError(f"{value!r} is not a finite quantity; allowed: {ALLOWED}")
        return value
    if isinstance(value, bool):
        raise QuantityError(f"expected a quantity, got a boolean; allowed: {ALLOWED}")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(f"{value!r} is not a finite quantity; allowed: {ALLOWED}")
        return Decimal(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"expected a quantity, got {type(value).__name__}; allowed: {ALLOWED}")
    match = _RE.fullmatch(value.strip())
    if match is None:
        raise QuantityError(f"{value!r} is not a quantity; allowed: {ALLOWED}")
    number = Decimal(match["sign"] + match["number"])
    if match["binary"]:
        return _scaled(number, factor=_BINARY[match["binary"]])
    if match["exponent"] is not None:
        power = int(match["exponent"])
        if abs(power) > _MAX_EXPONENT:
            raise QuantityError(f"{value!r}: the exponent is out of range; allowed: {ALLOWED}")
        return _scaled(number, power=power)
    return _scaled(number, power=_DECIMAL_POWER[match["decimal"] or ""])


def _bounded(amount: Decimal) -> Decimal:
    """Cap the magnitude at 2**63 - 1 and round up (away from zero) to whole nano units, as Kubernetes does."""
    if amount.copy_abs() > _LARGEST:
        return _LARGEST.copy_sign(amount)
    exponent = amount.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -9:
        return amount.quantize(_NANO, rounding=ROUND_UP, context=_EXACT)
    return amount


def _scaled(number: Decimal, *, factor: int = 1, power: int = 0) -> Decimal:
    """number * factor * 10**power, exactly (no context precision, rounding or overflow)."""
    sign, digits, exponent = number.as_tuple()
    mantissa = int("".join(map(str, digits))) * factor
    return Decimal((sign, tuple(int(d) for d in str(mantissa)), int(exponent) + power))


def format_quantity(value: Decimal) -> str:
    """Render exactly: `2Gi` for whole binary multiples of at least 1Mi, `1500m` for fractions, else digits."""
    if value == value.to_integral_value():
        whole = int(value)
        if whole and abs(whole) >= _BINARY["Mi"]:
            for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi"):
                if whole % _BINARY[suffix] == 0:
                    return f"{whole // _BINARY[suffix]}{suffix}"
        return str(whole)
    milli = value * 1000
    if milli == milli.to_integral_value():
        return f"{int(milli)}m"
    return format(value.normalize(), "f")


def to_milli(value: Decimal) -> int:
    """Thousandths, rounded up as Kubernetes does for CPU (`0.0001` CPU is `1m`)."""
    return int((value * 1000).to_integral_value(rounding=ROUND_CEILING))


def to_int(value: Decimal) -> int:
    """Whole units, rounded up (bytes of memory, device counts)."""
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def _validate(value: Any) -> Decimal:
    try:
        return parse_quantity(value)
    except QuantityError as exc:
        raise ValueError(str(exc)) from None


Quantity = Annotated[
    Decimal,
    BeforeValidator(_validate),
    PlainSerializer(format_quantity, return_type=str),
    WithJsonSchema({"type": "string", "description": "Kubernetes quantity, e.g. 500m, 2Gi, 1.5"}),
]

"""Kubernetes resource quantities (`500m`, `2Gi`, `1.5`, `1e3`), parsed exactly as Kubernetes does.

Every quantity in a job, pod, node, quota or resource class passes through :func:`parse_quantity`
(the annotated :data:`Quantity` type of the models), which accepts and rejects what the API server
accepts and rejects and yields the value a Kubernetes Quantity holds. Quantities are kept as
:class:`decimal.Decimal` so that `0.1 + 0.2` CPU is exactly `300m` and `2Gi` is exactly 2147483648
bytes; the scheduler converts to integers once, at the edge (:func:`to_milli`, :func:`to_int`).
"""

from __future__ import annotations

import re
from decimal import MAX_EMAX, MIN_EMIN, ROUND_CEILING, ROUND_UP, Context, Decimal
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
_LARGEST_INT = 2**63 - 1
_LARGEST = Decimal(_LARGEST_INT)
_NANO = Decimal("1e-9")
# Exact arithmetic on parsed numbers: products of up to 100 digits, any exponent.
_WIDE = Context(prec=200, Emax=MAX_EMAX, Emin=MIN_EMIN)

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
    if isinstance(value, str):
        return _parse_text(value, value.strip())
    if isinstance(value, bool):
        raise QuantityError(f"expected a quantity, got a boolean; allowed: {ALLOWED}")
    if isinstance(value, int):
        if abs(value) <= _LARGEST_INT:
            return Decimal(value)
        return -_LARGEST if value < 0 else _LARGEST
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(f"{value!r} is not a finite quantity; allowed: {ALLOWED}")
        return _parse_text(value, repr(value))
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise QuantityError(f"{value!r} is not a finite quantity; allowed: {ALLOWED}")
        return _bounded(value, decimals=-int(value.as_tuple().exponent))
    raise QuantityError(f"expected a quantity, got {type(value).__name__}; allowed: {ALLOWED}")


def _parse_text(value: object, text: str) -> Decimal:
    match = _RE.fullmatch(text)
    if match is None:
        raise QuantityError(f"{value!r} is not a quantity; allowed: {ALLOWED}")
    sign, number, binary, exponent, decimal = match.groups()
    point = number.find(".")
    decimals = 0 if point < 0 else len(number) - point - 1
    if binary:
        if len(number) <= _WIDE.prec // 2:
            amount = _WIDE.multiply(Decimal(sign + number), _BINARY[binary])
        else:
            amount = _scaled(Decimal(sign + number), factor=_BINARY[binary])
        return _bounded(amount, decimals=decimals)
    if exponent is not None:
        power = int(exponent)
        if abs(power) > _MAX_EXPONENT:
            raise QuantityError(f"{value!r}: the exponent is out of range; allowed: {ALLOWED}")
    else:
        power = _DECIMAL_POWER[decimal or ""]
    amount = Decimal(f"{sign}{number}e{power}" if power else sign + number)  # exact: no context
    return _bounded(amount, decimals=decimals - power)


def _bounded(amount: Decimal, *, decimals: int) -> Decimal:
    """Cap the magnitude at 2**63 - 1 and round up (away from zero) to whole nano units, as Kubernetes
    does; `decimals` is the number of digits `amount` has after the decimal point."""
    if amount.copy_abs() > _LARGEST:
        return _LARGEST.copy_sign(amount)
    if decimals > 9:
        return amount.quantize(_NANO, rounding=ROUND_UP, context=_WIDE)
    return amount


def _scaled(number: Decimal, *, factor: int) -> Decimal:
    """number * factor, exactly, however many digits `number` has."""
    sign, digits, exponent = number.as_tuple()
    mantissa = int("".join(map(str, digits))) * factor
    return Decimal((sign, tuple(int(d) for d in str(mantissa)), int(exponent)))


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

"""Kubernetes resource quantities (`500m`, `2Gi`, `1.5`, `1e3`), parsed exactly.

Quantities are kept as :class:`decimal.Decimal` so that `0.1 + 0.2` CPU is exactly `300m` and
`2Gi` is exactly 2147483648 bytes. Models use the annotated :data:`Quantity` type; the scheduler
converts to integers once, at the edge (:func:`to_milli`, :func:`to_int`).
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

__all__ = ["Quantity", "QuantityError", "format_quantity", "parse_quantity", "to_int", "to_milli"]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
# sign, digits with an optional fraction, then a binary suffix, a decimal suffix, or an exponent.
_RE = re.compile(r"^([+-]?)(\d+\.?\d*|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")

ALLOWED = "a number with an optional suffix: n u m k M G T P E, Ki Mi Gi Ti Pi Ei, or an exponent (e.g. 500m, 2Gi, 1.5)"


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: Any) -> Decimal:
    """Parse a quantity given as a string, int or float; raise :class:`QuantityError` if invalid."""
    if isinstance(value, Decimal):
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
    match = _RE.match(value.strip())
    if match is None:
        raise QuantityError(f"{value!r} is not a quantity; allowed: {ALLOWED}")
    sign, number, suffix = match.groups()
    try:
        amount = Decimal(number)
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only valid decimals
        raise QuantityError(f"{value!r} is not a quantity; allowed: {ALLOWED}") from exc
    suffix = suffix or ""
    if suffix in _BINARY:
        amount *= _BINARY[suffix]
    elif suffix[:1] in ("e", "E"):
        amount = amount.scaleb(int(suffix[1:]))
    else:
        amount *= _DECIMAL[suffix]
    return -amount if sign == "-" else amount


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

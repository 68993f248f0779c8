"""Exact Kubernetes resource quantities.

Requests and limits decide swap shares, so they are parsed exactly (as fractions of a
byte) instead of as floats: ``1.5Gi``, ``2e9`` and ``100m`` must compare equal to what the
API server computes, or a "request == limit" check silently goes wrong.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from functools import lru_cache

MI = 1024 * 1024

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}

# <sign><digits>[.<digits>]<suffix>, where suffix is binary, decimal SI, or e/E<signed int>.
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<dec>[numkMGTPE])|[eE](?P<exp>[+-]?\d+))?$"
)

_FORMAT_BINARY = (("Ei", 1024**6), ("Pi", 1024**5), ("Ti", 1024**4), ("Gi", 1024**3), ("Mi", MI))
_FORMAT_DECIMAL = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6),
                   ("k", 10**3))


class QuantityError(ValueError):
    """A value that is not a valid Kubernetes quantity."""


def parse_quantity(value: object) -> Fraction:
    """Return the exact value of a quantity (``"2Gi"``, ``"2e9"``, ``1536``...) in base units."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{value!r} is not a quantity")
        return Fraction(Decimal(repr(value)))
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is not a quantity")
    return parse_text(value)


# A cluster writes the same few quantities over and over ("2Gi", "500m"), and every
# admission parses each container's requests and limits: caching the exact (immutable)
# Fractions removes most of the engine's cost. Errors are not cached; size is bounded.
@lru_cache(maxsize=4096)
def parse_text(value: str) -> Fraction:
    """The exact value of a quantity written as text (what parse_quantity does for str)."""
    match = _QUANTITY.match(value) if len(value) <= 64 else None
    if match is None:
        raise QuantityError(f"{value!r} is not a valid quantity (e.g. 512Mi, 2Gi, 1.5G, 2e9)")
    try:
        number = Fraction(Decimal(match["num"]))
    except (InvalidOperation, ValueError) as exc:  # pragma: no cover - regex guarantees shape
        raise QuantityError(f"{value!r} is not a valid quantity") from exc
    if match["bin"]:
        return number * Fraction(1024) ** _BINARY[match["bin"]]
    if match["exp"] is not None:
        exponent = int(match["exp"])
        if abs(exponent) > 64:
            raise QuantityError(f"{value!r}: exponent out of range")
        return number * Fraction(10) ** exponent
    return number * Fraction(10) ** _DECIMAL[match["dec"] or ""]


def parse_bytes(value: object) -> int:
    """A memory quantity in whole bytes, rounded up as the API server does."""
    return math.ceil(parse_quantity(value))


def ceil_mi(value: Fraction | int) -> int:
    """Round up to a whole MiB, in bytes (integer arithmetic: exact, and no Fractions)."""
    return -(-value.numerator // (value.denominator * MI)) * MI


@lru_cache(maxsize=1024)  # a few distinct values per cluster; called twice per change
def format_bytes(value: int) -> str:
    """Canonical text for a byte count: ``683Mi``, ``2Gi``, ``64M``, ``1500``.

    Whole MiB use binary suffixes (what the engine produces); other values keep the
    decimal form an operator most likely wrote (``64M`` rather than ``62500Ki``).
    """
    if value == 0:
        return "0"
    for suffix, size in _FORMAT_BINARY:
        if value % size == 0:
            return f"{value // size}{suffix}"
    for suffix, size in _FORMAT_DECIMAL:
        if value % size == 0:
            return f"{value // size}{suffix}"
    if value % 1024 == 0:
        return f"{value // 1024}Ki"
    return str(value)

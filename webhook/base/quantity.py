"""Exact Kubernetes resource quantities.

Requests and limits decide swap shares, so they are parsed exactly (as fractions of a
byte) instead of as floats: ``1.5Gi``, ``2e9`` and ``100m`` must compare equal to what the
API server computes, or a "request == limit" check silently goes wrong.

The grammar and the arithmetic are those of ``resource.ParseQuantity`` in
k8s.io/apimachinery (v0.34), including its corners: ASCII digits only, nothing around the
value (no whitespace, no newline), an optional sign, digits with an optional ``.`` (either
side may be empty: ``.5``, ``5.``, even ``.`` or ``-``, all valid), then one suffix: a
binary one (``Ki`` .. ``Ei``), a decimal SI one (``n u m k M G T P E``), or ``e``/``E``
followed by a signed base-10 integer (parsed as a 64-bit integer, then truncated to 32 bits
as Go's ``int32()`` does). Values are rounded up (away from zero) to a whole nano unit, and
binary-suffixed values are capped at 2^63-1, exactly as Kubernetes does.

Two limits are swapwise's own, and only refuse (never reinterpret) a value:
a decimal value beyond 2^63-1 (Kubernetes keeps it, but the kubelet and scheduler read
quantities as 64-bit integers, where it overflows), and text longer than
:data:`MAX_LENGTH` characters (the API server writes canonical forms of a few characters).
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

from webhook.base.cel import cel_string

MI = 1024 * 1024
MAX_INT64 = 2**63 - 1
# The rendered CEL (``swapwise render admission-policy``) computes in int64; its products of
# values below this stay below 2^63. The policy's memory quantities stay below it too.
INT64_SAFE = 2**62
MAX_LENGTH = 1000
NANO = Fraction(1, 10**9)

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DIGITS = frozenset("0123456789")
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")

_FORMAT_BINARY = (("Ei", 1024**6), ("Pi", 1024**5), ("Ti", 1024**4), ("Gi", 1024**3), ("Mi", MI))
_FORMAT_DECIMAL = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6),
                   ("k", 10**3))


class QuantityError(ValueError):
    """A value that is not a valid Kubernetes quantity."""


def parse_quantity(value: object) -> Fraction:
    """Return the exact value of a quantity (``"2Gi"``, ``"2e9"``, ``1536``...) in base units.

    A JSON number reads as its text would (the API server parses ``1.5`` as ``"1.5"``).
    """
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        if abs(value) > MAX_INT64:
            raise QuantityError("quantity out of range (beyond 2^63-1)")
        return parse_text(str(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{value!r} is not a quantity")
        return parse_text(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"a {type(value).__name__} is not a quantity")
    return parse_text(value)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _invalid(text: str) -> QuantityError:
    return QuantityError(f"{_shown(text)} is not a valid quantity (e.g. 512Mi, 2Gi, 1.5G, 2e9)")


def _out_of_range(text: str) -> QuantityError:
    return QuantityError(f"{_shown(text)} is out of range (beyond 2^63-1)")


def _scan(text: str) -> tuple[bool, str, str, str, bool]:
    """Go's ``parseQuantityString``: (positive, numerator, denominator, suffix, has_digits).

    The numerator has its leading zeros stripped (``"0"`` when nothing is left);
    ``has_digits`` says whether the number part held any digit at all.
    """
    end = len(text)
    pos = 0
    positive = True
    if end and text[0] in "+-":
        positive = text[0] == "+"
        pos = 1
    start = pos
    while pos < end and text[pos] == "0":
        pos += 1
    if pos == end:  # only a sign and zeros (or nothing): zero
        return positive, "0", "", "", pos > start
    num_start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    num = text[num_start:pos] or "0"
    has_digits = pos > start
    denom = ""
    if pos < end and text[pos] == ".":
        pos += 1
        denom_start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        denom = text[denom_start:pos]
        has_digits = has_digits or bool(denom)
        if pos == end:
            return positive, num, denom, "", has_digits
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos < end:
        raise _invalid(text)
    return positive, num, denom, text[suffix_start:], has_digits


def _go_int64(text: str) -> int | None:
    """``strconv.ParseInt(text, 10, 64)``: sign, ASCII digits, 64-bit range; else None."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or not all(c in _DIGITS for c in digits) or len(digits) > 25:
        return None
    number = int(text)
    return number if -(2**63) <= number <= MAX_INT64 else None


def _interpret(suffix: str) -> tuple[int, int] | None:
    """(base, exponent) of a suffix, as Kubernetes' ``quantitySuffixer.interpret``."""
    if suffix in _DECIMAL:
        return 10, _DECIMAL[suffix]
    if suffix in _BINARY:
        return 2, _BINARY[suffix]
    if len(suffix) > 1 and suffix[0] in "eE":
        exponent = _go_int64(suffix[1:])
        if exponent is None:
            return None
        return 10, (exponent + 2**31) % 2**32 - 2**31  # Go's int32(parsed)
    return None


def _round_up_nano(value: Fraction) -> Fraction:
    """Non-negative ``value`` rounded up to a whole nano unit (inf.RoundUp at scale 9)."""
    scaled = value * 10**9
    return Fraction(-(-scaled.numerator // scaled.denominator), 10**9)


def _slow_path(base: int, exponent: int, num: str, denom: str) -> bool:
    """Whether ParseQuantity leaves its int64 fast path (where a digit-less number fails)."""
    if base == 10:
        return 18 - (len(num) + len(denom)) < 0 or exponent - len(denom) < -9
    if denom:
        return True
    return 15 - len(num) - int(exponent * 3 / 10) - 1 < 0


# A cluster writes the same few quantities over and over ("2Gi", "500m"), and every
# admission parses each container's requests and limits: caching the exact (immutable)
# Fractions removes most of the engine's cost. Errors are not cached; size is bounded.
@lru_cache(maxsize=4096)
def parse_text(value: str) -> Fraction:
    """The exact value of a quantity written as text (what parse_quantity does for str)."""
    if not value:
        raise _invalid(value)
    if len(value) > MAX_LENGTH:
        raise QuantityError(f"quantity longer than {MAX_LENGTH} characters")
    positive, num, denom, suffix, has_digits = _scan(value)
    interpreted = _interpret(suffix)
    if interpreted is None:
        raise _invalid(value)
    base, exponent = interpreted
    if not has_digits and _slow_path(base, exponent, num, denom):
        raise _invalid(value)  # Go: "unable to parse numeric part of quantity"
    denom = denom.rstrip("0")
    digits = (num + denom).lstrip("0")
    if not digits:
        return Fraction(0)
    if base == 2:
        magnitude = Fraction(int(num + denom), 10 ** len(denom)) * 2**exponent
        magnitude = min(_round_up_nano(magnitude), Fraction(MAX_INT64))
    else:
        scale = exponent - len(denom)  # value = int(digits) * 10**scale
        if len(digits) - 1 + scale >= 19:
            raise _out_of_range(value)
        if len(digits) + scale <= -9:
            magnitude = NANO  # below one nano unit: rounds up to it
        else:
            magnitude = _round_up_nano(Fraction(int(digits)) * Fraction(10) ** scale)
            if magnitude > MAX_INT64:
                raise _out_of_range(value)
    return magnitude if positive else -magnitude


def parse_bytes(value: object) -> int:
    """A memory quantity in whole bytes, rounded up as the API server does."""
    return math.ceil(parse_quantity(value))


def cel_parse_bytes(text: str) -> str:
    """CEL twin of :func:`parse_bytes` for the CEL string expression ``text`` (a valid
    quantity): whole bytes, rounded up."""
    f = f"quantity({text}).asApproximateFloat()"
    return (f"(quantity({text}).isInteger() ? quantity({text}).asInteger() : "
            f"int({f}) + (double(int({f})) < {f} ? 1 : 0))")


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


def cel_positive(text: str) -> str:
    """CEL: is the quantity of the CEL string expression ``text`` above zero (as
    ``parse_quantity(text) > 0``)?"""
    return f"quantity({text}).compareTo(quantity('0')) > 0"


def cel_format_bytes(value: str) -> str:
    """CEL twin of :func:`format_bytes` for the CEL int expression ``value``."""
    out = "string(" + value + ")"
    out = f"({value} % 1024 == 0 ? string({value} / 1024) + 'Ki' : {out})"
    for suffix, size in reversed((*_FORMAT_BINARY, *_FORMAT_DECIMAL)):
        out = f"({value} % {size} == 0 ? string({value} / {size}) + {cel_string(suffix)} : {out})"
    return f"({value} == 0 ? '0' : {out})"


def readable_bytes(value: int) -> str:
    """A byte count for people: :func:`format_bytes` for whole MiB, else MiB with one
    decimal (``1.5Mi`` rather than ``1536Ki``)."""
    return format_bytes(value) if value % MI == 0 else f"{value / MI:.1f}Mi"


def readable_ratio(value: Fraction) -> str:
    """A ratio for people: at most three decimals, without trailing zeros."""
    return f"{float(value):.3f}".rstrip("0").rstrip(".")

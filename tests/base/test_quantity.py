import json
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from testkit.quantity_grammar import cases
from webhook.base.quantity import (
    MAX_INT64,
    QuantityError,
    ceil_mi,
    format_bytes,
    parse_bytes,
    parse_quantity,
)

GI = 1024**3
MI = 1024**2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2Gi", 2 * GI),
        ("2G", 2_000_000_000),
        ("2147483648", 2 * GI),
        ("1.5Gi", 3 * GI // 2),
        ("2e9", 2_000_000_000),
        ("2E9", 2_000_000_000),
        ("1536Mi", 1536 * MI),
        ("1E", 10**18),
        ("0.5Ki", 512),
        ("100m", Fraction(1, 10)),
        ("1e-3", Fraction(1, 1000)),
        (".5Gi", GI // 2),
        ("+1k", 1000),
        ("-1Mi", -MI),
        (1536, 1536),
        (1.5, Fraction(3, 2)),
    ],
)
def test_parse_exact(text: object, expected: object) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "text", ["", "2GB", "2 Gi", " 2Gi", "2gi", "2Ki5", "1e", "abc", "1..5", True, None,
             [], "1" * 1001, float("inf"), "1Gi\n", "\u0663Gi", "\uff11Gi", "1e19", 2**63,
             "1e4294967315"],
)
def test_parse_rejects(text: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_bytes_round_up_like_the_api_server() -> None:
    assert parse_bytes("100m") == 1
    assert parse_bytes("1.0000001Ki") == 1025


@pytest.mark.parametrize(
    ("value", "text"),
    [(683 * MI, "683Mi"), (2 * GI, "2Gi"), (1536 * MI, "1536Mi"), (64_000_000, "64M"),
     (1500, "1500"), (0, "0"), (4096, "4Ki"), (3000, "3k"), (1024**4, "1Ti")],
)
def test_format_canonical(value: int, text: str) -> None:
    assert format_bytes(value) == text
    assert parse_quantity(text) == value


def test_ceil_mi() -> None:
    assert ceil_mi(Fraction(2 * GI, 3)) == 683 * MI
    assert ceil_mi(MI) == MI
    assert ceil_mi(MI + 1) == 2 * MI


# --- the Kubernetes grammar, exactly -----------------------------------------------------

TABLE = json.loads((Path(__file__).parents[1] / "data" / "quantity_table.json").read_text())
EXPECTED = {text: (ok, value) for text, ok, value in TABLE}


def test_table_covers_every_grammar_case() -> None:
    # The table is Kubernetes' answer for exactly these cases (hack/quantity-oracle).
    assert sorted(EXPECTED) == sorted(cases())
    assert len(EXPECTED) > 3000


@pytest.mark.parametrize(("text", "ok", "value"), TABLE, ids=[repr(row[0]) for row in TABLE])
def test_same_answer_as_kubernetes(text: str, ok: bool, value: str) -> None:
    if not ok:
        with pytest.raises(QuantityError):
            parse_quantity(text)
        return
    exact = Fraction(Decimal(value))
    if abs(exact) > MAX_INT64:  # swapwise's one numeric limit of its own (module docstring)
        with pytest.raises(QuantityError, match="out of range"):
            parse_quantity(text)
        return
    assert parse_quantity(text) == exact


def test_table_holds_the_corners_the_issue_names() -> None:
    assert EXPECTED["1Gi\n"] == (False, "")
    assert EXPECTED["\u0663Gi"] == (False, "")
    assert EXPECTED["\uff11Gi"] == (False, "")
    assert EXPECTED["1234567890123456789Ei"][0]  # capped at 2^63-1, as Kubernetes does
    assert parse_quantity("1234567890123456789Ei") == MAX_INT64
    assert parse_quantity("-1234567890123456789Ei") == -MAX_INT64


def test_a_request_in_unicode_digits_is_not_equal_to_its_limit() -> None:
    # Was read as 3Gi (via \d and Decimal), so a pod with request "٣Gi" got rewritten.
    with pytest.raises(QuantityError):
        parse_quantity("\u0663Gi")


# --- properties --------------------------------------------------------------------------

_ascii_digits = st.text(alphabet="0123456789", max_size=12)
_suffixes = st.sampled_from(["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M",
                             "G", "T", "P", "E"])


def _reference(sign: str, whole: str, fraction: str, suffix: str, exponent: int | None
               ) -> Fraction:
    """Kubernetes' arithmetic, written independently: exact value, round up to a nano unit
    away from zero, binary forms capped at 2^63-1."""
    number = Fraction(int(whole or "0")) + (
        Fraction(int(fraction), 10 ** len(fraction)) if fraction else 0)
    if exponent is not None:
        number *= Fraction(10) ** exponent
    elif suffix.endswith("i"):
        number *= 1024 ** ("KMGTPE".index(suffix[0]) + 1)
    else:
        number *= Fraction(10) ** {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9,
                                   "T": 12, "P": 15, "E": 18}[suffix]
    nanos = number * 10**9
    number = Fraction(-(-nanos.numerator // nanos.denominator), 10**9)
    if suffix.endswith("i"):
        number = min(number, Fraction(MAX_INT64))
    return -number if sign == "-" else number


@settings(max_examples=400, deadline=None, derandomize=True)
@given(sign=st.sampled_from(["", "+", "-"]), whole=_ascii_digits, dot=st.booleans(),
       fraction=_ascii_digits, suffix=_suffixes,
       exponent=st.none() | st.integers(-30, 18))
def test_grammar_values_are_exact(sign: str, whole: str, dot: bool, fraction: str,
                                  suffix: str, exponent: int | None) -> None:
    fraction = fraction if dot else ""
    assume(whole or fraction)  # digit-less numbers are a corner the table covers
    suffix = suffix if exponent is None else ""
    text = f"{sign}{whole}{'.' if dot else ''}{fraction}"
    text += f"e{exponent}" if exponent is not None else suffix
    expected = _reference(sign, whole, fraction, suffix, exponent)
    if abs(expected) > MAX_INT64 and not suffix.endswith("i"):
        with pytest.raises(QuantityError, match="out of range"):
            parse_quantity(text)
    else:
        assert parse_quantity(text) == expected


@settings(max_examples=300, deadline=None, derandomize=True)
@given(value=st.integers(0, MAX_INT64))
def test_canonical_text_reads_back(value: int) -> None:
    assert parse_quantity(format_bytes(value)) == value
    assert parse_quantity(str(value)) == value
    assert parse_quantity(value) == value


@settings(max_examples=300, deadline=None, derandomize=True)
@given(value=st.sampled_from(["1", "2Gi", "1.5Gi", "100m", "2e9", ".5", "0"]),
       before=st.text(min_size=0, max_size=3), after=st.text(min_size=0, max_size=3))
def test_anything_around_a_quantity_that_is_not_grammar_is_refused(
    value: str, before: str, after: str
) -> None:
    text = before + value + after
    if any(c not in "0123456789+-.eEinumkKMGTP" for c in before + after):
        with pytest.raises(QuantityError):
            parse_quantity(text)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(text=st.text(max_size=40))
def test_any_text_parses_or_is_refused_cleanly(text: str) -> None:
    try:
        parsed = parse_quantity(text)
    except QuantityError:
        return
    assert isinstance(parsed, Fraction)
    assert all(c in "0123456789+-.eEinumkKMGTP" for c in text), text
    assert (parsed * 10**9).denominator == 1  # whole nano units


def test_long_exponents_and_digits_cost_nothing() -> None:
    assert parse_quantity("1e-4294967295") == 10  # Go truncates the exponent to int32: e1
    assert parse_quantity("1e4294967295") == Fraction(1, 10)  # int32: -1
    assert parse_quantity("1e-2147483648") == Fraction(1, 10**9)
    assert parse_quantity("0." + "0" * 900 + "1") == Fraction(1, 10**9)
    with pytest.raises(QuantityError, match="out of range"):
        parse_quantity("1e2147483647")

from fractions import Fraction

import pytest

from webhook.quantity import QuantityError, ceil_mi, format_bytes, parse_bytes, parse_quantity

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
    "text", ["", "Gi", "2GB", "2 Gi", " 2Gi", "2gi", "2Ki5", "1e", "abc", "1..5", True, None,
             [], "1" * 100, float("inf")],
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

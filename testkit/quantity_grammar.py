"""Quantity strings derived from the Kubernetes quantity grammar, for the table test.

``resource.ParseQuantity`` (k8s.io/apimachinery v0.34) reads
``[sign] [digits] [. [digits]] [suffix]`` where the suffix is binary (``Ki`` .. ``Ei``),
decimal SI (``n u m "" k M G T P E``) or ``e``/``E`` with a signed 64-bit integer (then
truncated to 32 bits). The cases are the cross product of each part's interesting
values (empty, zero, leading/trailing zeros, the int64 fast path's 18-digit edge, values
around 2^63, below one nano unit) plus text around and inside a valid quantity that must
be refused (whitespace, newlines, non-ASCII digits, stray characters).

The expected answers are Kubernetes' own: ``tests/data/quantity_table.json``, written
by ``hack/quantity-oracle/generate.sh`` (a Go program calling ParseQuantity).
"""

from __future__ import annotations

SIGNS = ("", "+", "-")
NUMBERS = (
    "", "0", "00", "1", "01", "5", "7", ".", ".5", "5.", "1.5", "0.5", "007.250", "1.000",
    "123456789012345678", "1234567890123456789", "9223372036854775807",
    "9223372036854775808", "12345678901234567890123", ".000000001", ".0000000001",
    "1.0000000001", "0.1234567890123", "8796093022208", "8796093022207.99",
)
SUFFIXES = (
    "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E",
    "e0", "e3", "E3", "e+3", "e-3", "e03", "e-9", "e-10", "e-12", "e18", "e19", "e20",
    "e-100", "e4294967286", "e4294967299", "e9223372036854775807", "e9223372036854775808",
    "e", "e+", "e-", "K", "ki", "KI", "KiB", "i", "Mii", "mi", "EE", "Ee3", "k3", "e1.5",
    "Ki1",
)
# Refused by Kubernetes although a valid quantity is inside (or a near miss).
ODD = (
    " 1Gi", "1Gi ", "1Gi\n", "\n1Gi", "\t1", "1\r", "1 Gi", "\u0663Gi", "\uff11Gi",
    "1\u0663", "1e\u0663", "\u00b2", "1,5", "1_000", "0x10", "1.5.5", "--1", "+-1", "-+1",
    "Inf", "NaN", "infinity", "1e1e1", "1Gi\x00", "\u00a01", "1.5\u2009Gi", "",
)


def cases() -> list[str]:
    generated = [sign + number + suffix
                 for sign in SIGNS for number in NUMBERS for suffix in SUFFIXES]
    return list(dict.fromkeys([*generated, *ODD]))

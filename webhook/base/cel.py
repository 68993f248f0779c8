"""CEL text shared by the contract modules and ``webhook/render``: string literals.

The engine decides in Python; the rendered admission policies decide the same in CEL. The
modules that own a contract (annotations, placement, warnings, selection) give its CEL form
beside its Python one, and build their literals here, as render does.
"""

from __future__ import annotations

import json


def cel_string(text: str) -> str:
    """A CEL string literal: printable ASCII as is, anything else escaped as CEL reads it,
    ``\\u00e9`` in the BMP and ``\\U0001f600`` beyond (JSON's surrogate pairs,
    ``\\ud83d\\ude00``, are invalid code points to cel-go, which refuses the expression)."""
    if text.isascii() and text.isprintable():
        return json.dumps(text)  # the same text: only " and \ are escaped
    out = ['"']
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif 0x20 <= code < 0x7F:
            out.append(char)
        elif 0xD800 <= code <= 0xDFFF:
            raise ValueError(f"{text!r} holds a lone surrogate, which no CEL string can hold")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)

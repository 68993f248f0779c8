"""CEL text: string and JSON literals, for the CEL twins of swapwise's rules.

The engine decides in Python; the rendered admission policies (``webhook/render``) decide
the same in CEL. Each rule's CEL form sits beside its Python one, in the module that owns
the rule (quantities here in ``base``, the profile's pod selector, the engine's
calculators), so a change to a rule shows both forms in one file; they build their
literals here, as the renderer does.
"""

from __future__ import annotations

import json
from typing import Any


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


def cel_literal(value: Any) -> str:
    """A CEL literal for a JSON value; members wrapped in dyn() so mixed maps type-check."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return cel_string(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{cel_string(k)}: dyn({cel_literal(v)})"
                               for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(f"dyn({cel_literal(v)})" for v in value) + "]"
    raise TypeError(f"no CEL literal for {value!r}")

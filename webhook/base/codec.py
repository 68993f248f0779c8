"""JSON in and out of the admission path: orjson, with the stdlib for what it refuses.

Parsing the AdmissionReview was a large part of an admission's cost with the stdlib;
orjson parses it several times faster (BENCHMARKS.md) and is stricter in ways that only
refuse what the API server never sends (NaN, integers beyond 64 bits, invalid UTF-8,
nesting beyond 1024 levels): such a body is answered 400 like any other broken one.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(data: bytes) -> Any:
    """Parse JSON; every malformed input raises ValueError (orjson.JSONDecodeError)."""
    return orjson.loads(data)


def dumps(value: Any) -> bytes:
    """Compact JSON. Falls back to the stdlib for what orjson refuses (e.g. deep nesting)."""
    try:
        result: bytes = orjson.dumps(value)
        return result
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(value, separators=(",", ":")).encode()

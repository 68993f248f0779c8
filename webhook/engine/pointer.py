"""JSON Patch (RFC 6902) operations built directly, without diffing whole objects."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

PatchOp = dict[str, Any]


@lru_cache(maxsize=256)  # tokens are few (annotation keys, field names), met per admission
def escape(token: str) -> str:
    """Escape one JSON Pointer token (RFC 6901): ``~`` first, then ``/``."""
    return token.replace("~", "~0").replace("/", "~1")


def add(path: str, value: Any) -> PatchOp:
    return {"op": "add", "path": path, "value": value}


def replace(path: str, value: Any) -> PatchOp:
    return {"op": "replace", "path": path, "value": value}


def set_member(parent_path: str, parent: dict[str, Any], key: str, value: Any) -> PatchOp:
    """Set ``parent[key]``: ``replace`` when it holds a value, ``add`` otherwise."""
    path = f"{parent_path}/{escape(key)}"
    return replace(path, value) if parent.get(key) is not None else add(path, value)

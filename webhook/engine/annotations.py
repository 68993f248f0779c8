"""Annotations calculator: record what swapwise did, so it can be audited and undone."""

from __future__ import annotations

import json
from typing import Any

from webhook.engine.pod import PodView
from webhook.engine.pointer import PatchOp, add, set_member
from webhook.engine.resources import ContainerChange

PROFILE_ANNOTATION = "swapwise.io/profile"
ORIGINAL_ANNOTATION = "swapwise.io/original"
# One encoder for every call: json.dumps with options builds a new one each time.
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def _original(view: PodView, changes: list[ContainerChange]) -> str | None:
    """Compact JSON of the original memory settings, keeping entries already recorded.

    A container reshaped on an earlier pass keeps its first recorded values: after a
    second webhook undid our change, the original is still what the user wrote.
    """
    recorded: dict[str, Any] = {}
    previous = view.annotations.get(ORIGINAL_ANNOTATION)
    if isinstance(previous, str):
        try:
            loaded = json.loads(previous)
        except ValueError:
            loaded = None
        if isinstance(loaded, dict):
            recorded = loaded
    merged = dict(recorded)
    for change in changes:
        merged.setdefault(change.container.name, change.original)
    if merged == recorded and previous is not None:
        return None
    return _COMPACT.encode(merged)


def annotation_ops(
    view: PodView, profile_name: str, changes: list[ContainerChange]
) -> list[PatchOp]:
    wanted: dict[str, str] = {}
    if view.annotations.get(PROFILE_ANNOTATION) != profile_name:
        wanted[PROFILE_ANNOTATION] = profile_name
    if changes:
        original = _original(view, changes)
        if original is not None:
            wanted[ORIGINAL_ANNOTATION] = original
    if not wanted:
        return []
    if "metadata" not in view.pod or view.pod["metadata"] is None:
        return [add("/metadata", {"annotations": wanted})]
    if view.metadata.get("annotations") is None:
        return [add("/metadata/annotations", wanted)]
    return [
        set_member("/metadata/annotations", view.annotations, key, value)
        for key, value in wanted.items()
    ]


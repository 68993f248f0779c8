"""Invariant checks every engine result must satisfy (used by table and property tests)."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from webhook.engine import Mutation, mutate_pod
from webhook.profile import Profile

ALLOWED_PREFIXES = (
    "/metadata/annotations",
    "/metadata",  # only when the pod had no metadata at all
    "/spec/affinity",
    "/spec/tolerations",
)


def path_allowed(path: str) -> bool:
    """May the engine's patch touch ``path`` (memory resources, resizePolicy, placement,
    its annotations)?"""
    parts = path.split("/")
    if len(parts) >= 4 and parts[1] == "spec" and parts[2] in ("containers", "initContainers"):
        return len(parts) >= 5 and parts[4] in ("resources", "resizePolicy")
    return path.startswith(ALLOWED_PREFIXES)


def strip_memory(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod without what the engine may change, to compare everything else."""
    result = copy.deepcopy(pod)
    metadata = result.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    annotations.pop("swapwise.io/profile", None)
    annotations.pop("swapwise.io/original", None)
    spec = result.get("spec") or {}
    spec.pop("affinity", None)
    spec.pop("tolerations", None)
    for field in ("containers", "initContainers"):
        for container in spec.get(field) or []:
            container.pop("resizePolicy", None)
            resources = container.get("resources") or {}
            for kind in ("requests", "limits"):
                values = resources.get(kind) or {}
                values.pop("memory", None)
                if not values:
                    resources.pop(kind, None)
            if not resources:
                container.pop("resources", None)
    if metadata.get("annotations") == {}:
        metadata.pop("annotations")
    if result.get("metadata") == {}:
        result.pop("metadata")
    return result


def apply(pod: dict[str, Any], profile: Profile, **kwargs: Any) -> tuple[dict[str, Any], Mutation]:
    """Mutate, apply the patch with jsonpatch, and check the docs/rules.md invariants."""
    original = copy.deepcopy(pod)
    mutation = mutate_pod(pod, profile, **kwargs)
    assert pod == original, "the engine must not modify its input"
    for op in mutation.patch:
        assert path_allowed(op["path"]), f"patch touches {op['path']}"
    result = jsonpatch.apply_patch(pod, mutation.patch)
    assert strip_memory(result) == strip_memory(original), "something besides memory changed"
    for message in mutation.warnings:
        assert len(message) <= 120 and message.startswith("swapwise: ")
    again = mutate_pod(result, profile, **kwargs)
    assert again.patch == [], f"second pass is not empty: {again.patch}"
    return result, mutation

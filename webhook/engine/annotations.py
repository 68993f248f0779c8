"""Annotations calculator: record what swapwise did, so it can be audited and undone.

These annotations are swapwise's own, but anyone can write them: junk in them (not JSON,
JSON nested a thousand levels deep, entries of the wrong shape) is ignored with a
warning, and the pod is reshaped as if it were absent.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson

from webhook.engine.pod import ORIGINAL_ANNOTATION, PROFILE_ANNOTATION, MalformedPod, PodView
from webhook.engine.pointer import PatchOp, add, set_member
from webhook.engine.resources import ContainerChange
from webhook.engine.warnings import warning

__all__ = [
    "ORIGINAL_ANNOTATION", "PROFILE_ANNOTATION", "RECORDED_LIMIT", "RECORDED_PARTS",
    "RECORDED_REQUEST", "annotation_ops", "cel_entry", "cel_has_entry", "cel_merged",
    "cel_recorded", "original_pod", "recorded_originals",
]

# One encoder for every call: json.dumps with options builds a new one each time.
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def _compact_json(value: dict[str, Any]) -> str:
    """``_COMPACT.encode(value)``, by orjson: the same text for ASCII (container names and
    quantities always are) but DEL, which the stdlib writes as ``\\u007f`` and orjson as
    is; anything else (junk recorded earlier) takes the stdlib's ``\\u`` escapes, so the
    annotation reads the same whichever way it was written (and a lone surrogate, which
    orjson refuses, is written as the stdlib does)."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:  # orjson.JSONEncodeError
        return _COMPACT.encode(value)
    return text if text.isascii() and "\x7f" not in text else _COMPACT.encode(value)


_JUNK = warning(f"ignored unreadable {ORIGINAL_ANNOTATION} annotation (rewritten)")


def _entry(value: Any) -> bool:
    """One recorded container: ``{"request": "2Gi", "limit": "2Gi"}`` (either may be absent)."""
    return (isinstance(value, dict) and set(value) <= {"request", "limit"}
            and all(type(v) is str for v in value.values()))


def recorded_originals(view: PodView) -> tuple[dict[str, Any], bool]:
    """(entries recorded on an earlier pass, whether the annotation held junk)."""
    previous = view.annotations.get(ORIGINAL_ANNOTATION)
    if previous is None:
        return {}, False
    if type(previous) is not str:
        return {}, True
    try:
        loaded = json.loads(previous)
    except (ValueError, RecursionError):
        return {}, True
    if not isinstance(loaded, dict):
        return {}, True
    kept = {name: value for name, value in loaded.items() if _entry(value)}
    return kept, len(kept) != len(loaded)


def original_pod(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The annotation read backwards: ``pod`` with the memory requests and limits recorded
    in ``swapwise.io/original`` put back, what it looked like before reshaping (``audit``
    compares the two for HPAs on memory utilisation). None without a record or with junk in
    it: junk is never traced back."""
    try:
        recorded, junk = recorded_originals(PodView.parse(pod))
    except MalformedPod:
        return None
    if junk or not recorded:
        return None
    before = copy.deepcopy(pod)
    spec = before.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    for group in ("initContainers", "containers"):
        for container in spec.get(group) or []:  # the pod parsed: containers are objects
            original = recorded.get(container["name"])
            if original is None:
                continue
            if not isinstance(container.get("resources"), dict):  # absent or null
                container["resources"] = {}
            resources = container["resources"]
            for key, section in (("request", "requests"), ("limit", "limits")):
                current = resources.get(section)
                if key in original:
                    if not isinstance(current, dict):
                        current = resources[section] = {}
                    current["memory"] = original[key]
                elif isinstance(current, dict):  # a limit added by defaultLimit; a request
                    current.pop("memory", None)  # that was not written
    return before


def _original(view: PodView, changes: list[ContainerChange]) -> tuple[str | None, bool]:
    """Compact JSON of the original memory settings, keeping entries already recorded.

    A container reshaped on an earlier pass keeps its first recorded values: after a
    second webhook undid our change, the original is still what the user wrote.
    """
    recorded, junk = recorded_originals(view)
    merged = dict(recorded)
    for change in changes:
        merged.setdefault(change.container.name, change.original)
    if merged == recorded and not junk and view.annotations.get(ORIGINAL_ANNOTATION) is not None:
        return None, False
    return _compact_json(merged), junk


def annotation_ops(
    view: PodView, profile_name: str, changes: list[ContainerChange]
) -> tuple[list[PatchOp], list[str]]:
    wanted: dict[str, str] = {}
    warnings: list[str] = []
    if view.annotations.get(PROFILE_ANNOTATION) != profile_name:
        wanted[PROFILE_ANNOTATION] = profile_name
    if changes:
        original, junk = _original(view, changes)
        if original is not None:
            wanted[ORIGINAL_ANNOTATION] = original
        if junk:
            warnings.append(_JUNK)
    if not wanted:
        return [], warnings
    if "metadata" not in view.pod or view.pod["metadata"] is None:
        return [add("/metadata", {"annotations": wanted})], warnings
    if view.metadata.get("annotations") is None:
        return [add("/metadata/annotations", wanted)], warnings
    return [
        set_member("/metadata/annotations", view.annotations, key, value)
        for key, value in wanted.items()
    ], warnings


# ---- The same annotation in CEL, for the rendered admission policies (webhook/render) ----
# Kubernetes' CEL has no JSON parser, so the policies write and read the text that
# _compact_json writes by its fixed shape: {"<name>":{"request":"<q>","limit":"<q>"},...},
# an entry of {} for a container that got defaultLimit. Arguments are CEL expressions.

# A recorded entry split at '"' (cel_recorded): its request, its limit, and the parts it has;
# fewer parts: recorded as {} (the container had no memory settings).
RECORDED_REQUEST = 3
RECORDED_LIMIT = 7
RECORDED_PARTS = 8


def cel_has_entry(text: str, name: str) -> str:
    """CEL: whether annotation text ``text`` records container ``name``."""
    return f"{text}.contains(strings.quote({name}) + ':')"


def cel_entry(name: str, request: str, limit: str, defaulted: str) -> str:
    """CEL: one container's entry, ``"<name>":{...}``, as :func:`_compact_json` writes it
    (``{}`` where ``defaulted``)."""
    value = (f"{defaulted} ? '{{}}' : '{{\"request\":' + strings.quote({request}) + "
             f"',\"limit\":' + strings.quote({limit}) + '}}'")
    return f"strings.quote({name}) + ':' + ({value})"


def cel_merged(old: str, entries: str) -> str:
    """CEL: the annotation text ``old`` (``''`` when absent) with the list of entries
    ``entries`` added, as :func:`_original` merges them (earlier entries first)."""
    return (f"{old}.matches('^[{{].*[}}]$') && {old} != '{{}}' ? {old}.substring(0, "
            f"{old}.size() - 1) + ({entries}.size() > 0 ? ',' : '') + "
            f"{entries}.join(',') + '}}' : '{{' + {entries}.join(',') + '}}'")


def cel_recorded(text: str, name: str) -> str:
    """CEL: container ``name``'s entry in ``text`` split at ``"``: see RECORDED_*."""
    key = f"strings.quote({name}) + ':'"
    entry = f"{text}.substring({text}.indexOf({key}) + size({key}))"
    entry = f"{entry}.substring(0, {entry}.indexOf('}}') + 1)"
    return f"{entry}.split('\"')"

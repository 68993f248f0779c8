"""Placement calculator: steer swap-eligible pods onto swap nodes.

Required node affinity terms are ORed by the scheduler, so the swap expression has to
be added to *every* term; adding it to one would let the pod land on a node without
swap through another term.
"""

from __future__ import annotations

from typing import Any

from webhook.engine.pod import PodView, as_dict, as_list
from webhook.engine.pointer import PatchOp, add, replace
from webhook.profile import Placement

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def _expressions(placement: Placement) -> list[dict[str, Any]]:
    return [
        {"key": key, "operator": "In", "values": [value]}
        for key, value in placement.node_selector
    ]


def _has(expressions: list[Any], wanted: dict[str, Any]) -> bool:
    for raw in expressions:
        expression = as_dict(raw, "matchExpressions[]")
        if (expression.get("key") == wanted["key"] and expression.get("operator") == "In"
                and expression.get("values") == wanted["values"]):
            return True
    return False


def _required_ops(spec: dict[str, Any], wanted: list[dict[str, Any]]) -> list[PatchOp]:
    affinity = as_dict(spec.get("affinity"), "spec.affinity")
    node_affinity = as_dict(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
    required = as_dict(node_affinity.get(REQUIRED), REQUIRED)
    terms = as_list(required.get("nodeSelectorTerms"), "nodeSelectorTerms")
    if not terms:  # one term, created with whatever objects are missing on the way
        value: Any = [{"matchExpressions": wanted}]
        if required:
            return [add(f"/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms", value)]
        value = {"nodeSelectorTerms": value}
        if node_affinity:
            return [add(f"/spec/affinity/nodeAffinity/{REQUIRED}", value)]
        value = {REQUIRED: value}
        if affinity:
            return [add("/spec/affinity/nodeAffinity", value)]
        return [add("/spec/affinity", {"nodeAffinity": value})]
    ops: list[PatchOp] = []
    base = f"/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms"
    for index, raw in enumerate(terms):
        term = as_dict(raw, "nodeSelectorTerms[]")
        existing = as_list(term.get("matchExpressions"), "matchExpressions")
        missing = [e for e in wanted if not _has(existing, e)]
        if not missing:
            continue
        if raw is None:  # a null term reads as empty; it has no members to add to
            ops.append(replace(f"{base}/{index}", {"matchExpressions": missing}))
        elif existing:
            ops.extend(add(f"{base}/{index}/matchExpressions/-", e) for e in missing)
        else:
            ops.append(add(f"{base}/{index}/matchExpressions", missing))
    return ops


def _preferred_ops(
    spec: dict[str, Any], wanted: list[dict[str, Any]], weight: int
) -> list[PatchOp]:
    affinity = as_dict(spec.get("affinity"), "spec.affinity")
    node_affinity = as_dict(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
    terms = as_list(node_affinity.get(PREFERRED), PREFERRED)
    for term in terms:
        preference = as_dict(as_dict(term, PREFERRED).get("preference"), "preference")
        existing = as_list(preference.get("matchExpressions"), "matchExpressions")
        if all(_has(existing, e) for e in wanted):
            return []
    entry = {"weight": weight, "preference": {"matchExpressions": wanted}}
    if terms:
        return [add(f"/spec/affinity/nodeAffinity/{PREFERRED}/-", entry)]
    if node_affinity:
        return [add(f"/spec/affinity/nodeAffinity/{PREFERRED}", [entry])]
    if affinity:
        return [add("/spec/affinity/nodeAffinity", {PREFERRED: [entry]})]
    return [add("/spec/affinity", {"nodeAffinity": {PREFERRED: [entry]}})]


def _normalized(toleration: Any) -> dict[str, Any]:
    """Tolerations compare equal when they differ only by defaulted fields."""
    toleration = as_dict(toleration, "spec.tolerations[]")
    return {
        "key": toleration.get("key", ""),
        "operator": toleration.get("operator") or "Equal",
        "value": toleration.get("value", ""),
        "effect": toleration.get("effect", ""),
        "tolerationSeconds": toleration.get("tolerationSeconds"),
    }


def _toleration_ops(spec: dict[str, Any], placement: Placement) -> list[PatchOp]:
    existing = as_list(spec.get("tolerations"), "spec.tolerations")
    if not placement.tolerations:  # nothing to add: only the shape is checked, as below
        for toleration in existing:
            if type(toleration) is not dict:
                as_dict(toleration, "spec.tolerations[]")
        return []
    seen = [_normalized(t) for t in existing]
    missing: list[dict[str, Any]] = []
    for toleration in placement.tolerations:
        normalized = _normalized(toleration)
        if normalized not in seen:
            seen.append(normalized)
            missing.append(dict(toleration))
    if not missing:
        return []
    if existing:
        return [add("/spec/tolerations/-", t) for t in missing]
    return [add("/spec/tolerations", missing)]


def placement_ops(view: PodView, placement: Placement) -> list[PatchOp]:
    """Affinity and tolerations for a pod that will be able to use swap."""
    if placement.mode == "none":
        return []
    ops: list[PatchOp] = []
    wanted = _expressions(placement)
    if wanted and placement.mode == "required":
        ops.extend(_required_ops(view.spec, wanted))
    elif wanted:
        ops.extend(_preferred_ops(view.spec, wanted, placement.weight))
    ops.extend(_toleration_ops(view.spec, placement))
    return ops

"""Placement calculator: steer swap-eligible pods onto swap nodes.

Required node affinity terms are ORed by the scheduler, so the swap expression has to
be added to *every* term; adding it to one would let the pod land on a node without
swap through another term.

Swap backing (docs/rules.md "Swap backing") rides on the same terms: a pod whose changed
containers need ``need``‰ of their request as swap gets ``swapwise.io/swap-permille Gt
need-1`` in every required term, after the swap-label expressions. In a term, an entry on
that key with operator ``Gt`` and one decimal-integer value is an *earlier swapwise entry*:
one whose value is already ≥ need-1 leaves the term alone (it implies ours); otherwise the
first one is replaced rather than a second one stacked. Any other entry on the key (another
operator, a value that is not a decimal integer) is the user's: kept, ours ANDed to it.

The pressure marks (docs/rules.md "The pressure marks") ride on them too: with ``required``
placement every term gets ``swapwise.io/memory-pressure DoesNotExist`` and
``swapwise.io/cpu-pressure DoesNotExist`` (appended after the swap-label expressions we add and
before the backing entry we add), so a new reshaped pod is not placed on a node its node agent
marked. A term that has an entry with a mark's key and that operator already gets no second
one; an entry on the key with another operator is the user's, kept and ANDed with ours.
``preferred`` and ``none`` placement get none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from webhook.base.cel import cel_string
from webhook.engine.backing import PERMILLE_LABEL
from webhook.engine.pod import PodView, as_dict, as_list
from webhook.engine.pointer import PatchOp, add, replace
from webhook.engine.pressure import MARKS
from webhook.profile import Placement

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
_DIGITS = re.compile(r"[0-9]+")
# Needs are far below 10^18 (a renderable profile bounds them by 1000 / requestRatio), so an
# earlier entry with more significant digits always implies ours; comparing only up to 18
# digits keeps int() cheap and is what the rendered CEL (int64) can do exactly too.
MAX_DIGITS = 18


def backing_expression(need: int) -> dict[str, Any]:
    """The match expression a pod of ``need`` (‰, ≥ 1) gets: the node's share ≥ need."""
    return {"key": PERMILLE_LABEL, "operator": "Gt", "values": [str(need - 1)]}


def pressure_expressions() -> list[dict[str, Any]]:
    """The match expressions every required term of a pod gets: no pressure mark."""
    return [mark.expression() for mark in MARKS]


def _unpressured(expressions: list[Any], key: str) -> bool:
    """Does the term already require the node to have no mark ``key``?"""
    for expression in expressions:
        if type(expression) is not dict:  # the call only off the common path
            expression = as_dict(expression, "matchExpressions[]")
        if expression.get("key") == key and expression.get("operator") == "DoesNotExist":
            return True
    return False


def _earlier(expressions: list[Any], floor: int) -> int | None:
    """Where the backing entry of a term goes: None when an earlier swapwise entry already
    requires ``Gt floor`` or more, else the index of the first earlier swapwise entry (to
    replace), or -1 (none: add)."""
    first = -1
    for index, expression in enumerate(expressions):
        if type(expression) is not dict:  # the call only off the common path
            expression = as_dict(expression, "matchExpressions[]")
        if expression.get("key") != PERMILLE_LABEL or expression.get("operator") != "Gt":
            continue
        values = expression.get("values")
        if type(values) is not list or len(values) != 1:
            continue
        value = values[0]
        if type(value) is not str or not _DIGITS.fullmatch(value):
            continue
        significant = value.lstrip("0")
        if len(significant) > MAX_DIGITS or int(significant or "0") >= floor:
            return None
        if first < 0:
            first = index
    return first


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


def _required_ops(
    spec: dict[str, Any], wanted: list[dict[str, Any]], need: int
) -> list[PatchOp]:
    """``wanted`` and the pressure entries into every required term, and the backing entry
    when ``need`` (‰) > 0, in that order."""
    affinity = as_dict(spec.get("affinity"), "spec.affinity")
    node_affinity = as_dict(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
    required = as_dict(node_affinity.get(REQUIRED), REQUIRED)
    terms = as_list(required.get("nodeSelectorTerms"), "nodeSelectorTerms")
    pressures = pressure_expressions()
    backing = backing_expression(need) if need > 0 else None
    if not terms:  # one term, created with whatever objects are missing on the way
        created = [*wanted, *pressures] if backing is None else [*wanted, *pressures, backing]
        value: Any = [{"matchExpressions": created}]
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
        missing.extend(p for p in pressures if not _unpressured(existing, p["key"]))
        slot = None
        if backing is not None:
            slot = _earlier(existing, need - 1)
            if slot is not None and slot < 0:  # no earlier swapwise entry: ours is added
                missing.append(backing)
                slot = None
        if not missing and slot is None:
            continue
        if raw is None:  # a null term reads as empty; it has no members to add to
            ops.append(replace(f"{base}/{index}", {"matchExpressions": missing}))
        elif existing:
            ops.extend(add(f"{base}/{index}/matchExpressions/-", e) for e in missing)
        elif missing:
            ops.append(add(f"{base}/{index}/matchExpressions", missing))
        if slot is not None:  # an earlier, weaker swapwise entry: replaced, not stacked
            ops.append(replace(f"{base}/{index}/matchExpressions/{slot}", backing))
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


def normalized_toleration(toleration: Any) -> dict[str, Any]:
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
    seen = [normalized_toleration(t) for t in existing]
    missing: list[dict[str, Any]] = []
    for toleration in placement.tolerations:
        normalized = normalized_toleration(toleration)
        if normalized not in seen:
            seen.append(normalized)
            missing.append(dict(toleration))
    if not missing:
        return []
    if existing:
        return [add("/spec/tolerations/-", t) for t in missing]
    return [add("/spec/tolerations", missing)]


def unique_tolerations(tolerations: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``tolerations`` without repeats (equal as :func:`normalized_toleration` says)."""
    seen: list[dict[str, Any]] = []
    out = []
    for toleration in tolerations:
        normalized = normalized_toleration(toleration)
        if normalized not in seen:
            seen.append(normalized)
            out.append(dict(toleration))
    return out


def cel_toleration_equal(t: str, toleration: dict[str, Any]) -> str:
    """CEL: whether the toleration ``t`` (a CEL expression) equals ``toleration`` as
    :func:`normalized_toleration` compares them, for the rendered admission policies."""
    wanted = normalized_toleration(toleration)
    seconds = wanted["tolerationSeconds"]
    same_seconds = (f"!has({t}.tolerationSeconds)" if seconds is None
                    else f"{t}.?tolerationSeconds.orValue(-1) == {seconds}")
    return (f"{t}.?key.orValue('') == {cel_string(wanted['key'])} && "
            f"({t}.?operator.orValue('') == '' ? 'Equal' : {t}.?operator.orValue('')) == "
            f"{cel_string(wanted['operator'])} && {t}.?value.orValue('') == "
            f"{cel_string(wanted['value'])} && {t}.?effect.orValue('') == "
            f"{cel_string(wanted['effect'])} && {same_seconds}")


def placement_ops(view: PodView, placement: Placement, need: int = 0) -> list[PatchOp]:
    """Affinity and tolerations for a pod that will be able to use swap.

    ``need``: the pod's swap-backing need in ‰ (0: no backing entry), with ``required``.
    ``required`` always adds the pressure entries, even with an empty nodeSelector.
    """
    if placement.mode == "none":
        return []
    ops: list[PatchOp] = []
    wanted = _expressions(placement)
    if placement.mode == "required":
        ops.extend(_required_ops(view.spec, wanted, need))
    elif wanted:
        ops.extend(_preferred_ops(view.spec, wanted, placement.weight))
    ops.extend(_toleration_ops(view.spec, placement))
    return ops

"""The memory-pressure mark: the names the engine, ``label-nodes`` and ``audit`` share.

``swapwise label-nodes --pressure-guard`` marks a swap node whose memory pressure (PSI) stays
high, and removes the mark when the pressure stays low, in one of two forms:

- ``label`` (the default): ``PRESSURE_LABEL: "true"``. The webhook adds
  ``{key: PRESSURE_LABEL, operator: DoesNotExist}`` to every required nodeSelectorTerm of a
  pod it reshapes, so only new reshaped pods are kept off the node. But a kubelet re-admits
  its pods against their node affinity when it restarts (kubernetes/kubernetes#124586): a
  restart while the node is marked fails the reshaped pods on it (reason NodeAffinity).
- ``taint``: ``PRESSURE_TAINT`` (NoSchedule). The kubelet ignores NoSchedule taints when it
  re-admits pods, so a restart keeps them; but every new pod that does not tolerate the
  taint is kept off the node, not only reshaped ones.

Nothing is evicted either way. ``PRESSURE_ANNOTATION`` on the node says why it was last
marked or cleared, with the figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

PRESSURE_LABEL = "swapwise.io/memory-pressure"
PRESSURE_VALUE = "true"
PRESSURE_ANNOTATION = "swapwise.io/memory-pressure"
PRESSURE_TAINT: dict[str, str] = {
    "key": PRESSURE_LABEL, "value": PRESSURE_VALUE, "effect": "NoSchedule"}

MarkForm = Literal["label", "taint"]
MARK_FORMS: tuple[MarkForm, ...] = ("label", "taint")


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def pressure_taints(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The node's taints with the mark's key, whatever their value and effect."""
    taints = _mapping(node.get("spec")).get("taints")
    return [t for t in taints if isinstance(t, Mapping) and t.get("key") == PRESSURE_LABEL] \
        if isinstance(taints, list) else []


def mark_forms(node: Mapping[str, Any]) -> set[MarkForm]:
    """The forms of the mark the node carries (empty: not marked), whatever their value."""
    forms: set[MarkForm] = set()
    if PRESSURE_LABEL in _mapping(_mapping(node.get("metadata")).get("labels")):
        forms.add("label")
    if pressure_taints(node):
        forms.add("taint")
    return forms

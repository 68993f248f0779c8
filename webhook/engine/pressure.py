"""The pressure marks: the names the engine, ``node-agent`` and ``audit`` share.

``swapwise node-agent`` marks its node while the kernel reports sustained memory pressure
(PSI) and, separately, sustained CPU pressure, and removes each mark when that pressure has
stayed low. A reshaped pod sent to a node that is already thrashing or CPU-starved would only
make it worse: the public density measurements put most of the added latency at peak density
on CPU contention, not on swap I/O. Each mark takes one of two forms:

- ``label`` (the default): ``<key>: "true"``. The webhook adds ``{key, operator: DoesNotExist}``
  for both keys to every required nodeSelectorTerm of a pod it reshapes, so only new reshaped
  pods are kept off the node. But a kubelet re-admits its pods against their node affinity
  when it restarts (kubernetes/kubernetes#124586): a restart while the node is marked fails
  the reshaped pods on it (reason NodeAffinity).
- ``taint``: a NoSchedule taint with the same key and value ``true``. The kubelet ignores
  NoSchedule taints when it re-admits pods, so a restart keeps them; but every new pod that
  does not tolerate the taint is kept off the node, not only reshaped ones.

Nothing is evicted either way. An annotation with the mark's key on the node says why it was
last marked or cleared, with the figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

PRESSURE_VALUE = "true"

MarkForm = Literal["label", "taint"]
MARK_FORMS: tuple[MarkForm, ...] = ("label", "taint")
Resource = Literal["memory", "cpu"]


@dataclass(frozen=True)
class Mark:
    """One pressure mark: the resource it is about and the key its label, taint and
    annotation share."""

    resource: Resource
    key: str

    @property
    def taint(self) -> dict[str, str]:
        return {"key": self.key, "value": PRESSURE_VALUE, "effect": "NoSchedule"}

    def expression(self) -> dict[str, Any]:
        """The match expression every required term of a reshaped pod gets."""
        return {"key": self.key, "operator": "DoesNotExist"}

    def taints(self, node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """The node's taints with this mark's key, whatever their value and effect."""
        taints = _mapping(node.get("spec")).get("taints")
        return [t for t in taints if isinstance(t, Mapping) and t.get("key") == self.key] \
            if isinstance(taints, list) else []

    def forms(self, node: Mapping[str, Any]) -> set[MarkForm]:
        """The forms of this mark the node carries (empty: not marked), whatever their
        value."""
        forms: set[MarkForm] = set()
        if self.key in _mapping(_mapping(node.get("metadata")).get("labels")):
            forms.add("label")
        if self.taints(node):
            forms.add("taint")
        return forms


MEMORY_MARK = Mark("memory", "swapwise.io/memory-pressure")
CPU_MARK = Mark("cpu", "swapwise.io/cpu-pressure")
MARKS: tuple[Mark, ...] = (MEMORY_MARK, CPU_MARK)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def marked(node: Mapping[str, Any]) -> list[Mark]:
    """The marks the node carries, in any form."""
    return [mark for mark in MARKS if mark.forms(node)]

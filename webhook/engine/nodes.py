"""One reading of a Node: the keys swapwise's node side writes and what a Node says of swap.

The node agent writes these keys on its own Node; ``audit`` reads them back, and the
webhook's placement selects on them. Every reader goes through here, so a Node field is
parsed one way (a quantity string and an integer alike, junk as "not reported"), never two.
Node fields are read without trusting their shape: a Node is another writer's object.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.base.quantity import MAX_INT64, QuantityError, parse_bytes
from webhook.engine.backing import node_permille
from webhook.profile import SWAP_LABEL

# The swap-node label ("true" on nodes whose kubelet runs LimitedSwap and that have swap).
SWAP_NODE_LABEL = SWAP_LABEL
# The kubelet's swapBehavior as the node admin declares it (kubelet --node-labels; the
# NodeRestriction admission plugin allows it: the key is not under kubernetes.io / k8s.io).
BEHAVIOR_LABEL = "swapwise.io/swap-behavior"
# What the node's swap is: disk (files and partitions), zram, or both ("mixed").
KIND_LABEL = "swapwise.io/swap-kind"
SWAP_KINDS = ("disk", "zram", "mixed")
# Why the node is or is not a swap node, in a sentence.
SWAP_NODE_ANNOTATION = SWAP_NODE_LABEL
# The figures behind the labels, as compact JSON (:class:`NodeFacts`).
FACTS_ANNOTATION = "swapwise.io/node-facts"

LIMITED_SWAP = "LimitedSwap"
NO_SWAP = "NoSwap"

_INT64_TEXT = re.compile(r"[+-]?[0-9]{1,25}")  # bounded: int() of a huge string is slow


def as_mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else empty."""
    return value if isinstance(value, Mapping) else {}


def node_name(node: Mapping[str, Any]) -> str:
    name = as_mapping(node.get("metadata")).get("name")
    return name if isinstance(name, str) else ""


def node_labels(node: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_mapping(as_mapping(node.get("metadata")).get("labels"))


def node_annotations(node: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_mapping(as_mapping(node.get("metadata")).get("annotations"))


def swap_capacity(node: Mapping[str, Any]) -> int | None:
    """``status.nodeInfo.swap.capacity`` in bytes (Kubernetes ≥ 1.33); None when the node
    does not report it or reports something that is not a size.

    The kubelet counts every swap device, zram included, at its full size: this is what
    it divides by when it grants a container its share, not what backs it.
    """
    info = as_mapping(as_mapping(node.get("status")).get("nodeInfo"))
    capacity = as_mapping(info.get("swap")).get("capacity")
    if isinstance(capacity, bool) or not isinstance(capacity, int | str):
        return None
    try:
        value = parse_bytes(capacity)
    except QuantityError:
        return None
    return max(value, 0)


def memory_capacity(node: Mapping[str, Any]) -> tuple[int | None, str]:
    """``status.capacity.memory`` in bytes (parsed exactly, rounded up to a whole byte as
    the API server's ``Value()`` does), or None and why it cannot be read. The kubelet
    divides by this (machine memory, not allocatable)."""
    raw = as_mapping(as_mapping(node.get("status")).get("capacity")).get("memory")
    if raw is None:
        return None, "no memory capacity reported (status.capacity.memory)"
    try:
        memory = parse_bytes(raw)
    except QuantityError as exc:
        return None, f"memory capacity (status.capacity.memory) unreadable: {exc}"
    if memory <= 0:
        return None, f"memory capacity (status.capacity.memory) {str(raw)[:40]!r} is not positive"
    return memory, ""


@dataclass(frozen=True)
class Permille:
    """A per-mille and what it is computed from; ``value`` None when it cannot be
    (``problem`` says why)."""

    swap: int  # backing swap, bytes
    memory: int | None  # status.capacity.memory, bytes
    value: int | None
    problem: str = ""


def permille_of(swap: int, node: Mapping[str, Any]) -> Permille:
    """floor(1000 x ``swap`` ÷ the node's memory capacity), or why there is none."""
    memory, problem = memory_capacity(node)
    if memory is None:
        return Permille(swap, None, None, problem)
    value = node_permille(swap, memory)
    if value > MAX_INT64:  # the scheduler reads a Gt label as a 64-bit integer
        return Permille(swap, memory, None,
                        f"swap {swap} bytes over memory {memory} bytes is beyond a 64-bit "
                        "per-mille")
    return Permille(swap, memory, value)


def status_permille(node: Mapping[str, Any]) -> Permille:
    """The per-mille the node's status implies when every byte of its reported swap backed
    pods (zram too): an upper bound, for a node no agent has measured."""
    return permille_of(swap_capacity(node) or 0, node)


def label_permille(value: Any) -> int | None:
    """A ``swapwise.io/swap-permille`` label value as the scheduler reads it for ``Gt``
    (``strconv.ParseInt(value, 10, 64)``); None when it cannot."""
    if not isinstance(value, str) or not _INT64_TEXT.fullmatch(value):
        return None
    number = int(value)
    return number if -MAX_INT64 - 1 <= number <= MAX_INT64 else None


def declared_behavior(node: Mapping[str, Any]) -> str | None:
    """The node's ``swapwise.io/swap-behavior`` label, or None when it has none."""
    value = node_labels(node).get(BEHAVIOR_LABEL)
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class NodeFacts:
    """What the node agent measured, as its ``swapwise.io/node-facts`` annotation says.

    ``declared_permille`` is set when the node carried another per-mille before the agent
    first measured it (declared by a NodePool, a node-group template or ``--node-labels``):
    the agent replaced it, and ``audit`` reports a declared value that overstated the swap.
    """

    permille: int | None
    swap_bytes: int
    disk_bytes: int
    zram_bytes: int
    backing_bytes: int
    memory_bytes: int | None
    swap_behavior: str | None
    behavior_source: str
    zswap: bool
    declared_permille: int | None = None

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "permille": self.permille, "swapBytes": self.swap_bytes,
            "diskBytes": self.disk_bytes, "zramBytes": self.zram_bytes,
            "backingBytes": self.backing_bytes, "memoryBytes": self.memory_bytes,
            "swapBehavior": self.swap_behavior, "behaviorSource": self.behavior_source,
            "zswap": self.zswap,
        }
        if self.declared_permille is not None:
            data["declaredPermille"] = self.declared_permille
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> NodeFacts | None:
        """The node's annotation, read back; None when it has none or it is unreadable."""
        raw = node_annotations(node).get(FACTS_ANNOTATION)
        if not isinstance(raw, str) or len(raw) > 4096:
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None

        def whole(key: str) -> int | None:
            value = data.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        def text(key: str) -> str | None:
            value = data.get(key)
            return value if isinstance(value, str) else None

        return cls(permille=whole("permille"), swap_bytes=whole("swapBytes") or 0,
                   disk_bytes=whole("diskBytes") or 0, zram_bytes=whole("zramBytes") or 0,
                   backing_bytes=whole("backingBytes") or 0,
                   memory_bytes=whole("memoryBytes"), swap_behavior=text("swapBehavior"),
                   behavior_source=text("behaviorSource") or "",
                   zswap=data.get("zswap") is True,
                   declared_permille=whole("declaredPermille"))

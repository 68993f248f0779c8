"""The labelling decision, pure: a Node as a dict and what is known of its kubelet in, the
metadata change it needs out.

A *swap node* is one whose kubelet runs ``memorySwap.swapBehavior: LimitedSwap`` and which
reports swap capacity above zero. Capacity alone is not enough: the kubelet's default is
``NoSwap``, and such a node reports capacity yet gives pods no swap. Kept free of any client
so every case (no status, capacity 0, behaviour undeclared, unreadable, a label with
another value) is a plain unit test.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from webhook.profile import SWAP_LABEL

_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

# Set by the node admin next to the kubelet configuration, e.g. kubelet
# --node-labels=swapwise.io/swap-behavior=LimitedSwap (NodeRestriction allows it: the key
# is not under kubernetes.io / k8s.io).
BEHAVIOR_LABEL = "swapwise.io/swap-behavior"
# Written by the labeller on every node it judges: "true: ..." / "false: ..." and why.
SWAP_NODE_ANNOTATION = "swapwise.io/swap-node"

LIMITED_SWAP = "LimitedSwap"
NO_SWAP = "NoSwap"

Source = Literal["declared", "kubelet"]
SOURCES: tuple[Source, ...] = ("declared", "kubelet")
_SOURCE_TEXT: dict[Source, str] = {
    "declared": f"source: node label {BEHAVIOR_LABEL}",
    "kubelet": "source: kubelet configz",
}
_SHOWN = 63  # characters of a foreign value quoted back in a message


class LabelError(ValueError):
    """A ``--label`` that the API server would refuse."""


class ConfigzError(ValueError):
    """A kubelet ``/configz`` answer that does not have the expected shape."""


@dataclass(frozen=True)
class Label:
    key: str
    value: str

    @classmethod
    def parse(cls, text: str) -> Label:
        """``key=value``, both checked like the API server checks label keys and values."""
        key, sep, value = text.partition("=")
        if not sep:
            raise LabelError(f"{text!r}: expected key=value")
        prefix, slash, name = key.rpartition("/")
        if slash and (not prefix or len(prefix) > 253 or not _PREFIX.match(prefix)):
            raise LabelError(f"{text!r}: the key prefix must be a DNS subdomain")
        if not _NAME.match(name):
            raise LabelError(f"{text!r}: the key name must be 1-63 characters "
                             "[A-Za-z0-9-_.], starting and ending alphanumeric")
        if value and not _NAME.match(value):
            raise LabelError(f"{text!r}: the value must be empty or 1-63 characters "
                             "[A-Za-z0-9-_.], starting and ending alphanumeric")
        return cls(key, value)

    def __str__(self) -> str:
        return f"{self.key}={self.value}"


DEFAULT_LABEL = Label(SWAP_LABEL, "true")


class Reason(StrEnum):
    """Why a node is, is not, or may not yet be judged a swap node (metric label values)."""

    LIMITED_SWAP = "LimitedSwap"
    NO_SWAP_CAPACITY = "NoSwapCapacity"
    SWAP_BEHAVIOR_NO_SWAP = "SwapBehaviorNoSwap"
    SWAP_BEHAVIOR_UNDECLARED = "SwapBehaviorUndeclared"
    SWAP_BEHAVIOR_UNKNOWN = "SwapBehaviorUnknown"  # a value that is neither of the two
    KUBELET_CONFIG_UNAVAILABLE = "KubeletConfigUnavailable"


@dataclass(frozen=True)
class Verdict:
    """Whether a node is a swap node, and the sentence that says why.

    ``swap`` is None when it cannot be known now (the kubelet could not be asked): the
    node is then left exactly as it is.
    """

    swap: bool | None
    reason: Reason
    message: str  # the annotation value: "true: ..." / "false: ..." (or why unknown)


@dataclass(frozen=True)
class NodeChange:
    node: str
    label: Literal["add", "remove", "keep"]
    patch: dict[str, Any]  # JSON merge patch: this label and this annotation, nothing else
    verdict: Verdict


def as_mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else empty: Node fields are read without trusting shape."""
    return value if isinstance(value, Mapping) else {}


def _show(value: str) -> str:
    """A foreign string, quoted and cut short, fit for a one-line message."""
    return repr(value if len(value) <= _SHOWN else value[:_SHOWN] + "...")


def swap_capacity(node: Mapping[str, Any]) -> int:
    """``status.nodeInfo.swap.capacity`` in bytes; 0 when absent or not a number.

    A kubelet before 1.33 reports nothing, which reads as no swap: the label claims swap
    only where the node itself says so.
    """
    info = as_mapping(as_mapping(node.get("status")).get("nodeInfo"))
    capacity = as_mapping(info.get("swap")).get("capacity")
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        return 0
    return max(capacity, 0)


def node_name(node: Mapping[str, Any]) -> str:
    name = as_mapping(node.get("metadata")).get("name")
    return name if isinstance(name, str) else ""


def _labels(node: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_mapping(as_mapping(node.get("metadata")).get("labels"))


def declared_behavior(node: Mapping[str, Any]) -> str | None:
    """The node's ``swapwise.io/swap-behavior`` label, or None when it has none."""
    value = _labels(node).get(BEHAVIOR_LABEL)
    return value if isinstance(value, str) else None


def configz_swap_behavior(payload: Any) -> str:
    """``kubeletconfig.memorySwap.swapBehavior`` of a kubelet ``/configz`` answer.

    ``""`` when the kubelet leaves it unset (its default, NoSwap). Anything that is not
    the shape the kubelet writes raises :class:`ConfigzError`: an answer we cannot read
    must not be mistaken for NoSwap (that would remove labels on a proxy hiccup).
    """
    if not isinstance(payload, Mapping):
        raise ConfigzError(f"configz is a JSON {type(payload).__name__}, not an object")
    config = payload.get("kubeletconfig")
    if not isinstance(config, Mapping):
        raise ConfigzError("configz has no kubeletconfig object")
    memory_swap = config.get("memorySwap")
    if memory_swap is None:
        return ""
    if not isinstance(memory_swap, Mapping):
        raise ConfigzError(f"kubeletconfig.memorySwap is a JSON {type(memory_swap).__name__}, "
                           "not an object")
    behavior = memory_swap.get("swapBehavior")
    if behavior is None:
        return ""
    if not isinstance(behavior, str):
        raise ConfigzError("kubeletconfig.memorySwap.swapBehavior is a JSON "
                           f"{type(behavior).__name__}, not a string")
    return behavior


def judge(node: Mapping[str, Any], behavior: str | None, source: Source,
          unavailable: str = "") -> Verdict:
    """Is ``node`` a swap node, given its kubelet's ``swapBehavior`` as far as known?

    ``behavior`` is the declared label value (``declared``) or the configz value, ``""``
    meaning unset (``kubelet``); None means not known: undeclared, or for ``kubelet`` not
    readable, ``unavailable`` saying why. Capacity is judged first, so a node without
    swap is never held up by a kubelet that cannot be asked.
    """
    capacity = swap_capacity(node)
    if capacity <= 0:
        return Verdict(False, Reason.NO_SWAP_CAPACITY,
                       "false: no swap capacity reported (status.nodeInfo.swap.capacity)")
    where = _SOURCE_TEXT[source]
    if behavior is None:
        if source == "kubelet":
            return Verdict(None, Reason.KUBELET_CONFIG_UNAVAILABLE,
                           f"unknown: kubelet configz not readable: {unavailable or 'not read'}")
        return Verdict(False, Reason.SWAP_BEHAVIOR_UNDECLARED,
                       f"false: swap capacity {capacity} bytes but swapBehavior undeclared "
                       f"(set node label {BEHAVIOR_LABEL}=LimitedSwap where the kubelet runs it)")
    subject = "kubelet swapBehavior" if source == "kubelet" else "declared swapBehavior"
    if behavior == LIMITED_SWAP:
        return Verdict(True, Reason.LIMITED_SWAP,
                       f"true: {subject} LimitedSwap, swap capacity {capacity} bytes ({where})")
    if behavior == NO_SWAP:
        return Verdict(False, Reason.SWAP_BEHAVIOR_NO_SWAP, f"false: {subject} NoSwap ({where})")
    if behavior == "" and source == "kubelet":
        return Verdict(False, Reason.SWAP_BEHAVIOR_NO_SWAP,
                       f"false: {subject} unset, the default NoSwap ({where})")
    return Verdict(False, Reason.SWAP_BEHAVIOR_UNKNOWN,
                   f"false: {subject} {_show(behavior)} is neither LimitedSwap nor NoSwap "
                   f"({where})")


def desired_change(node: Mapping[str, Any], verdict: Verdict, label: Label) -> NodeChange | None:
    """The merge patch that makes ``node`` carry ``label`` and the annotation per ``verdict``.

    None when nothing must change, so a steady cluster costs no writes. An unknown verdict
    changes nothing. A node that is not a swap node loses the label only when it holds our
    value: another value does not match the webhook's nodeSelector, so it claims nothing
    and is not ours to remove.
    """
    name = node_name(node)
    if not name or verdict.swap is None:
        return None
    metadata = as_mapping(node.get("metadata"))
    current = _labels(node).get(label.key)
    patch: dict[str, Any] = {}
    action: Literal["add", "remove", "keep"] = "keep"
    if verdict.swap and current != label.value:
        action, patch["labels"] = "add", {label.key: label.value}
    elif not verdict.swap and current == label.value:
        action, patch["labels"] = "remove", {label.key: None}  # merge patch: null deletes
    if as_mapping(metadata.get("annotations")).get(SWAP_NODE_ANNOTATION) != verdict.message:
        patch["annotations"] = {SWAP_NODE_ANNOTATION: verdict.message}
    if not patch:
        return None
    return NodeChange(name, action, {"metadata": patch}, verdict)

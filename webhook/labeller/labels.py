"""The labelling decision, pure: a Node as a dict in, the label change it needs out.

Kept free of any client so every case (no status, capacity 0, label already right, a
different value, other labels present) is a plain unit test.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from webhook.profile import SWAP_LABEL

_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class LabelError(ValueError):
    """A ``--label`` that the API server would refuse."""


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


@dataclass(frozen=True)
class LabelChange:
    node: str
    action: Literal["add", "remove"]
    patch: dict[str, Any]  # JSON merge patch: touches this one label and nothing else


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def swap_capacity(node: Mapping[str, Any]) -> int:
    """``status.nodeInfo.swap.capacity`` in bytes; 0 when absent or not a number.

    A kubelet before 1.33 reports nothing, which reads as no swap: the label claims swap
    only where the node itself says so.
    """
    info = _mapping(_mapping(node.get("status")).get("nodeInfo"))
    capacity = _mapping(info.get("swap")).get("capacity")
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        return 0
    return max(capacity, 0)


def node_name(node: Mapping[str, Any]) -> str:
    name = _mapping(node.get("metadata")).get("name")
    return name if isinstance(name, str) else ""


def desired_change(node: Mapping[str, Any], label: Label) -> LabelChange | None:
    """The change that makes ``node`` carry ``label`` exactly when it has swap.

    A node without swap loses the label only when it holds our value: another value does
    not match the webhook's nodeSelector, so it claims nothing and is not ours to remove.
    """
    name = node_name(node)
    if not name:
        return None
    labels = _mapping(_mapping(node.get("metadata")).get("labels"))
    current = labels.get(label.key)
    if swap_capacity(node) > 0:
        if current == label.value:
            return None
        return LabelChange(name, "add", {"metadata": {"labels": {label.key: label.value}}})
    if current != label.value:
        return None
    return LabelChange(name, "remove", {"metadata": {"labels": {label.key: None}}})

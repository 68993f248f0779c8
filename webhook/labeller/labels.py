"""The labelling decision, pure: a Node as a dict and what is known of its kubelet in, the
metadata change it needs out.

A *swap node* is one whose kubelet runs ``memorySwap.swapBehavior: LimitedSwap`` and which
reports swap capacity above zero. Capacity alone is not enough: the kubelet's default is
``NoSwap``, and such a node reports capacity yet gives pods no swap. Kept free of any client
so every case (no status, capacity 0, behaviour undeclared, unreadable, a label with
another value) is a plain unit test.

A swap node also carries ``swapwise.io/swap-permille``: floor(1000 * swap capacity /
memory capacity) (:func:`webhook.engine.backing.node_permille`), what the webhook's
``Gt`` node-affinity compares a pod's need with. It follows both capacities; a node that
is not a swap node, or whose memory capacity cannot be read, does not carry it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from webhook.base.quantity import MAX_INT64, QuantityError, parse_bytes
from webhook.engine.backing import PERMILLE_LABEL, node_permille
from webhook.engine.pressure import (
    PRESSURE_ANNOTATION,
    PRESSURE_LABEL,
    PRESSURE_TAINT,
    PRESSURE_VALUE,
    MarkForm,
    mark_forms,
    pressure_taints,
)
from webhook.profile import SWAP_LABEL

# As the API server checks label keys (a qualified name) and values (apimachinery's
# IsQualifiedName and IsValidLabelValue); matched whole (fullmatch: "$" would let a
# trailing newline through).
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

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
        problem = label_key_problem(key) or label_value_problem(value)
        if problem is not None:
            raise LabelError(f"{text!r}: {problem}")
        return cls(key, value)

    def __str__(self) -> str:
        return f"{self.key}={self.value}"


DEFAULT_LABEL = Label(SWAP_LABEL, "true")


def label_key_problem(key: str) -> str | None:
    """Why the API server would refuse ``key`` as a label key (``[prefix/]name``), if so.
    The one check of label keys: ``--label`` here, the policy's selectors and tolerations."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _PREFIX.fullmatch(prefix)):
        return "the key prefix must be a DNS subdomain"
    if not _NAME.fullmatch(name):
        return ("the key name must be 1-63 characters [A-Za-z0-9-_.], starting and ending "
                "alphanumeric")
    return None


def label_value_problem(value: str) -> str | None:
    """Why the API server would refuse ``value`` as a label value, if so."""
    if value and not _NAME.fullmatch(value):
        return ("the value must be empty or 1-63 characters [A-Za-z0-9-_.], starting and "
                "ending alphanumeric")
    return None


class Reason(StrEnum):
    """Why a node is, is not, or may not yet be judged a swap node (metric label values)."""

    LIMITED_SWAP = "LimitedSwap"
    NO_SWAP_CAPACITY = "NoSwapCapacity"
    SWAP_BEHAVIOR_NO_SWAP = "SwapBehaviorNoSwap"
    SWAP_BEHAVIOR_UNDECLARED = "SwapBehaviorUndeclared"
    SWAP_BEHAVIOR_UNKNOWN = "SwapBehaviorUnknown"  # a value that is neither of the two
    KUBELET_CONFIG_UNAVAILABLE = "KubeletConfigUnavailable"


@dataclass(frozen=True)
class Permille:
    """A node's ``swapwise.io/swap-permille`` and what it is computed from.

    ``value`` is None when it cannot be computed (``problem`` says why): the node then
    carries no per-mille label, so no pod that needs backing is placed there.
    """

    swap: int  # status.nodeInfo.swap.capacity, bytes (0: none reported)
    memory: int | None  # status.capacity.memory, bytes; None: missing or unreadable
    value: int | None
    problem: str = ""

    @property
    def text(self) -> str:
        """What the annotation says of it, after the swap capacity."""
        if self.value is None:
            return f"; no {PERMILLE_LABEL}: {self.problem}"
        return f", memory capacity {self.memory} bytes: {PERMILLE_LABEL}={self.value}"


@dataclass(frozen=True)
class Verdict:
    """Whether a node is a swap node, and the sentence that says why.

    ``swap`` is None when it cannot be known now (the kubelet could not be asked): the
    node is then left exactly as it is. ``permille`` is set on swap nodes only.
    """

    swap: bool | None
    reason: Reason
    message: str  # the annotation value: "true: ..." / "false: ..." (or why unknown)
    permille: Permille | None = None

    @property
    def permille_value(self) -> int | None:
        """The ``swapwise.io/swap-permille`` value the node must carry; None: no label."""
        if not self.swap or self.permille is None:
            return None
        return self.permille.value


@dataclass(frozen=True)
class PressureWant:
    """Whether the node must carry the memory-pressure mark (:mod:`.pressure`), and the
    annotation written with it when the mark comes or goes."""

    marked: bool
    message: str
    form: MarkForm = "label"  # how a marked node carries it (engine/pressure.py says why)


@dataclass(frozen=True)
class NodeChange:
    node: str
    label: Literal["add", "remove", "keep"]
    # JSON merge patch: these labels and annotations, and the whole taint list with the
    # resourceVersion it was computed from when the pressure mark is a taint
    patch: dict[str, Any]
    verdict: Verdict
    permille: Literal["set", "remove", "keep"] = "keep"  # the swapwise.io/swap-permille label
    # The swapwise.io/memory-pressure mark: put on, taken off, or its value corrected.
    pressure: Literal["mark", "clear", "fix", "keep"] = "keep"


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


def memory_capacity(node: Mapping[str, Any]) -> tuple[int | None, str]:
    """``status.capacity.memory`` in bytes (parsed exactly, rounded up to a whole byte as
    the API server's ``Value()`` does), or None and why it cannot be read."""
    capacity = as_mapping(node.get("status")).get("capacity")
    raw = as_mapping(capacity).get("memory")
    if raw is None:
        return None, "no memory capacity reported (status.capacity.memory)"
    try:
        memory = parse_bytes(raw)
    except QuantityError as exc:
        return None, f"memory capacity (status.capacity.memory) unreadable: {exc}"
    if memory <= 0:
        return None, f"memory capacity (status.capacity.memory) {_show(str(raw))} is not positive"
    return memory, ""


def swap_permille(node: Mapping[str, Any]) -> Permille:
    """The node's per-mille from its status, or why there is none."""
    swap = swap_capacity(node)
    memory, problem = memory_capacity(node)
    if memory is None:
        return Permille(swap, None, None, problem)
    value = node_permille(swap, memory)
    if value > MAX_INT64:  # the scheduler reads a Gt label as a 64-bit integer
        return Permille(swap, memory, None,
                        f"swap {swap} bytes over memory {memory} bytes is beyond a 64-bit "
                        "per-mille")
    return Permille(swap, memory, value)


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
        permille = swap_permille(node)
        return Verdict(True, Reason.LIMITED_SWAP,
                       f"true: {subject} LimitedSwap, swap capacity {capacity} bytes"
                       f"{permille.text} ({where})", permille)
    if behavior == NO_SWAP:
        return Verdict(False, Reason.SWAP_BEHAVIOR_NO_SWAP, f"false: {subject} NoSwap ({where})")
    if behavior == "" and source == "kubelet":
        return Verdict(False, Reason.SWAP_BEHAVIOR_NO_SWAP,
                       f"false: {subject} unset, the default NoSwap ({where})")
    return Verdict(False, Reason.SWAP_BEHAVIOR_UNKNOWN,
                   f"false: {subject} {_show(behavior)} is neither LimitedSwap nor NoSwap "
                   f"({where})")


def desired_change(node: Mapping[str, Any], verdict: Verdict, label: Label,
                   pressure: PressureWant | None = None) -> NodeChange | None:
    """The merge patch that makes ``node`` carry ``label``, ``swapwise.io/swap-permille``
    and the annotation per ``verdict``, and the memory-pressure mark per ``pressure``.

    None when nothing must change, so a steady cluster costs no writes. An unknown verdict
    changes nothing. A node that is not a swap node loses the label only when it holds our
    value: another value does not match the webhook's nodeSelector, so it claims nothing
    and is not ours to remove. The per-mille label is swapwise's own whatever its value:
    any value on a node without a computable per-mille goes.

    The memory-pressure mark is swapwise's own too: ``pressure`` None leaves it alone; else
    the node carries it in the wanted form only (label ``true`` or the NoSchedule taint),
    the other form and other values go, and its annotation is written only when the mark
    comes or goes, so it keeps saying why the last change was made.
    """
    name = node_name(node)
    if not name or verdict.swap is None:
        return None
    metadata = as_mapping(node.get("metadata"))
    labels = _labels(node)
    current = labels.get(label.key)
    patch: dict[str, Any] = {}
    changed: dict[str, str | None] = {}  # merge patch: null deletes
    action: Literal["add", "remove", "keep"] = "keep"
    if verdict.swap and current != label.value:
        action, changed[label.key] = "add", label.value
    elif not verdict.swap and current == label.value:
        action, changed[label.key] = "remove", None
    permille: Literal["set", "remove", "keep"] = "keep"
    wanted = verdict.permille_value
    if wanted is not None and labels.get(PERMILLE_LABEL) != str(wanted):
        permille, changed[PERMILLE_LABEL] = "set", str(wanted)
    elif wanted is None and PERMILLE_LABEL in labels:
        permille, changed[PERMILLE_LABEL] = "remove", None
    annotations: dict[str, str] = {}
    mark: Literal["mark", "clear", "fix", "keep"] = "keep"
    taints: list[Any] | None = None  # the node's new taint list, when it changes
    if pressure is not None:
        carried = mark_forms(node)
        label_wanted = pressure.marked and pressure.form == "label"
        taint_wanted = pressure.marked and pressure.form == "taint"
        if label_wanted and labels.get(PRESSURE_LABEL) != PRESSURE_VALUE:
            changed[PRESSURE_LABEL] = PRESSURE_VALUE
        elif not label_wanted and PRESSURE_LABEL in labels:
            changed[PRESSURE_LABEL] = None
        ours = [(t.get("key"), t.get("value"), t.get("effect")) for t in pressure_taints(node)]
        if ours != ([tuple(PRESSURE_TAINT.values())] if taint_wanted else []):
            current_taints = as_mapping(node.get("spec")).get("taints")
            others = [t for t in current_taints if not (isinstance(t, Mapping) and t.get(
                "key") == PRESSURE_LABEL)] if isinstance(current_taints, list) else []
            taints = others + ([dict(PRESSURE_TAINT)] if taint_wanted else [])
        if pressure.marked and not carried:
            mark = "mark"
            annotations[PRESSURE_ANNOTATION] = pressure.message
        elif not pressure.marked and carried:
            mark = "clear"
            annotations[PRESSURE_ANNOTATION] = pressure.message
        elif PRESSURE_LABEL in changed or taints is not None:
            mark = "fix"  # another value, or the other form: no new annotation
    if changed:
        patch["labels"] = changed
    if as_mapping(metadata.get("annotations")).get(SWAP_NODE_ANNOTATION) != verdict.message:
        annotations[SWAP_NODE_ANNOTATION] = verdict.message
    if annotations:
        patch["annotations"] = annotations
    if not patch and taints is None:
        return None
    body: dict[str, Any] = {"metadata": patch}
    if taints is not None:
        # A merge patch replaces the whole list: the resourceVersion makes the API server
        # refuse it (409) if the taints changed since this node was read, and the next
        # reconcile starts from the newer node.
        body["spec"] = {"taints": taints or None}
        version = metadata.get("resourceVersion")
        if isinstance(version, str) and version:
            patch["resourceVersion"] = version
    return NodeChange(name, action, body, verdict, permille, mark)

"""What the node agent writes on its Node, decided purely: the Node as read, what the kernel
and kubelet said, and the pressure marks wanted in; a merge patch of swapwise's keys out.

A *swap node* is one whose kubelet runs ``memorySwap.swapBehavior: LimitedSwap`` and which
has swap. Swap alone is not enough: the kubelet's default is ``NoSwap``, and such a node has
swap yet gives pods none. The per-mille counts *backing* swap: disk in full, zram only as
configured (``zram_backing``, default nothing), because zram's pages live in RAM; a node
whose only swap is zram is a swap node with per-mille 0, which backs no pod that needs it.

Only keys under ``swapwise.io/`` are ever in a patch (the chart's admission policy refuses
anything else from the agent), and a patch is made only when something differs, so a calm
node costs no writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from webhook.agent.kernel import SwapFacts
from webhook.engine.backing import PERMILLE_LABEL
from webhook.engine.nodes import (
    BEHAVIOR_LABEL,
    FACTS_ANNOTATION,
    KIND_LABEL,
    LIMITED_SWAP,
    NO_SWAP,
    SWAP_NODE_ANNOTATION,
    SWAP_NODE_LABEL,
    NodeFacts,
    as_mapping,
    label_permille,
    node_annotations,
    node_labels,
    node_name,
    permille_of,
)
from webhook.engine.pressure import MARKS, PRESSURE_VALUE, Mark, MarkForm

Source = Literal["declared", "kubelet"]
SOURCES: tuple[Source, ...] = ("declared", "kubelet")
_SHOWN = 63  # characters of a foreign value quoted back in a message


@dataclass(frozen=True)
class Behavior:
    """The kubelet's ``swapBehavior`` as far as known: the configz value (``""``: unset, the
    default NoSwap) or the declared label; None when it cannot be known (``problem``)."""

    value: str | None
    source: Source
    problem: str = ""


@dataclass(frozen=True)
class MarkWant:
    """Whether the node must carry a pressure mark, and the annotation written with it when
    the mark comes or goes."""

    marked: bool
    message: str


@dataclass(frozen=True)
class Verdict:
    swap: bool | None  # None: cannot be known now; the swap labels are left as they are
    message: str
    facts: NodeFacts | None = None


@dataclass(frozen=True)
class NodeChange:
    """A merge patch of the agent's keys, and what it does, for the log."""

    node: str
    patch: dict[str, Any]
    summary: dict[str, Any]


def _show(value: str) -> str:
    return repr(value if len(value) <= _SHOWN else value[:_SHOWN] + "...")


def backing_bytes(swap: SwapFacts, zram_backing: Fraction) -> int:
    """Disk swap in full, zram at ``zram_backing`` of its size (rounded down)."""
    return swap.total("disk") + int(swap.total("zram") * zram_backing)


def judge(node: Mapping[str, Any], swap: SwapFacts, behavior: Behavior,
          zram_backing: Fraction = Fraction(0)) -> Verdict:
    """Is ``node`` a swap node, and what are its figures?"""
    where = (f"source: node label {BEHAVIOR_LABEL}" if behavior.source == "declared"
             else "source: kubelet configz")
    total = swap.total()
    if total <= 0:
        verdict = Verdict(False, "false: no swap device (/proc/swaps)")
    elif behavior.value is None:
        if behavior.source == "kubelet":
            return Verdict(None, "unknown: kubelet configz not readable: "
                           f"{behavior.problem or 'not read'}")
        verdict = Verdict(False, f"false: swap {total} bytes but swapBehavior undeclared (set "
                          f"node label {BEHAVIOR_LABEL}=LimitedSwap where the kubelet runs it)")
    else:
        subject = ("kubelet swapBehavior" if behavior.source == "kubelet"
                   else "declared swapBehavior")
        if behavior.value == LIMITED_SWAP:
            verdict = Verdict(True, f"true: {subject} LimitedSwap ({where})")
        elif behavior.value == NO_SWAP or (behavior.value == "" and behavior.source == "kubelet"):
            unset = " unset, the default" if behavior.value == "" else ""
            verdict = Verdict(False, f"false: {subject}{unset} NoSwap ({where})")
        else:
            verdict = Verdict(False, f"false: {subject} {_show(behavior.value)} is neither "
                              f"LimitedSwap nor NoSwap ({where})")
    backing = backing_bytes(swap, zram_backing)
    permille = permille_of(backing, node) if verdict.swap else None
    earlier = NodeFacts.of(node)
    declared = earlier.declared_permille if earlier is not None else \
        label_permille(node_labels(node).get(PERMILLE_LABEL))
    measured = permille.value if permille is not None else None
    if earlier is None and declared == measured:
        declared = None  # the node said what the agent measures: nothing was overstated
    facts = NodeFacts(
        permille=measured, swap_bytes=total, disk_bytes=swap.total("disk"),
        zram_bytes=swap.total("zram"), backing_bytes=backing,
        memory_bytes=permille.memory if permille is not None else None,
        swap_behavior=behavior.value, behavior_source=behavior.source, zswap=swap.zswap,
        declared_permille=declared)
    if verdict.swap:
        assert permille is not None
        figures = (f"; swap {total} bytes ({swap.kind}), backing {backing} bytes"
                   + (f", memory capacity {permille.memory} bytes: {PERMILLE_LABEL}="
                      f"{permille.value}" if permille.value is not None
                      else f"; no {PERMILLE_LABEL}: {permille.problem}"))
        verdict = Verdict(True, verdict.message + figures)
    return Verdict(verdict.swap, verdict.message, facts)


def _taint_id(taint: Mapping[str, Any]) -> tuple[str, str, str]:
    """A taint as compared: an absent value is the empty one (the API server omits it)."""
    return str(taint.get("key")), str(taint.get("value") or ""), str(taint.get("effect"))


def _taint_body(node: Mapping[str, Any], managed: set[str], wanted: set[str]
                ) -> list[Any] | None:
    """The node's whole taint list with swapwise's mark taints of the ``managed`` keys
    exactly ``wanted`` (keys), every other taint as it is; None when it already is."""
    current = as_mapping(node.get("spec")).get("taints")
    current = current if isinstance(current, list) else []
    ours = [t for t in current if isinstance(t, Mapping) and isinstance(t.get("key"), str)
            and t.get("key") in managed]
    if sorted(_taint_id(t) for t in ours) == sorted(
            (m.key, PRESSURE_VALUE, "NoSchedule") for m in MARKS if m.key in wanted):
        return None
    others = [t for t in current if t not in ours]
    return others + [m.taint for m in MARKS if m.key in wanted]


def _label(labels: Mapping[str, str], key: str, value: str | None) -> dict[str, str | None]:
    """The merge-patch entry that makes label ``key`` be ``value`` (None: absent); empty
    when it already is."""
    if value is None:
        return {key: None} if key in labels else {}
    return {} if labels.get(key) == value else {key: value}


def swap_kind(facts: NodeFacts) -> str | None:
    """The ``swapwise.io/swap-kind`` value: ``disk``, ``zram`` or ``mixed``; None without
    swap."""
    return ("mixed" if facts.disk_bytes and facts.zram_bytes else
            "zram" if facts.zram_bytes else "disk" if facts.disk_bytes else None)


def swap_labels(node: Mapping[str, Any], verdict: Verdict) -> dict[str, str | None]:
    """The swap-node, per-mille and swap-kind labels that make ``node`` say ``verdict``
    (only those that differ); none while the verdict is unknown."""
    facts = verdict.facts
    if verdict.swap is None or facts is None:
        return {}
    labels = node_labels(node)
    permille = str(facts.permille) if verdict.swap and facts.permille is not None else None
    return {**_label(labels, SWAP_NODE_LABEL, "true" if verdict.swap else None),
            **_label(labels, PERMILLE_LABEL, permille),
            **_label(labels, KIND_LABEL, swap_kind(facts))}


def swap_annotations(node: Mapping[str, Any], verdict: Verdict) -> dict[str, str]:
    """Why the node is or is not a swap node, and its figures as JSON, where they differ
    from what ``node`` says; none while the verdict is unknown."""
    if verdict.swap is None or verdict.facts is None:
        return {}
    now = node_annotations(node)
    wanted = {SWAP_NODE_ANNOTATION: verdict.message, FACTS_ANNOTATION: verdict.facts.to_json()}
    return {key: text for key, text in wanted.items() if now.get(key) != text}


@dataclass(frozen=True)
class MarkChange:
    """What one wanted pressure mark changes: its label, its annotation and the log's
    word, and whether it is wanted as a taint (the taints are one list: see
    :func:`_taint_body`)."""

    labels: dict[str, str | None]
    annotations: dict[str, str]
    summary: dict[str, str]
    taint: bool


def mark_change(node: Mapping[str, Any], mark: Mark, want: MarkWant, form: MarkForm
                ) -> MarkChange:
    """The node carries ``mark`` in ``form`` only, or not at all; its annotation is
    written only when the mark comes or goes, so it keeps saying why the last change was
    made."""
    label = _label(node_labels(node), mark.key,
                   PRESSURE_VALUE if want.marked and form == "label" else None)
    if want.marked == bool(mark.forms(node)):
        return MarkChange(label, {}, {}, want.marked and form == "taint")
    return MarkChange(label, {mark.key: want.message},
                      {mark.resource: "marked" if want.marked else "cleared"},
                      want.marked and form == "taint")


def desired_change(node: Mapping[str, Any], verdict: Verdict,
                   marks: Mapping[Mark, MarkWant | None], form: MarkForm = "label"
                   ) -> NodeChange | None:
    """The merge patch that makes ``node`` say ``verdict`` and carry ``marks``; None when
    nothing must change.

    An unknown verdict leaves the swap labels and facts alone (:func:`swap_labels`,
    :func:`swap_annotations`). A mark wanted None is left as it is; else
    :func:`mark_change` decides it.
    """
    name = node_name(node)
    if not name:
        return None
    labels = swap_labels(node, verdict)  # merge patch: null deletes
    annotations = swap_annotations(node, verdict)
    summary: dict[str, Any] = {"swap": verdict.message} if labels else {}
    wanted = {mark: want for mark in MARKS if (want := marks.get(mark)) is not None}
    taint_keys: set[str] = set()
    for mark, want in wanted.items():
        change = mark_change(node, mark, want, form)
        labels.update(change.labels)
        annotations.update(change.annotations)
        summary.update(change.summary)
        if change.taint:
            taint_keys.add(mark.key)
    taints = _taint_body(node, {m.key for m in wanted}, taint_keys) if wanted else None
    return _node_change(node, name, labels, annotations, taints, summary)


def _node_change(node: Mapping[str, Any], name: str, labels: dict[str, str | None],
                 annotations: dict[str, str], taints: list[Any] | None,
                 summary: dict[str, Any]) -> NodeChange | None:
    """The decisions as one merge patch; None when none changes anything."""
    metadata: dict[str, Any] = {}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    if not metadata and taints is None:
        return None
    body: dict[str, Any] = {"metadata": metadata}
    if taints is not None:
        # A merge patch replaces the whole list: the resourceVersion makes the API server
        # refuse it (409) if the taints changed since this node was read; the agent then
        # reads the node again and decides anew.
        body["spec"] = {"taints": taints or None}
        version = as_mapping(node.get("metadata")).get("resourceVersion")
        if isinstance(version, str) and version:
            metadata["resourceVersion"] = version
    summary["keys"] = sorted([*labels, *annotations] + (["spec.taints"] if taints is not None
                                                         else []))
    return NodeChange(name, body, summary)

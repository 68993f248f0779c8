"""webhook/agent/decide.py: whether a node is a swap node and with what figures (``judge``),
and the merge patch of swapwise's own keys that makes the Node say so (``desired_change``).

Every patch here is applied (RFC 7386, :func:`tests.agent.support.merge_patch`) and decided
again: the second decision must be None, or the agent would write on every tick.
"""

from __future__ import annotations

import copy
import json
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.agent.support import GIB, merge_patch, node
from webhook.agent.decide import (
    Behavior,
    MarkWant,
    Verdict,
    backing_bytes,
    desired_change,
    judge,
)
from webhook.agent.kernel import SwapDevice, SwapFacts
from webhook.engine.backing import PERMILLE_LABEL
from webhook.engine.nodes import (
    BEHAVIOR_LABEL,
    FACTS_ANNOTATION,
    KIND_LABEL,
    SWAP_NODE_ANNOTATION,
    SWAP_NODE_LABEL,
    NodeFacts,
)
from webhook.engine.pressure import CPU_MARK, MARKS, MEMORY_MARK, Mark, MarkForm

MARK_KEYS = {m.key for m in MARKS}
LIMITED = Behavior("LimitedSwap", "kubelet")
DECLARED_LIMITED = Behavior("LimitedSwap", "declared")
NO_MARKS: dict[Mark, MarkWant | None] = {MEMORY_MARK: None, CPU_MARK: None}


def disk(size: int = 2 * GIB, path: str = "/swapfile") -> SwapDevice:
    return SwapDevice(path, "disk", size, 0)


def zram(size: int = 4 * GIB, path: str = "/dev/zram0") -> SwapDevice:
    return SwapDevice(path, "zram", size, 0)


def swap(*devices: SwapDevice, zswap: bool = False) -> SwapFacts:
    return SwapFacts(tuple(devices), zswap)


def settle(obj: dict[str, Any], verdict: Verdict, marks: dict[Mark, MarkWant | None],
           form: MarkForm = "label") -> dict[str, Any]:
    """Apply the change for ``verdict`` and ``marks``, as the API server would; the Node."""
    change = desired_change(obj, verdict, marks, form)
    assert change is not None
    return dict(merge_patch(obj, change.patch))


# -- judge


def test_no_swap_device_is_not_a_swap_node_whatever_the_behavior() -> None:
    for behavior in (LIMITED, DECLARED_LIMITED, Behavior(None, "kubelet", "HTTP 403")):
        verdict = judge(node(), swap(), behavior)
        assert verdict.swap is False
        assert verdict.message == "false: no swap device (/proc/swaps)"
        assert verdict.facts is not None
        assert (verdict.facts.permille, verdict.facts.swap_bytes) == (None, 0)


def test_undeclared_behavior_is_not_a_swap_node() -> None:
    verdict = judge(node(), swap(disk()), Behavior(None, "declared"))
    assert verdict.swap is False
    assert verdict.message.startswith(f"false: swap {2 * GIB} bytes but swapBehavior undeclared")
    assert f"{BEHAVIOR_LABEL}=LimitedSwap" in verdict.message
    assert verdict.facts is not None and verdict.facts.permille is None


@pytest.mark.parametrize("problem,shown", [("HTTP 403: forbidden", "HTTP 403: forbidden"),
                                           ("", "not read")])
def test_kubelet_unreadable_is_unknown_and_carries_no_facts(problem: str, shown: str) -> None:
    verdict = judge(node(), swap(disk()), Behavior(None, "kubelet", problem))
    assert verdict == Verdict(None, f"unknown: kubelet configz not readable: {shown}")


def test_limited_swap_on_disk() -> None:
    verdict = judge(node(memory="8Gi"), swap(disk(2 * GIB)), LIMITED)
    assert verdict.swap is True
    assert verdict.message == (
        "true: kubelet swapBehavior LimitedSwap (source: kubelet configz); swap "
        f"{2 * GIB} bytes (disk), backing {2 * GIB} bytes, memory capacity {8 * GIB} bytes: "
        f"{PERMILLE_LABEL}=250")
    assert verdict.facts == NodeFacts(
        permille=250, swap_bytes=2 * GIB, disk_bytes=2 * GIB, zram_bytes=0,
        backing_bytes=2 * GIB, memory_bytes=8 * GIB, swap_behavior="LimitedSwap",
        behavior_source="kubelet", zswap=False, declared_permille=None)


def test_declared_limited_swap_says_its_source() -> None:
    verdict = judge(node(), swap(disk()), DECLARED_LIMITED)
    assert verdict.message.startswith(
        f"true: declared swapBehavior LimitedSwap (source: node label {BEHAVIOR_LABEL})")


def test_per_mille_rounds_down() -> None:
    verdict = judge(node(memory="3Gi"), swap(disk(GIB)), LIMITED)
    assert verdict.facts is not None and verdict.facts.permille == 333


def test_zram_only_is_a_swap_node_backing_nothing() -> None:
    verdict = judge(node(), swap(zram(4 * GIB)), LIMITED)
    assert verdict.swap is True
    assert verdict.facts is not None
    assert (verdict.facts.permille, verdict.facts.zram_bytes, verdict.facts.backing_bytes) == (
        0, 4 * GIB, 0)
    assert "(zram), backing 0 bytes" in verdict.message


def test_mixed_counts_disk_in_full_and_zram_as_configured() -> None:
    facts = swap(disk(GIB), zram(4 * GIB), zswap=True)
    plain = judge(node(memory="8Gi"), facts, LIMITED)
    assert plain.facts is not None
    assert (plain.facts.permille, plain.facts.backing_bytes) == (125, GIB)
    assert plain.facts.zswap is True
    assert "(mixed)" in plain.message
    half = judge(node(memory="8Gi"), facts, LIMITED, Fraction(1, 2))
    assert half.facts is not None
    assert (half.facts.permille, half.facts.backing_bytes) == (375, 3 * GIB)
    whole = judge(node(memory="8Gi"), facts, LIMITED, Fraction(1))
    assert whole.facts is not None and whole.facts.permille == 625


def test_zram_backing_fraction_rounds_down_to_a_byte() -> None:
    assert backing_bytes(swap(zram(3)), Fraction(1, 2)) == 1
    assert backing_bytes(swap(zram(3), disk(10)), Fraction(2, 3)) == 12
    assert backing_bytes(swap(zram(3)), Fraction(0)) == 0


@pytest.mark.parametrize("behavior,message", [
    (Behavior("NoSwap", "kubelet"),
     "false: kubelet swapBehavior NoSwap (source: kubelet configz)"),
    (Behavior("NoSwap", "declared"),
     f"false: declared swapBehavior NoSwap (source: node label {BEHAVIOR_LABEL})"),
    (Behavior("", "kubelet"),
     "false: kubelet swapBehavior unset, the default NoSwap (source: kubelet configz)"),
    (Behavior("UnlimitedSwap", "kubelet"),
     "false: kubelet swapBehavior 'UnlimitedSwap' is neither LimitedSwap nor NoSwap "
     "(source: kubelet configz)"),
    (Behavior("", "declared"),
     "false: declared swapBehavior '' is neither LimitedSwap nor NoSwap "
     f"(source: node label {BEHAVIOR_LABEL})"),
    (Behavior("limitedswap", "declared"),
     "false: declared swapBehavior 'limitedswap' is neither LimitedSwap nor NoSwap "
     f"(source: node label {BEHAVIOR_LABEL})"),
])
def test_not_limited_swap(behavior: Behavior, message: str) -> None:
    verdict = judge(node(), swap(disk()), behavior)
    assert verdict.swap is False
    assert verdict.message == message
    assert verdict.facts is not None
    assert verdict.facts.permille is None
    assert verdict.facts.swap_behavior == behavior.value


def test_an_unknown_value_is_quoted_short_and_escaped() -> None:
    long = judge(node(), swap(disk()), Behavior("x" * 500, "kubelet"))
    assert "'" + "x" * 63 + "...'" in long.message
    assert len(long.message) < 200
    escape = judge(node(), swap(disk()), Behavior("Limited\x1b[2J\nSwap", "declared"))
    assert "\x1b" not in escape.message and "\n" not in escape.message
    assert "'Limited\\x1b[2J\\nSwap'" in escape.message


@pytest.mark.parametrize("memory,problem", [
    (None, "no memory capacity reported (status.capacity.memory)"),
    ("lots", "memory capacity (status.capacity.memory) unreadable"),
    ("0", "memory capacity (status.capacity.memory) '0' is not positive"),
])
def test_memory_capacity_unknown_gives_a_swap_node_without_per_mille(
        memory: str | None, problem: str) -> None:
    obj = node(memory=memory, labels={PERMILLE_LABEL: "250"})
    verdict = judge(obj, swap(disk()), LIMITED)
    assert verdict.swap is True
    assert f"; no {PERMILLE_LABEL}: {problem}" in verdict.message
    assert verdict.facts is not None
    assert (verdict.facts.permille, verdict.facts.memory_bytes) == (None, None)
    patched = settle(obj, verdict, NO_MARKS)
    assert PERMILLE_LABEL not in patched["metadata"]["labels"]
    assert patched["metadata"]["labels"][SWAP_NODE_LABEL] == "true"


def test_a_declared_per_mille_is_recorded_once_and_kept() -> None:
    """A node pool declared 500; the agent measures 250: it replaces the label and keeps
    what was declared in the facts, for ``audit``, on every later decision."""
    obj = node(labels={PERMILLE_LABEL: "500"})
    verdict = judge(obj, swap(disk(2 * GIB)), LIMITED)
    assert verdict.facts is not None and verdict.facts.declared_permille == 500
    obj = settle(obj, verdict, NO_MARKS)
    assert obj["metadata"]["labels"][PERMILLE_LABEL] == "250"
    assert json.loads(obj["metadata"]["annotations"][FACTS_ANNOTATION])["declaredPermille"] == 500
    # the swap grows: the figures move, the declared value stays
    verdict = judge(obj, swap(disk(4 * GIB)), LIMITED)
    assert verdict.facts is not None
    assert (verdict.facts.permille, verdict.facts.declared_permille) == (500, 500)
    obj = settle(obj, verdict, NO_MARKS)
    # someone writes the label again: the facts still say what was first declared
    obj["metadata"]["labels"][PERMILLE_LABEL] = "900"
    verdict = judge(obj, swap(disk(4 * GIB)), LIMITED)
    assert verdict.facts is not None and verdict.facts.declared_permille == 500


@pytest.mark.parametrize("label", ["250", None, "abc", "99999999999999999999999"])
def test_no_declared_per_mille_when_none_or_equal_or_unreadable(label: str | None) -> None:
    obj = node(labels={PERMILLE_LABEL: label} if label is not None else {})
    verdict = judge(obj, swap(disk(2 * GIB)), LIMITED)
    assert verdict.facts is not None and verdict.facts.declared_permille is None
    assert "declaredPermille" not in verdict.facts.to_json()


def test_facts_written_by_the_agent_are_not_mistaken_for_a_declaration() -> None:
    obj = settle(node(), judge(node(), swap(disk(2 * GIB)), LIMITED), NO_MARKS)
    verdict = judge(obj, swap(disk(GIB)), LIMITED)  # the agent's own "250" label is not
    assert verdict.facts is not None and verdict.facts.declared_permille is None


# -- desired_change: the swap keys


def test_a_new_swap_node_gets_its_labels_and_annotations() -> None:
    obj = node(labels={"kubernetes.io/hostname": "node-a"})
    verdict = judge(obj, swap(disk(2 * GIB)), LIMITED)
    change = desired_change(obj, verdict, NO_MARKS)
    assert change is not None
    assert change.node == "node-a"
    assert change.patch == {"metadata": {
        "labels": {SWAP_NODE_LABEL: "true", PERMILLE_LABEL: "250", KIND_LABEL: "disk"},
        "annotations": {SWAP_NODE_ANNOTATION: verdict.message,
                        FACTS_ANNOTATION: verdict.facts.to_json() if verdict.facts else ""}}}
    assert change.summary["swap"] == verdict.message
    assert change.summary["keys"] == sorted([SWAP_NODE_LABEL, PERMILLE_LABEL, KIND_LABEL,
                                             SWAP_NODE_ANNOTATION, FACTS_ANNOTATION])
    settled = settle(obj, verdict, NO_MARKS)
    assert desired_change(settled, judge(settled, swap(disk(2 * GIB)), LIMITED), NO_MARKS) is None


def test_a_node_that_stops_being_a_swap_node_loses_the_labels_keeps_its_kind() -> None:
    obj = settle(node(), judge(node(), swap(disk()), LIMITED), NO_MARKS)
    verdict = judge(obj, swap(disk()), Behavior("NoSwap", "kubelet"))
    change = desired_change(obj, verdict, NO_MARKS)
    assert change is not None
    assert change.patch["metadata"]["labels"] == {SWAP_NODE_LABEL: None, PERMILLE_LABEL: None}
    assert change.patch["metadata"]["annotations"][SWAP_NODE_ANNOTATION] == verdict.message
    settled = dict(merge_patch(obj, change.patch))
    assert settled["metadata"]["labels"] == {KIND_LABEL: "disk"}


@pytest.mark.parametrize("devices,kind", [((disk(),), "disk"), ((zram(),), "zram"),
                                          ((disk(), zram()), "mixed"), ((), None)])
def test_the_kind_label(devices: tuple[SwapDevice, ...], kind: str | None) -> None:
    obj = node(labels={KIND_LABEL: "stale"})
    settled = settle(obj, judge(obj, swap(*devices), LIMITED), NO_MARKS)
    assert settled["metadata"]["labels"].get(KIND_LABEL) == kind


def test_an_unknown_verdict_leaves_the_swap_keys_alone() -> None:
    obj = settle(node(), judge(node(), swap(disk()), LIMITED), NO_MARKS)
    verdict = judge(obj, swap(), Behavior(None, "kubelet", "down"))  # no swap, kubelet down
    assert verdict.swap is False  # no swap is known without the kubelet
    unknown = judge(obj, swap(disk(8 * GIB)), Behavior(None, "kubelet", "down"))
    assert unknown.swap is None
    assert desired_change(obj, unknown, NO_MARKS) is None
    marked = desired_change(obj, unknown, {MEMORY_MARK: MarkWant(True, "m"), CPU_MARK: None})
    assert marked is not None
    assert marked.patch == {"metadata": {"labels": {MEMORY_MARK.key: "true"},
                                         "annotations": {MEMORY_MARK.key: "m"}}}


def test_a_node_without_a_name_gets_nothing() -> None:
    obj = node()
    del obj["metadata"]["name"]
    assert desired_change(obj, judge(obj, swap(disk()), LIMITED), NO_MARKS) is None


# -- desired_change: the marks


FOREIGN_TAINT = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}


def test_a_mark_as_a_label_with_its_annotation_once() -> None:
    obj = node(taints=[FOREIGN_TAINT])
    wants: dict[Mark, MarkWant | None] = {MEMORY_MARK: MarkWant(True, "marked: 70 %"),
                                          CPU_MARK: MarkWant(False, "cleared: cpu calm")}
    change = desired_change(obj, Verdict(None, ""), wants)
    assert change is not None
    assert change.patch == {"metadata": {"labels": {MEMORY_MARK.key: "true"},
                                         "annotations": {MEMORY_MARK.key: "marked: 70 %"}}}
    assert change.summary == {"memory": "marked", "keys": [MEMORY_MARK.key, MEMORY_MARK.key]}
    settled = dict(merge_patch(obj, change.patch))
    # still marked, with new figures: no write (the annotation says why it was marked)
    wants[MEMORY_MARK] = MarkWant(True, "marked: 95 %")
    assert desired_change(settled, Verdict(None, ""), wants) is None
    wants[MEMORY_MARK] = MarkWant(False, "cleared: calm")
    change = desired_change(settled, Verdict(None, ""), wants)
    assert change is not None
    assert change.patch == {"metadata": {"labels": {MEMORY_MARK.key: None},
                                         "annotations": {MEMORY_MARK.key: "cleared: calm"}}}
    cleared = dict(merge_patch(settled, change.patch))
    assert cleared["spec"]["taints"] == [FOREIGN_TAINT]
    assert cleared["metadata"]["annotations"][MEMORY_MARK.key] == "cleared: calm"
    assert desired_change(cleared, Verdict(None, ""), wants) is None


def test_a_mark_as_a_taint_keeps_foreign_taints_and_sends_the_resource_version() -> None:
    other = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    obj = node(taints=[FOREIGN_TAINT, other], version="77")
    wants: dict[Mark, MarkWant | None] = {MEMORY_MARK: MarkWant(False, "calm"),
                                          CPU_MARK: MarkWant(True, "marked: cpu 90 %")}
    change = desired_change(obj, Verdict(None, ""), wants, "taint")
    assert change is not None
    assert change.patch == {
        "metadata": {"annotations": {CPU_MARK.key: "marked: cpu 90 %"},
                     "resourceVersion": "77"},
        "spec": {"taints": [FOREIGN_TAINT, other, CPU_MARK.taint]}}
    assert "spec.taints" in change.summary["keys"]
    settled = dict(merge_patch(obj, change.patch))
    assert desired_change(settled, Verdict(None, ""), wants, "taint") is None
    wants[CPU_MARK] = MarkWant(False, "cleared")
    change = desired_change(settled, Verdict(None, ""), wants, "taint")
    assert change is not None
    assert change.patch["spec"] == {"taints": [FOREIGN_TAINT, other]}
    assert change.patch["metadata"]["resourceVersion"] == "77"


def test_the_last_taint_going_deletes_the_list() -> None:
    obj = node(taints=[MEMORY_MARK.taint])
    change = desired_change(obj, Verdict(None, ""), {MEMORY_MARK: MarkWant(False, "c"),
                                                     CPU_MARK: None}, "taint")
    assert change is not None
    assert change.patch["spec"] == {"taints": None}
    assert "taints" not in merge_patch(obj, change.patch)["spec"]


def test_switching_form_moves_the_mark_without_a_new_annotation() -> None:
    wants: dict[Mark, MarkWant | None] = {MEMORY_MARK: MarkWant(True, "m"), CPU_MARK: None}
    labelled = node(labels={MEMORY_MARK.key: "true"}, annotations={MEMORY_MARK.key: "old"})
    change = desired_change(labelled, Verdict(None, ""), wants, "taint")
    assert change is not None
    assert change.patch == {"metadata": {"labels": {MEMORY_MARK.key: None},
                                         "resourceVersion": "1"},
                            "spec": {"taints": [MEMORY_MARK.taint]}}
    tainted = dict(merge_patch(labelled, change.patch))
    change = desired_change(tainted, Verdict(None, ""), wants, "label")
    assert change is not None
    assert change.patch == {"metadata": {"labels": {MEMORY_MARK.key: "true"},
                                         "resourceVersion": "1"},
                            "spec": {"taints": None}}


def test_a_mark_with_another_value_is_rewritten() -> None:
    obj = node(labels={MEMORY_MARK.key: "yes"},
               taints=[{"key": CPU_MARK.key, "value": "1", "effect": "NoExecute"}])
    wants: dict[Mark, MarkWant | None] = {MEMORY_MARK: MarkWant(True, "m"),
                                          CPU_MARK: MarkWant(True, "c")}
    label = desired_change(obj, Verdict(None, ""), wants, "label")
    assert label is not None
    assert label.patch["metadata"]["labels"] == {MEMORY_MARK.key: "true", CPU_MARK.key: "true"}
    assert label.patch["spec"] == {"taints": None}
    # the CPU mark was carried (another form, another value): no new annotation for it
    assert set(label.patch["metadata"].get("annotations", {})) == set()
    taint = desired_change(obj, Verdict(None, ""), wants, "taint")
    assert taint is not None
    assert taint.patch["spec"] == {"taints": [MEMORY_MARK.taint, CPU_MARK.taint]}


def test_a_mark_wanted_none_is_left_in_either_form() -> None:
    odd_taint = {"key": CPU_MARK.key, "value": "true", "effect": "NoExecute"}
    obj = node(labels={MEMORY_MARK.key: "true"}, taints=[odd_taint, FOREIGN_TAINT])
    assert desired_change(obj, Verdict(None, ""), NO_MARKS, "taint") is None
    # the memory mark is managed (cleared); the CPU taint, wanted None, stays as it is
    change = desired_change(obj, Verdict(None, ""), {MEMORY_MARK: MarkWant(False, "c"),
                                                     CPU_MARK: None}, "taint")
    assert change is not None
    settled = dict(merge_patch(obj, change.patch))
    assert MEMORY_MARK.key not in settled["metadata"]["labels"]
    assert settled["spec"]["taints"] == [odd_taint, FOREIGN_TAINT]


def test_no_resource_version_without_a_taint_change() -> None:
    obj = node(taints=[FOREIGN_TAINT], version="5")
    change = desired_change(obj, judge(obj, swap(disk()), LIMITED),
                            {MEMORY_MARK: MarkWant(True, "m"), CPU_MARK: MarkWant(False, "c")})
    assert change is not None
    assert "resourceVersion" not in change.patch["metadata"]
    assert "spec" not in change.patch


# -- desired_change: properties over random nodes


FOREIGN_LABEL_KEYS = ["kubernetes.io/hostname", "topology.kubernetes.io/zone",
                      "feature.node.kubernetes.io/memory-swap", "node-role.kubernetes.io/worker",
                      "swapwise.iox/lookalike", "example.com/swapwise.io"]
OUR_KEYS = [SWAP_NODE_LABEL, PERMILLE_LABEL, KIND_LABEL, BEHAVIOR_LABEL, FACTS_ANNOTATION,
            *MARK_KEYS]
TEXT = st.sampled_from(["true", "false", "", "250", "yes", "LimitedSwap", "{}", "x" * 70])
TAINT = st.fixed_dictionaries(
    {"key": st.sampled_from(["dedicated", "node.kubernetes.io/unschedulable",
                             "swapwise.io/other", *MARK_KEYS]),
     "effect": st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"])},
    optional={"value": st.sampled_from(["true", "false", "", "gpu"])})


@st.composite
def nodes(draw: st.DrawFn) -> dict[str, Any]:
    labels = draw(st.dictionaries(st.sampled_from(FOREIGN_LABEL_KEYS + OUR_KEYS), TEXT))
    annotations = draw(st.dictionaries(st.sampled_from(FOREIGN_LABEL_KEYS + OUR_KEYS), TEXT))
    taints = draw(st.none() | st.lists(TAINT, max_size=6,
                                       unique_by=lambda t: (t["key"], t["effect"])))
    memory = draw(st.sampled_from([None, "8Gi", "1Gi", "16G", "0", "junk"]))
    obj = node(labels=labels, annotations=annotations, taints=taints, memory=memory,
               version=str(draw(st.integers(1, 10**6))))
    if draw(st.booleans()):
        # some other writer's shape: labels null, annotations not a map
        obj["metadata"][draw(st.sampled_from(["labels", "annotations"]))] = None
    return obj


DEVICES = st.lists(st.builds(SwapDevice, st.sampled_from(["/swapfile", "/dev/zram0", "/dev/sdb"]),
                             st.sampled_from(["disk", "zram"]), st.integers(0, 64 * GIB),
                             st.just(0)), max_size=3)
BEHAVIORS = st.builds(Behavior, st.sampled_from([None, "", "LimitedSwap", "NoSwap", "Other"]),
                      st.sampled_from(["declared", "kubelet"]), st.sampled_from(["", "down"]))
WANTS = st.none() | st.builds(MarkWant, st.booleans(), st.sampled_from(["a", "b"]))


def foreign_taints(obj: dict[str, Any]) -> list[Any]:
    taints = (obj.get("spec") or {}).get("taints") or []
    return [t for t in taints if t.get("key") not in MARK_KEYS]


def mark_taints(obj: dict[str, Any], key: str) -> list[Any]:
    taints = (obj.get("spec") or {}).get("taints") or []
    return sorted((t for t in taints if t.get("key") == key), key=json.dumps)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes(), DEVICES, BEHAVIORS, st.sampled_from([Fraction(0), Fraction(1, 2)]),
       WANTS, WANTS, st.sampled_from(["label", "taint"]), st.booleans())
def test_patches_touch_only_swapwise_keys_and_settle(
        obj: dict[str, Any], devices: list[SwapDevice], behavior: Behavior,
        zram_backing: Fraction, memory_want: MarkWant | None, cpu_want: MarkWant | None,
        form: MarkForm, unknown: bool) -> None:
    facts = SwapFacts(tuple(devices))
    verdict = Verdict(None, "unknown") if unknown else judge(obj, facts, behavior, zram_backing)
    wants: dict[Mark, MarkWant | None] = {MEMORY_MARK: memory_want, CPU_MARK: cpu_want}
    before = copy.deepcopy(obj)
    change = desired_change(obj, verdict, wants, form)
    assert obj == before  # the node read is not modified
    if change is None:
        return
    patch = change.patch
    assert set(patch) <= {"metadata", "spec"}
    metadata = patch["metadata"]
    assert set(metadata) <= {"labels", "annotations", "resourceVersion"}
    for section in ("labels", "annotations"):
        assert all(key.startswith("swapwise.io/") for key in metadata.get(section, {}))
    assert BEHAVIOR_LABEL not in metadata.get("labels", {})  # the admin's declaration
    if "spec" in patch:
        assert set(patch["spec"]) == {"taints"}
        assert metadata["resourceVersion"] == obj["metadata"]["resourceVersion"]
        new_taints = patch["spec"]["taints"] or []
        assert [t for t in new_taints if t.get("key") not in MARK_KEYS] == foreign_taints(obj)
    else:
        assert "resourceVersion" not in metadata
    settled = merge_patch(obj, patch)
    for mark, want in wants.items():
        if want is None:  # left as it is, in either form
            assert (settled["metadata"].get("labels") or {}).get(mark.key) == \
                (obj["metadata"].get("labels") or {}).get(mark.key)
            assert mark_taints(settled, mark.key) == mark_taints(obj, mark.key)
        else:
            assert bool(mark.forms(settled)) == want.marked
            assert mark.forms(settled) <= ({form} if want.marked else set())
    again = Verdict(None, "unknown") if unknown else judge(settled, facts, behavior,
                                                           zram_backing)
    assert desired_change(settled, again, wants, form) is None

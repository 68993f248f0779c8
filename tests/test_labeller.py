"""The labeller's logic without a cluster: swap-node verdicts, lease rules, the reconcile loop.

The API server is replaced by in-memory fakes that keep its contract (resourceVersion
preconditions, 409 on a stale write, merge-patch semantics for labels and annotations,
a node proxy that can fail), and time by a fake clock, so election timing and kubelet
read backoff are exact rather than slept.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest
from lightkube import AsyncClient, KubeConfig
from prometheus_client import generate_latest
from starlette.testclient import TestClient

from webhook.cli import main
from webhook.labeller.controller import Labeller, error_text
from webhook.labeller.health import create_app
from webhook.labeller.kube import KubeletConfigError, KubeNodes
from webhook.labeller.kubelet import KubeletConfigCache
from webhook.labeller.labels import (
    BEHAVIOR_LABEL,
    DEFAULT_LABEL,
    SWAP_NODE_ANNOTATION,
    ConfigzError,
    Label,
    LabelError,
    NodeChange,
    Reason,
    Source,
    configz_swap_behavior,
    declared_behavior,
    desired_change,
    judge,
    memory_capacity,
    swap_capacity,
    swap_permille,
)
from webhook.labeller.lease import (
    Attempt,
    Conflict,
    Elector,
    LeaseRecord,
    Observation,
    Timing,
    claim,
    micro_now,
    released,
)
from webhook.labeller.metrics import LabellerMetrics

SWAP = "feature.node.kubernetes.io/memory-swap"
PERMILLE = "swapwise.io/swap-permille"
T0 = dt.datetime(2026, 1, 1, 12, 0, 0, 1, tzinfo=dt.UTC)


GI4 = 4294963200  # a swap capacity as a kubelet reports it (not a round number)
KUBELET_SWAP = {"kubeletconfig": {"memorySwap": {"swapBehavior": "LimitedSwap"}}}
KUBELET_NOSWAP = {"kubeletconfig": {"memorySwap": {"swapBehavior": "NoSwap"}}}


def node(name: str, capacity: Any = None, labels: dict[str, str] | None = None,
         info: bool = True, declared: str | None = None,
         annotations: dict[str, str] | None = None, boot: str = "b1",
         memory: Any = "16Gi") -> dict[str, Any]:
    """A Node dict; ``declared`` sets the swapwise.io/swap-behavior label; ``memory`` is
    ``status.capacity.memory`` (None: not reported)."""
    status: dict[str, Any] = {}
    if memory is not None:
        status["capacity"] = {"cpu": "8", "memory": memory}
    if info:
        status["nodeInfo"] = {"kubeletVersion": "v1.34.4", "bootID": boot}
        if capacity is not None:
            status["nodeInfo"]["swap"] = {"capacity": capacity}
    all_labels = dict(labels or {})
    if declared is not None:
        all_labels[BEHAVIOR_LABEL] = declared
    metadata: dict[str, Any] = {"name": name, "labels": all_labels}
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    return {"metadata": metadata, "status": status}


def change(n: dict[str, Any], label: Label = DEFAULT_LABEL, source: Source = "declared",
           behavior: str | None = None) -> NodeChange | None:
    """The change a node needs; ``declared`` reads its label, ``kubelet`` uses ``behavior``."""
    known = declared_behavior(n) if source == "declared" else behavior
    return desired_change(n, judge(n, known, source, "HTTP 502"), label)


# ------------------------------------------------------------------------------ labels


def test_label_parse_accepts_prefixed_keys_and_empty_values() -> None:
    assert Label.parse(f"{SWAP}=true") == DEFAULT_LABEL
    assert Label.parse("swap=") == Label("swap", "")
    assert str(Label.parse("example.com/has-swap=yes")) == "example.com/has-swap=yes"


@pytest.mark.parametrize("text", [
    "no-equals", "=true", "Bad_Prefix.com/x=1", "/x=1", "x=-bad", "x=" + "v" * 64,
    "k" * 64 + "=1", "x=has space", "x=true\n", "x\n=true", "a.b\n/x=1",
])
def test_label_parse_refuses_what_the_api_server_would(text: str) -> None:
    with pytest.raises(LabelError):
        Label.parse(text)


@pytest.mark.parametrize(("value", "expected"), [
    (34359738368, 34359738368), (0, 0), (None, 0), ("1Gi", 0), (True, 0), (-5, 0),
])
def test_swap_capacity_reads_only_a_positive_integer(value: Any, expected: int) -> None:
    assert swap_capacity(node("n", value)) == expected


def test_swap_capacity_of_a_node_without_status_is_zero() -> None:
    assert swap_capacity({"metadata": {"name": "n"}}) == 0
    assert swap_capacity(node("n", info=False)) == 0


DECLARED_SOURCE = "(source: node label swapwise.io/swap-behavior)"


@pytest.mark.parametrize(("capacity", "source", "behavior", "swap", "reason", "message"), [
    # 1000 * 4294963200 / 17179869184 (16Gi) = 249.9997: the per-mille is floored.
    (GI4, "kubelet", "LimitedSwap", True, Reason.LIMITED_SWAP,
     "true: kubelet swapBehavior LimitedSwap, swap capacity 4294963200 bytes, memory "
     "capacity 17179869184 bytes: swapwise.io/swap-permille=249 (source: kubelet configz)"),
    (GI4, "declared", "LimitedSwap", True, Reason.LIMITED_SWAP,
     f"true: declared swapBehavior LimitedSwap, swap capacity 4294963200 bytes, memory "
     f"capacity 17179869184 bytes: swapwise.io/swap-permille=249 {DECLARED_SOURCE}"),
    (GI4, "kubelet", "NoSwap", False, Reason.SWAP_BEHAVIOR_NO_SWAP,
     "false: kubelet swapBehavior NoSwap (source: kubelet configz)"),
    (GI4, "kubelet", "", False, Reason.SWAP_BEHAVIOR_NO_SWAP,
     "false: kubelet swapBehavior unset, the default NoSwap (source: kubelet configz)"),
    (GI4, "declared", "NoSwap", False, Reason.SWAP_BEHAVIOR_NO_SWAP,
     f"false: declared swapBehavior NoSwap {DECLARED_SOURCE}"),
    (GI4, "declared", None, False, Reason.SWAP_BEHAVIOR_UNDECLARED,
     "false: swap capacity 4294963200 bytes but swapBehavior undeclared (set node label "
     "swapwise.io/swap-behavior=LimitedSwap where the kubelet runs it)"),
    (GI4, "declared", "limitedswap", False, Reason.SWAP_BEHAVIOR_UNKNOWN,
     f"false: declared swapBehavior 'limitedswap' is neither LimitedSwap nor NoSwap "
     f"{DECLARED_SOURCE}"),
    (GI4, "declared", "", False, Reason.SWAP_BEHAVIOR_UNKNOWN,
     f"false: declared swapBehavior '' is neither LimitedSwap nor NoSwap {DECLARED_SOURCE}"),
    (GI4, "kubelet", "UnlimitedSwap", False, Reason.SWAP_BEHAVIOR_UNKNOWN,
     "false: kubelet swapBehavior 'UnlimitedSwap' is neither LimitedSwap nor NoSwap "
     "(source: kubelet configz)"),
    (GI4, "kubelet", None, None, Reason.KUBELET_CONFIG_UNAVAILABLE,
     "unknown: kubelet configz not readable: HTTP 502"),
    # Capacity first: a node without swap is never a swap node, whatever its kubelet says.
    (0, "kubelet", "LimitedSwap", False, Reason.NO_SWAP_CAPACITY,
     "false: no swap capacity reported (status.nodeInfo.swap.capacity)"),
    (None, "kubelet", None, False, Reason.NO_SWAP_CAPACITY,
     "false: no swap capacity reported (status.nodeInfo.swap.capacity)"),
    (None, "declared", "LimitedSwap", False, Reason.NO_SWAP_CAPACITY,
     "false: no swap capacity reported (status.nodeInfo.swap.capacity)"),
])
def test_every_reason_and_its_message(capacity: int | None, source: Source,
                                      behavior: str | None, swap: bool | None,
                                      reason: Reason, message: str) -> None:
    verdict = judge(node("n", capacity), behavior, source, "HTTP 502")
    assert (verdict.swap, verdict.reason, verdict.message) == (swap, reason, message)
    # Only a swap node has a per-mille; 16Gi of memory is read exactly.
    assert verdict.permille_value == (249 if swap else None)


def test_a_huge_foreign_behaviour_is_cut_short_in_the_message() -> None:
    verdict = judge(node("n", GI4), "L" * 1_000_000, "kubelet")
    assert verdict.reason is Reason.SWAP_BEHAVIOR_UNKNOWN
    assert verdict.message.startswith("false: kubelet swapBehavior 'LLLL")
    assert len(verdict.message) < 200


def test_declared_behavior_reads_only_a_string_label() -> None:
    assert declared_behavior(node("n", declared="LimitedSwap")) == "LimitedSwap"
    assert declared_behavior(node("n")) is None
    assert declared_behavior({"metadata": {"labels": {BEHAVIOR_LABEL: 1}}}) is None
    assert declared_behavior({"metadata": {"labels": None}}) is None


@pytest.mark.parametrize(("payload", "expected"), [
    (KUBELET_SWAP, "LimitedSwap"),
    (KUBELET_NOSWAP, "NoSwap"),
    ({"kubeletconfig": {"memorySwap": {"swapBehavior": ""}}}, ""),
    ({"kubeletconfig": {"memorySwap": {}}}, ""),
    ({"kubeletconfig": {"memorySwap": None}}, ""),
    ({"kubeletconfig": {"memorySwap": {"swapBehavior": None}}}, ""),
    ({"kubeletconfig": {"failSwapOn": False}}, ""),
    ({"kubeletconfig": {"memorySwap": {"swapBehavior": "x" * 100_000}}}, "x" * 100_000),
])
def test_configz_swap_behavior_reads_what_the_kubelet_writes(payload: Any, expected: str) -> None:
    assert configz_swap_behavior(payload) == expected


@pytest.mark.parametrize("payload", [
    None, [], "LimitedSwap", 1, True, [KUBELET_SWAP], {},
    {"kubeletConfig": {"memorySwap": {"swapBehavior": "LimitedSwap"}}},  # wrong case
    {"kubeletconfig": None}, {"kubeletconfig": []}, {"kubeletconfig": "LimitedSwap"},
    {"kubeletconfig": {"memorySwap": "LimitedSwap"}},
    {"kubeletconfig": {"memorySwap": ["LimitedSwap"]}},
    {"kubeletconfig": {"memorySwap": {"swapBehavior": 1}}},
    {"kubeletconfig": {"memorySwap": {"swapBehavior": True}}},
    {"kubeletconfig": {"memorySwap": {"swapBehavior": ["LimitedSwap"]}}},
    {"kubeletconfig": {"memorySwap": {"swapBehavior": {"mode": "LimitedSwap"}}}},
    {"kubeletconfig": {"memorySwap": {"swapBehavior": 10**400}}},
])
def test_configz_of_another_shape_is_an_error_not_noswap(payload: Any) -> None:
    # Reading an unknown shape as NoSwap would strip labels on a proxy or version hiccup.
    with pytest.raises(ConfigzError):
        configz_swap_behavior(payload)


def test_swap_node_gets_label_and_annotation_in_one_patch_and_nothing_else() -> None:
    got = change(node("a", 8 * 2**30, {"team": "x"}, declared="LimitedSwap"))
    assert got is not None and (got.label, got.permille) == ("add", "set")
    # 8Gi of swap on 16Gi of memory: 500 per mille.
    assert got.patch == {"metadata": {
        "labels": {SWAP: "true", PERMILLE: "500"},
        "annotations": {SWAP_NODE_ANNOTATION: got.verdict.message},
    }}
    assert got.verdict.message == (
        "true: declared swapBehavior LimitedSwap, swap capacity 8589934592 bytes, memory "
        "capacity 17179869184 bytes: swapwise.io/swap-permille=500 "
        "(source: node label swapwise.io/swap-behavior)")


def test_swap_node_with_wrong_value_is_corrected() -> None:
    got = change(node("a", 1, {SWAP: "false", PERMILLE: "7"}, declared="LimitedSwap"))
    assert got is not None and got.label == "add"
    # 1 byte of swap: floor(1000 / 16Gi) = 0, which is written (it backs no pod).
    assert got.patch["metadata"]["labels"] == {SWAP: "true", PERMILLE: "0"}


def test_a_node_with_the_right_label_and_annotation_needs_nothing() -> None:
    first = change(node("a", 1, {SWAP: "true", PERMILLE: "0"}, declared="LimitedSwap"))
    assert first is not None and (first.label, first.permille) == ("keep", "keep")
    assert first.patch == {"metadata": {"annotations": {  # only the annotation is missing
        SWAP_NODE_ANNOTATION: first.verdict.message}}}
    done = node("a", 1, {SWAP: "true", PERMILLE: "0"}, declared="LimitedSwap",
                annotations={SWAP_NODE_ANNOTATION: first.verdict.message})
    assert change(done) is None


def test_a_stale_annotation_alone_is_rewritten() -> None:
    n = node("a", 1, {SWAP: "true", PERMILLE: "0"}, declared="LimitedSwap",
             annotations={SWAP_NODE_ANNOTATION: "false: old news", "other": "kept"})
    got = change(n)
    assert got is not None and got.label == "keep"
    assert list(got.patch["metadata"]) == ["annotations"]
    assert list(got.patch["metadata"]["annotations"]) == [SWAP_NODE_ANNOTATION]


@pytest.mark.parametrize(("capacity", "declared"), [
    (0, "LimitedSwap"), (None, "LimitedSwap"), (GI4, None), (GI4, "NoSwap"), (GI4, "bogus"),
])
def test_a_labelled_node_that_is_not_a_swap_node_loses_the_label(
    capacity: int | None, declared: str | None
) -> None:
    got = change(node("b", capacity, {SWAP: "true", "team": "x"}, declared=declared))
    assert got is not None and got.label == "remove"
    # JSON merge patch: null deletes this key; other labels are not in the patch at all.
    assert got.patch["metadata"]["labels"] == {SWAP: None}
    assert got.patch["metadata"]["annotations"][SWAP_NODE_ANNOTATION].startswith("false: ")


def test_a_label_with_another_value_is_not_ours_to_remove() -> None:
    n = node("c", GI4, {SWAP: "false"}, declared="NoSwap")
    got = change(n)
    assert got is not None and got.label == "keep" and "labels" not in got.patch["metadata"]
    n["metadata"]["annotations"] = got.patch["metadata"]["annotations"]
    assert change(n) is None
    assert change(node("c", 0, {SWAP: "false"}, annotations={
        SWAP_NODE_ANNOTATION: judge(node("c", 0), None, "declared").message})) is None


def test_an_unknown_verdict_changes_nothing_at_all() -> None:
    # configz failed: the label stays (on or off) and the annotation is not touched.
    for labels in ({SWAP: "true"}, {}):
        n = node("d", GI4, labels, annotations={SWAP_NODE_ANNOTATION: "true: before"})
        assert change(n, source="kubelet", behavior=None) is None


def test_a_node_without_a_name_is_never_patched() -> None:
    assert change({"metadata": {}}) is None
    assert change({"metadata": {"labels": {BEHAVIOR_LABEL: "LimitedSwap"}},
                   "status": {"nodeInfo": {"swap": {"capacity": 1}}}}) is None


def test_custom_label_is_managed_instead_of_the_default() -> None:
    label = Label("example.com/swap", "yes")
    got = change(node("a", 1, {SWAP: "true"}, declared="LimitedSwap"), label)
    assert got is not None
    assert got.patch["metadata"]["labels"] == {"example.com/swap": "yes", PERMILLE: "0"}


def test_kubelet_source_ignores_a_declared_label() -> None:
    n = node("a", GI4, declared="LimitedSwap")
    got = change(n, source="kubelet", behavior="NoSwap")
    assert got is not None and got.verdict.reason is Reason.SWAP_BEHAVIOR_NO_SWAP
    assert "labels" not in got.patch["metadata"]


# ------------------------------------------------------------------------- swap-permille


def limited(capacity: Any, memory: Any = "16Gi", **kwargs: Any) -> dict[str, Any]:
    """A node declared LimitedSwap."""
    return node("n", capacity, declared="LimitedSwap", memory=memory, **kwargs)


@pytest.mark.parametrize(("swap", "memory", "expected"), [
    (8 * 2**30, "16Gi", 500),
    # The harness node: 2012108Ki = 2060398592 bytes; 4294963200000 / 2060398592 = 2084.5.
    (GI4, "2012108Ki", 2084),
    # The real node of the contract: 1073737728000 / 3114217472 = 344.8.
    (1073737728, "3114217472", 344),
    (1073737728, 3114217472, 344),  # a JSON number reads as its text
    (8 * 2**30, "16G", 536),  # decimal: 8589934592000 / 16e9 = 536.9
    (3 * 2**30, "1.5Gi", 2000),  # exactly 2000: no rounding down below it
    (2**34 - 1, "16Gi", 999),  # just under 1000: floored, never rounded up
    (1, "16Gi", 0),  # a swap node whose share backs nothing: still labelled, 0
    (2, "1500m", 1000),  # 1.5 bytes reads as 2, as the API server's Value() does
])
def test_permille_is_floor_of_swap_over_memory_read_exactly(
    swap: int, memory: Any, expected: int
) -> None:
    verdict = judge(limited(swap, memory), "LimitedSwap", "declared")
    assert verdict.permille_value == expected
    got = desired_change(limited(swap, memory), verdict, DEFAULT_LABEL)
    assert got is not None and got.permille == "set"
    assert got.patch["metadata"]["labels"][PERMILLE] == str(expected)
    assert f": swapwise.io/swap-permille={expected} (" in verdict.message


@pytest.mark.parametrize(("status", "problem"), [
    ({}, "no memory capacity reported (status.capacity.memory)"),
    ({"capacity": None}, "no memory capacity reported"),
    ({"capacity": "16Gi"}, "no memory capacity reported"),
    ({"capacity": {"cpu": "8"}}, "no memory capacity reported"),
    ({"capacity": {"memory": "lots"}}, "'lots' is not a valid quantity"),
    ({"capacity": {"memory": "16Gi "}}, "'16Gi ' is not a valid quantity"),
    ({"capacity": {"memory": ""}}, "'' is not a valid quantity"),
    ({"capacity": {"memory": True}}, "True is not a quantity"),
    ({"capacity": {"memory": ["16Gi"]}}, "a list is not a quantity"),
    ({"capacity": {"memory": {"value": "16Gi"}}}, "a dict is not a quantity"),
    ({"capacity": {"memory": "1e400"}}, "out of range"),
    ({"capacity": {"memory": 2**64}}, "out of range"),
    ({"capacity": {"memory": "0"}}, "(status.capacity.memory) '0' is not positive"),
    ({"capacity": {"memory": "-16Gi"}}, "'-16Gi' is not positive"),
    ({"capacity": {"memory": "x" * 5000}}, "longer than 1000 characters"),
])
def test_garbage_memory_capacity_gives_no_permille_and_says_why(
    status: dict[str, Any], problem: str
) -> None:
    n = node("n", GI4, {SWAP: "true", PERMILLE: "249"}, declared="LimitedSwap", memory=None)
    n["status"].update(status)
    memory, why = memory_capacity(n)
    assert memory is None and problem in why
    verdict = judge(n, "LimitedSwap", "declared")
    assert verdict.swap is True and verdict.permille_value is None  # still a swap node
    got = desired_change(n, verdict, DEFAULT_LABEL)
    # The swap label stays; a per-mille that can no longer be checked goes.
    assert got is not None and (got.label, got.permille) == ("keep", "remove")
    assert got.patch["metadata"]["labels"] == {PERMILLE: None}
    message = got.patch["metadata"]["annotations"][SWAP_NODE_ANNOTATION]
    assert message.startswith("true: declared swapBehavior LimitedSwap, swap capacity "
                              "4294963200 bytes; no swapwise.io/swap-permille: ")
    assert problem in message and len(message) < 300


def test_a_permille_beyond_64_bits_is_not_written() -> None:
    # The scheduler parses a Gt label as int64: 1000 * 2^62 bytes over 1 byte is beyond it.
    permille = swap_permille(limited(2**62, "1"))
    assert (permille.swap, permille.memory, permille.value) == (2**62, 1, None)
    assert "beyond a 64-bit per-mille" in permille.problem
    got = desired_change(limited(2**62, "1"), judge(limited(2**62, "1"), "LimitedSwap",
                                                    "declared"), DEFAULT_LABEL)
    assert got is not None and PERMILLE not in got.patch["metadata"]["labels"]
    # Less swap on the same byte: 1000 * 2^53 fits in 64 bits and is written.
    assert swap_permille(limited(2**53, "1")).value == 1000 * 2**53


def test_permille_follows_swap_and_memory_capacity_changes() -> None:
    def settle(n: dict[str, Any]) -> NodeChange | None:
        got = change(n)
        if got is not None:  # apply the merge patch, as the API server does
            for field, values in got.patch["metadata"].items():
                target = n["metadata"].setdefault(field, {})
                for key, value in values.items():
                    if value is None:
                        target.pop(key, None)
                    else:
                        target[key] = value
        return got

    n = limited(8 * 2**30)
    first = settle(n)
    assert first is not None and n["metadata"]["labels"][PERMILLE] == "500"
    assert settle(n) is None  # steady: no write
    n["status"]["nodeInfo"]["swap"]["capacity"] = 4 * 2**30  # kubelet restarted, less swap
    shrunk = settle(n)
    assert shrunk is not None and (shrunk.label, shrunk.permille) == ("keep", "set")
    assert shrunk.patch["metadata"]["labels"] == {PERMILLE: "250"}
    assert "swap capacity 4294967296 bytes, memory capacity 17179869184 bytes: " \
        "swapwise.io/swap-permille=250" in n["metadata"]["annotations"][SWAP_NODE_ANNOTATION]
    n["status"]["capacity"]["memory"] = "32Gi"  # more RAM, same swap
    grown = settle(n)
    assert grown is not None and grown.patch["metadata"]["labels"] == {PERMILLE: "125"}
    assert settle(n) is None
    del n["status"]["nodeInfo"]["swap"]  # swap turned off: no longer a swap node
    gone = settle(n)
    assert gone is not None and (gone.label, gone.permille) == ("remove", "remove")
    assert gone.patch["metadata"]["labels"] == {SWAP: None, PERMILLE: None}
    assert n["metadata"]["labels"] == {BEHAVIOR_LABEL: "LimitedSwap"}


@pytest.mark.parametrize(("capacity", "declared"), [
    (GI4, "NoSwap"), (GI4, None), (GI4, "bogus"), (0, "LimitedSwap"), (None, "LimitedSwap"),
])
def test_a_node_that_is_not_a_swap_node_loses_both_labels(
    capacity: int | None, declared: str | None
) -> None:
    got = change(node("b", capacity, {SWAP: "true", PERMILLE: "249", "team": "x"},
                      declared=declared))
    assert got is not None and (got.label, got.permille) == ("remove", "remove")
    assert got.patch["metadata"]["labels"] == {SWAP: None, PERMILLE: None}
    assert got.verdict.permille is None
    # Only the per-mille left (our swap label was removed by hand, or another value).
    other = change(node("b", capacity, {SWAP: "false", PERMILLE: "0"}, declared=declared))
    assert other is not None and other.patch["metadata"]["labels"] == {PERMILLE: None}


def test_an_unknown_verdict_keeps_the_permille_too() -> None:
    n = node("d", GI4, {SWAP: "true", PERMILLE: "1"})  # stale, but nothing is known now
    assert change(n, source="kubelet", behavior=None) is None
    got = change(n, source="kubelet", behavior="LimitedSwap")
    assert got is not None and got.patch["metadata"]["labels"] == {PERMILLE: "249"}


# --------------------------------------------------------------------- kubelet cache


def test_kubelet_answers_are_reused_until_ttl_resync_or_restart() -> None:
    cache = KubeletConfigCache(ttl=300)
    n = node("a", GI4)
    assert cache.due("a", n, 0.0) and cache.known("a") == (None, "not read yet")
    cache.answered("a", n, "LimitedSwap", 0.0)
    assert not cache.due("a", n, 299.0) and cache.known("a") == ("LimitedSwap", "")
    assert cache.due("a", n, 300.0)  # ttl
    cache.answered("a", n, "LimitedSwap", 300.0)
    cache.expire_all()  # resync
    assert cache.due("a", n, 301.0)
    cache.answered("a", n, "LimitedSwap", 301.0)
    assert cache.due("a", node("a", GI4, boot="b2"), 302.0)  # rebooted
    assert cache.due("a", node("a", 2 * GI4), 302.0)  # swap capacity changed
    ready = node("a", GI4)
    ready["status"]["conditions"] = [{"type": "Ready", "status": "True",
                                      "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    assert cache.due("a", ready, 302.0)  # the kubelet was away and came back
    cache.retain({"b"})
    assert cache.known("a") == (None, "not read yet")


def test_failed_kubelet_reads_back_off_exponentially_up_to_a_cap() -> None:
    cache = KubeletConfigCache(ttl=300, backoff_min=1, backoff_max=60)
    n = node("a", GI4)
    cache.answered("a", n, "LimitedSwap", 0.0)
    delays = [cache.failed("a", n, "HTTP 503", 10.0) for _ in range(8)]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60]
    assert cache.known("a") == (None, "HTTP 503")  # the old answer is not trusted
    assert not cache.due("a", n, 69.0)
    cache.expire_all()
    assert not cache.due("a", n, 69.0)  # a resync does not skip the backoff...
    assert cache.due("a", node("a", GI4, boot="b2"), 69.0)  # ...a restarted kubelet does
    assert cache.due("a", n, 70.0)
    for _ in range(5000):  # a kubelet down for days: no overflow
        cache.failed("a", n, "HTTP 503", 10.0)
    cache.answered("a", n, "NoSwap", 11.0)
    assert cache.known("a") == ("NoSwap", "") and cache.failed("a", n, "x", 12.0) == 1


# ------------------------------------------------------------------------- lease rules


def test_micro_now_always_has_microseconds() -> None:
    # MicroTime needs six fractional digits; a zero microsecond would serialize without.
    assert micro_now().microsecond > 0


def test_claim_creates_renews_and_takes_over() -> None:
    first = claim(None, "a", T0, 15, expired=True)
    assert first == LeaseRecord("a", 15, T0, T0, 0)
    later = T0 + dt.timedelta(seconds=2)
    renewed = claim(first, "a", later, 15, expired=False)
    assert renewed == LeaseRecord("a", 15, T0, later, 0)  # acquireTime kept
    assert claim(renewed, "b", later, 15, expired=False) is None  # still validly held
    taken = claim(renewed, "b", later, 15, expired=True)
    assert taken == LeaseRecord("b", 15, later, later, 1)  # a transition


def test_a_released_lease_is_free_at_once() -> None:
    record = LeaseRecord("a", 15, T0, T0, 3, "7")
    empty = released(record, T0)
    assert (empty.holder, empty.duration, empty.transitions) == ("", 1, 3)
    taken = claim(empty, "b", T0, 15, expired=False)
    assert taken is not None and (taken.holder, taken.transitions) == ("b", 4)


def test_expiry_is_measured_from_when_a_change_was_seen_locally() -> None:
    seen = Observation()
    record = LeaseRecord("a", 10, T0, T0, 0, "1")
    seen.observe(record, now=100.0)
    seen.observe(LeaseRecord("a", 10, T0, T0, 0, "2"), now=105.0)  # same state, new RV
    assert not seen.expired(110.0)
    assert seen.expired(110.5)  # 100 + 10 < 110.5
    renewed = LeaseRecord("a", 10, T0, T0 + dt.timedelta(seconds=9), 0, "3")
    seen.observe(renewed, now=110.6)  # the holder renewed: the clock restarts
    assert not seen.expired(120.0)


def test_timing_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        Timing(lease_duration=10, renew_deadline=10, retry_period=2)


class FakeLeaseStore:
    """One Lease with the API server's optimistic concurrency."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0
        self.fail = False

    async def get(self) -> LeaseRecord | None:
        if self.fail:
            raise OSError("connection refused")
        return self.record

    def _store(self, record: LeaseRecord) -> LeaseRecord:
        self.version += 1
        self.record = LeaseRecord(record.holder, record.duration, record.acquire_time,
                                  record.renew_time, record.transitions, str(self.version))
        return self.record

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        if self.fail:
            raise OSError("connection refused")
        if self.record is not None:
            raise Conflict("already exists")
        return self._store(record)

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        if self.fail:
            raise OSError("connection refused")
        if self.record is None or record.resource_version != self.record.resource_version:
            raise Conflict("the object has been modified")
        return self._store(record)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.wall = T0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall += dt.timedelta(seconds=seconds)


TIMING = Timing(lease_duration=15, renew_deadline=10, retry_period=2)


def electors(store: FakeLeaseStore, clock: Clock) -> tuple[Elector, Elector, list[str]]:
    events: list[str] = []

    def make(name: str) -> Elector:
        return Elector(store, name, TIMING, clock=clock, wall=lambda: clock.wall,
                       on_change=lambda leading: events.append(f"{name}:{leading}"))

    return make("a"), make("b"), events


def test_only_one_of_two_candidates_leads_and_the_other_takes_over_after_expiry() -> None:
    async def scenario() -> None:
        store, clock = FakeLeaseStore(), Clock()
        a, b, events = electors(store, clock)
        await a.step()
        await b.step()
        assert a.leading() and not b.leading()
        assert events == ["a:True"]
        # a renews every period; b keeps seeing fresh renewals and never takes over.
        for _ in range(10):
            clock.advance(2)
            await a.step()
            await b.step()
            assert a.leading() and not b.leading()
        # a goes silent (partitioned): it stops acting after the renew deadline...
        clock.advance(10)
        assert not a.leading()
        await b.step()
        assert not b.leading()  # ...but b saw the last renewal only 10 s ago: not expired
        clock.advance(5.5)
        await b.step()  # 15.5 s since b saw the record change: expired, b takes over
        assert b.leading()
        assert store.record is not None
        assert (store.record.holder, store.record.transitions) == ("b", 1)
        # a comes back: the record names b, so a steps down at once.
        await a.step()
        assert not a.leading()
        assert events == ["a:True", "b:True", "a:False"]

    asyncio.run(scenario())


def test_a_newcomer_waits_a_full_duration_whatever_the_renew_time_says() -> None:
    async def scenario() -> None:
        store, clock = FakeLeaseStore(), Clock()
        a, b, _ = electors(store, clock)
        await a.step()
        clock.advance(60)  # a went silent long ago, by the renewTime in the record...
        await b.step()  # ...but b has only just seen it: it trusts its own clock
        assert not b.leading()
        clock.advance(15.5)
        await b.step()
        assert b.leading()

    asyncio.run(scenario())


def test_a_racing_write_loses_with_a_conflict() -> None:
    async def scenario() -> None:
        store, clock = FakeLeaseStore(), Clock()
        a, b, _ = electors(store, clock)
        await a.step()
        await b.step()  # b first sees a's record now...
        clock.advance(20)  # ...and a stays silent past the lease duration
        stale = store.record
        await b.step()  # b takes over first...
        assert b.leading()

        async def stale_get() -> LeaseRecord | None:
            return stale

        a.store = FakeLeaseStoreView(store, stale_get)
        # ...a read the old record before b wrote: its write is refused, it does not lead.
        assert await a.attempt() is Attempt.FAILED
        assert store.record is not None and store.record.holder == "b"

    asyncio.run(scenario())


class FakeLeaseStoreView(FakeLeaseStore):
    """The same store, but reads come from ``get`` (a stale cache)."""

    def __init__(self, inner: FakeLeaseStore, get: Any) -> None:
        self.inner = inner
        self._get = get

    async def get(self) -> LeaseRecord | None:
        result: LeaseRecord | None = await self._get()
        return result

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        return await self.inner.update(record)


def test_leader_keeps_acting_through_short_api_errors_then_stops() -> None:
    async def scenario() -> None:
        store, clock = FakeLeaseStore(), Clock()
        a, _, events = electors(store, clock)
        await a.step()
        store.fail = True
        clock.advance(2)
        await a.step()
        assert a.leading()  # 2 s without renewal < 10 s renew deadline
        clock.advance(8.5)
        await a.step()
        assert not a.leading()
        assert events == ["a:True", "a:False"]
        store.fail = False
        await a.step()  # its own record: it renews and leads again
        assert a.leading()

    asyncio.run(scenario())


def test_release_hands_over_without_waiting_for_expiry() -> None:
    async def scenario() -> None:
        store, clock = FakeLeaseStore(), Clock()
        a, b, _ = electors(store, clock)
        await a.step()
        await b.step()
        await a.release()
        assert not a.leading()
        assert store.record is not None and store.record.holder == ""
        await b.step()  # no waiting: a released holder is nobody
        assert b.leading()

    asyncio.run(scenario())


# ---------------------------------------------------------------------------- controller


class FakeNodes:
    """Nodes with merge-patch semantics for labels and annotations, and a node proxy whose
    /configz answers (or failures) are set per node; patches can be made to fail."""

    def __init__(self, *nodes: dict[str, Any]) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.failing: set[str] = set()
        self.configz: dict[str, Any] = {}  # node -> payload, or an exception to raise
        self.configz_reads: list[str] = []

    async def list_nodes(self) -> tuple[list[dict[str, Any]], str]:
        return list(self.nodes.values()), "1"

    async def watch_nodes(self, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        await asyncio.Event().wait()  # a watch with no events: blocks, like the real one
        yield "ADDED", {}

    async def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A merge patch as the API server applies it: labels and annotations key by key,
        the taint list whole, refused (409) when its resourceVersion is not the node's."""
        if name in self.failing:
            raise OSError("500 Internal Server Error")
        self.patches.append((name, patch))
        node = self.nodes[name]
        metadata = node["metadata"]
        assert set(patch) <= {"metadata", "spec"}, patch
        assert set(patch.get("spec", {})) <= {"taints"}, patch  # nothing else is ours
        version = patch["metadata"].get("resourceVersion")
        if version is not None and version != metadata.get("resourceVersion"):
            raise OSError(f"409 Conflict: the object has been modified ({version})")
        for field, changes in patch["metadata"].items():
            if field == "resourceVersion":
                continue
            assert field in ("labels", "annotations"), field  # nothing else is ours
            target = metadata.setdefault(field, {})
            for key, value in changes.items():
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value
        if "taints" in patch.get("spec", {}):
            taints = patch["spec"]["taints"]
            spec = node.setdefault("spec", {})
            if taints is None:
                spec.pop("taints", None)
            else:
                spec["taints"] = copy.deepcopy(taints)
        if "resourceVersion" in metadata:
            metadata["resourceVersion"] = str(int(metadata["resourceVersion"]) + 1)
        return copy.deepcopy(node)

    async def kubelet_config(self, name: str) -> Any:
        self.configz_reads.append(name)
        answer = self.configz.get(name, OSError("no route to host"))
        if isinstance(answer, Exception):
            raise answer
        return answer


def sample(metrics: LabellerMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def by_reason(metrics: LabellerMetrics) -> dict[str, float]:
    counts = {r.value: sample(metrics, "swapwise_labeller_nodes_by_reason", reason=r.value)
              for r in Reason}
    return {reason: count for reason, count in counts.items() if count}


def annotation(api: FakeNodes, name: str) -> str | None:
    value: str | None = (api.nodes[name]["metadata"].get("annotations") or {}).get(
        SWAP_NODE_ANNOTATION)
    return value


def kubelet_labeller(api: FakeNodes, metrics: LabellerMetrics, clock: Clock,
                     leading: Any = None) -> Labeller:
    return Labeller(api, DEFAULT_LABEL, metrics, leading=leading or (lambda: True),
                    source="kubelet", kubelet_config_ttl=300, clock=clock)


def test_leader_labels_exactly_the_declared_swap_nodes() -> None:
    async def scenario() -> None:
        api = FakeNodes(
            node("swap", 2**30, declared="LimitedSwap"),
            node("undeclared", 2**30, {SWAP: "true", "keep": "me"}),
            node("noswap", 2**30, {SWAP: "true", PERMILLE: "62"}, declared="NoSwap"),
            node("gone", 0, {SWAP: "true"}, declared="LimitedSwap"),
            node("plain"),
            node("other", 2**30, {SWAP: "false", PERMILLE: "abc"}),
            node("nomemory", 2**30, {PERMILLE: "62"}, declared="LimitedSwap", memory=None),
        )
        metrics = LabellerMetrics()
        labeller = Labeller(api, DEFAULT_LABEL, metrics, leading=lambda: True)
        labeller.replace_all((await api.list_nodes())[0])
        assert await labeller.reconcile_pending() == 0
        assert api.configz_reads == []  # declared: no kubelet is ever asked
        assert [(n, p["metadata"].get("labels")) for n, p in api.patches] == [
            ("gone", {SWAP: None}),
            # A swap node whose memory capacity is not reported: a swap node, no per-mille.
            ("nomemory", {SWAP: "true", PERMILLE: None}),
            ("noswap", {SWAP: None, PERMILLE: None}),  # NoSwap: both labels go
            ("other", {PERMILLE: None}),  # swapwise's own label, whatever its value
            ("plain", None), ("swap", {SWAP: "true", PERMILLE: "62"}),
            ("undeclared", {SWAP: None}),
        ]
        assert api.nodes["undeclared"]["metadata"]["labels"] == {"keep": "me"}
        assert api.nodes["other"]["metadata"]["labels"] == {SWAP: "false"}  # not ours
        assert annotation(api, "nomemory") == (
            "true: declared swapBehavior LimitedSwap, swap capacity 1073741824 bytes; no "
            "swapwise.io/swap-permille: no memory capacity reported (status.capacity.memory) "
            "(source: node label swapwise.io/swap-behavior)")
        assert annotation(api, "swap") == (
            "true: declared swapBehavior LimitedSwap, swap capacity 1073741824 bytes, "
            "memory capacity 17179869184 bytes: swapwise.io/swap-permille=62 "
            "(source: node label swapwise.io/swap-behavior)")
        assert annotation(api, "noswap") == (
            "false: declared swapBehavior NoSwap (source: node label swapwise.io/swap-behavior)")
        assert str(annotation(api, "undeclared")).startswith(
            "false: swap capacity 1073741824 bytes but swapBehavior undeclared")
        assert sample(metrics, "swapwise_labeller_labels_added_total") == 2
        assert sample(metrics, "swapwise_labeller_labels_removed_total") == 3
        assert sample(metrics, "swapwise_labeller_swap_nodes") == 2
        assert sample(metrics, "swapwise_labeller_permille_nodes") == 1
        assert sample(metrics, "swapwise_labeller_nodes") == 7
        assert by_reason(metrics) == {"LimitedSwap": 2, "NoSwapCapacity": 2,
                                      "SwapBehaviorNoSwap": 1, "SwapBehaviorUndeclared": 2}
        # A second pass finds nothing to do: no write at all, not even the annotation.
        labeller.resync()
        await labeller.reconcile_pending()
        assert len(api.patches) == 7

    asyncio.run(scenario())


def test_node_updated_log_says_what_the_permille_is_computed_from(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        api = FakeNodes(node("swap", 8 * 2**30, declared="LimitedSwap"),
                        node("nomemory", GI4, {PERMILLE: "9"}, declared="LimitedSwap",
                             memory="lots"),
                        node("noswap", GI4, {PERMILLE: "9"}, declared="NoSwap"))
        labeller = Labeller(api, DEFAULT_LABEL, LabellerMetrics(), leading=lambda: True)
        labeller.replace_all((await api.list_nodes())[0])
        await labeller.reconcile_pending()

    with caplog.at_level("INFO", logger="swapwise.labeller"):
        asyncio.run(scenario())
    lines = {r.__dict__["node"]: r.__dict__ for r in caplog.records
             if r.getMessage() == "node updated"}
    fields = ("action", "permille_action", "swap_bytes", "memory_bytes", "permille")
    assert {name: tuple(line[f] for f in fields) for name, line in lines.items()} == {
        "swap": ("add", "set", 8 * 2**30, 16 * 2**30, 500),
        "nomemory": ("add", "remove", GI4, None, None),
        "noswap": ("keep", "remove", None, None, None),
    }
    assert "'lots' is not a valid quantity" in lines["nomemory"]["why"]


def test_declaring_limitedswap_later_labels_the_node() -> None:
    async def scenario() -> None:
        api = FakeNodes(node("n", GI4))
        labeller = Labeller(api, DEFAULT_LABEL, LabellerMetrics(), leading=lambda: True)
        labeller.replace_all((await api.list_nodes())[0])
        await labeller.reconcile_pending()
        assert SWAP not in api.nodes["n"]["metadata"]["labels"]
        declared = copy.deepcopy(api.nodes["n"])
        declared["metadata"]["labels"][BEHAVIOR_LABEL] = "LimitedSwap"
        labeller.apply_event("MODIFIED", declared)
        await labeller.reconcile_pending()
        assert api.nodes["n"]["metadata"]["labels"][SWAP] == "true"
        assert str(annotation(api, "n")).startswith("true: ")

    asyncio.run(scenario())


def test_kubelet_source_asks_only_swap_nodes_and_labels_limitedswap_ones() -> None:
    async def scenario() -> None:
        api = FakeNodes(node("limited", GI4), node("noswap", GI4, {SWAP: "true"}),
                        node("unset", GI4), node("plain"))
        api.configz = {"limited": KUBELET_SWAP, "noswap": KUBELET_NOSWAP,
                       "unset": {"kubeletconfig": {"failSwapOn": False}}}
        metrics = LabellerMetrics()
        labeller = kubelet_labeller(api, metrics, Clock())
        labeller.replace_all((await api.list_nodes())[0])
        assert await labeller.reconcile_pending() == 0
        assert sorted(api.configz_reads) == ["limited", "noswap", "unset"]
        assert api.nodes["limited"]["metadata"]["labels"] == {SWAP: "true", PERMILLE: "249"}
        assert api.nodes["noswap"]["metadata"]["labels"] == {}
        assert annotation(api, "limited") == (
            "true: kubelet swapBehavior LimitedSwap, swap capacity 4294963200 bytes, "
            "memory capacity 17179869184 bytes: swapwise.io/swap-permille=249 "
            "(source: kubelet configz)")
        assert annotation(api, "noswap") == (
            "false: kubelet swapBehavior NoSwap (source: kubelet configz)")
        assert by_reason(metrics) == {"LimitedSwap": 1, "SwapBehaviorNoSwap": 2,
                                      "NoSwapCapacity": 1}
        assert sample(metrics, "swapwise_labeller_swap_nodes") == 1
        assert sample(metrics, "swapwise_labeller_kubelet_config_errors_total") == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("failure", [
    OSError("connection refused"),
    OSError(),  # no message: the reason still says something
    RuntimeError("HTTP 403: nodes \"n\" is forbidden: cannot get resource \"nodes/proxy\""),
    ConfigzError("configz is a JSON list, not an object"),
    "not a dict",  # a payload of the wrong shape, returned rather than raised
    {"kubeletconfig": {"memorySwap": {"swapBehavior": 7}}},
])
def test_configz_failure_changes_nothing_counts_and_retries_with_backoff(failure: Any) -> None:
    async def scenario() -> None:
        before = {SWAP_NODE_ANNOTATION: "true: earlier"}
        api = FakeNodes(node("on", GI4, {SWAP: "true", PERMILLE: "1"}, annotations=before),
                        node("off", GI4, annotations=before))
        api.configz = {"on": failure, "off": failure}
        metrics, clock = LabellerMetrics(), Clock()
        labeller = kubelet_labeller(api, metrics, clock)
        labeller.replace_all((await api.list_nodes())[0])
        assert await labeller.reconcile_pending() == 2  # both stay pending
        assert api.patches == []  # neither added nor removed; annotations untouched
        assert api.nodes["on"]["metadata"]["labels"] == {SWAP: "true", PERMILLE: "1"}
        assert labeller.pending == {"on", "off"}
        assert sample(metrics, "swapwise_labeller_kubelet_config_errors_total") == 2
        assert by_reason(metrics) == {"KubeletConfigUnavailable": 2}
        assert sample(metrics, "swapwise_labeller_swap_nodes") == 0
        verdict = labeller.verdicts["on"]
        assert verdict.swap is None and verdict.message.startswith(
            "unknown: kubelet configz not readable: ")
        assert len(verdict.message) > len("unknown: kubelet configz not readable: ")
        # Before the backoff is over, a node event does not hammer the kubelet again.
        labeller.apply_event("MODIFIED", copy.deepcopy(api.nodes["on"]))
        clock.now += 0.5
        assert await labeller.reconcile_pending() == 2
        assert len(api.configz_reads) == 2
        # After it, the kubelet answers: the node is judged and patched.
        api.configz = {"on": KUBELET_NOSWAP, "off": KUBELET_SWAP}
        clock.now += 1
        assert await labeller.reconcile_pending() == 0
        assert len(api.configz_reads) == 4
        assert api.nodes["on"]["metadata"]["labels"] == {}  # both labels go
        assert api.nodes["off"]["metadata"]["labels"] == {SWAP: "true", PERMILLE: "249"}
        assert sample(metrics, "swapwise_labeller_kubelet_config_errors_total") == 2
        assert by_reason(metrics) == {"LimitedSwap": 1, "SwapBehaviorNoSwap": 1}

    asyncio.run(scenario())


def test_one_unreachable_kubelet_does_not_hold_up_the_others() -> None:
    async def scenario() -> None:
        api = FakeNodes(node("a", GI4), node("b", GI4), node("c", GI4))
        api.configz = {"a": KUBELET_SWAP, "b": TimeoutError(), "c": KUBELET_SWAP}
        metrics = LabellerMetrics()
        labeller = kubelet_labeller(api, metrics, Clock())
        labeller.replace_all((await api.list_nodes())[0])
        assert await labeller.reconcile_pending() == 1
        assert [n for n, _ in api.patches] == ["a", "c"]
        assert labeller.verdicts["b"].message == (
            "unknown: kubelet configz not readable: TimeoutError")

    asyncio.run(scenario())


def test_kubelet_answers_are_cached_until_resync_ttl_or_restart() -> None:
    async def scenario() -> None:
        api = FakeNodes(node("n", GI4))
        api.configz = {"n": KUBELET_SWAP}
        clock = Clock()
        labeller = kubelet_labeller(api, LabellerMetrics(), clock)
        labeller.replace_all((await api.list_nodes())[0])
        await labeller.reconcile_pending()
        assert api.nodes["n"]["metadata"]["labels"] == {SWAP: "true", PERMILLE: "249"}
        # The kubelet is reconfigured; node events alone use the cached answer.
        api.configz["n"] = KUBELET_NOSWAP
        labeller.apply_event("MODIFIED", copy.deepcopy(api.nodes["n"]))
        await labeller.reconcile_pending()
        assert api.configz_reads == ["n"]
        assert api.nodes["n"]["metadata"]["labels"] == {SWAP: "true", PERMILLE: "249"}
        # A resync reads it again, and the label goes.
        labeller.resync()
        await labeller.reconcile_pending()
        assert api.configz_reads == ["n", "n"]
        assert api.nodes["n"]["metadata"]["labels"] == {}
        # The TTL: the next node event after it re-reads.
        api.configz["n"] = KUBELET_SWAP
        clock.now += 299
        labeller.apply_event("MODIFIED", copy.deepcopy(api.nodes["n"]))
        await labeller.reconcile_pending()
        assert len(api.configz_reads) == 2
        clock.now += 1
        labeller.apply_event("MODIFIED", copy.deepcopy(api.nodes["n"]))
        await labeller.reconcile_pending()
        assert len(api.configz_reads) == 3
        assert api.nodes["n"]["metadata"]["labels"] == {SWAP: "true", PERMILLE: "249"}
        # A reboot (new bootID) re-reads at once.
        api.configz["n"] = KUBELET_NOSWAP
        rebooted = copy.deepcopy(api.nodes["n"])
        rebooted["status"]["nodeInfo"]["bootID"] = "b2"
        labeller.apply_event("MODIFIED", rebooted)
        await labeller.reconcile_pending()
        assert len(api.configz_reads) == 4
        assert api.nodes["n"]["metadata"]["labels"] == {}

    asyncio.run(scenario())


def test_the_reconcile_loop_resync_rereads_kubelets() -> None:
    async def scenario() -> None:
        api = FakeNodes(node("n", GI4))
        api.configz = {"n": KUBELET_SWAP}
        labeller = Labeller(api, DEFAULT_LABEL, LabellerMetrics(), leading=lambda: True,
                            resync_seconds=0.05, source="kubelet", kubelet_config_ttl=3600)
        labeller.replace_all((await api.list_nodes())[0])
        stop = asyncio.Event()
        task = asyncio.create_task(labeller.reconcile_loop(stop))
        for _ in range(200):
            if len(api.configz_reads) >= 3:
                break
            await asyncio.sleep(0.01)
        stop.set()
        labeller.wake.set()
        await task
        assert len(api.configz_reads) >= 3  # a long TTL does not stop the resync re-reads
        assert api.nodes["n"]["metadata"]["labels"] == {SWAP: "true", PERMILLE: "249"}
        assert len(api.patches) == 1

    asyncio.run(scenario())


def test_follower_patches_nothing_and_asks_no_kubelet_until_it_leads() -> None:
    async def scenario() -> None:
        api = FakeNodes(node("swap", 2**30))
        api.configz = {"swap": KUBELET_SWAP}
        leader = False
        metrics = LabellerMetrics()
        labeller = kubelet_labeller(api, metrics, Clock(), leading=lambda: leader)
        # Every reason's series exists from the start (dashboards need no absent()).
        assert all(metrics.registry.get_sample_value(
            "swapwise_labeller_nodes_by_reason", {"reason": r.value}) == 0 for r in Reason)
        labeller.replace_all((await api.list_nodes())[0])
        assert await labeller.reconcile_pending() == 0
        assert api.patches == [] and api.configz_reads == []
        leader = True
        labeller.on_leadership(True)
        await labeller.reconcile_pending()
        assert [name for name, _ in api.patches] == ["swap"]
        assert sample(metrics, "swapwise_labeller_is_leader") == 1
        assert sample(metrics, "swapwise_labeller_swap_nodes") == 1
        leader = False
        labeller.on_leadership(False)  # the judgement gauges are the leader's
        assert sample(metrics, "swapwise_labeller_swap_nodes") == 0
        assert by_reason(metrics) == {}

    asyncio.run(scenario())


def test_watch_events_drive_add_and_remove() -> None:
    async def scenario() -> None:
        api = FakeNodes(node("n", declared="LimitedSwap"))
        metrics = LabellerMetrics()
        labeller = Labeller(api, DEFAULT_LABEL, metrics, leading=lambda: True)
        labeller.replace_all((await api.list_nodes())[0])
        await labeller.reconcile_pending()
        assert [p["metadata"].get("labels") for _, p in api.patches] == [None]  # annotation
        labeller.apply_event("MODIFIED", node("n", 4 * 2**30, declared="LimitedSwap"))
        await labeller.reconcile_pending()
        assert api.nodes["n"]["metadata"]["labels"][SWAP] == "true"
        labeller.apply_event("MODIFIED", node("n", 0, {SWAP: "true"}, declared="LimitedSwap"))
        await labeller.reconcile_pending()
        assert SWAP not in api.nodes["n"]["metadata"]["labels"]
        assert by_reason(metrics) == {"NoSwapCapacity": 1}
        labeller.apply_event("DELETED", node("n", 0))
        assert labeller.nodes == {} and labeller.pending == set() and labeller.verdicts == {}
        assert by_reason(metrics) == {} and sample(metrics, "swapwise_labeller_nodes") == 0

    asyncio.run(scenario())


def test_failed_patch_is_counted_and_retried() -> None:
    async def scenario() -> None:
        api = FakeNodes(node("flaky", 2**30, declared="LimitedSwap"))
        api.failing.add("flaky")
        metrics = LabellerMetrics()
        labeller = Labeller(api, DEFAULT_LABEL, metrics, leading=lambda: True)
        labeller.replace_all((await api.list_nodes())[0])
        assert await labeller.reconcile_pending() == 1
        assert labeller.pending == {"flaky"}
        assert sample(metrics, "swapwise_labeller_reconcile_errors_total") == 1
        api.failing.clear()
        assert await labeller.reconcile_pending() == 0
        assert api.nodes["flaky"]["metadata"]["labels"][SWAP] == "true"

    asyncio.run(scenario())


def test_error_text_is_one_short_line() -> None:
    assert error_text(TimeoutError()) == "TimeoutError"
    assert error_text(OSError("a\nb   c")) == "a b c"
    assert len(error_text(OSError("x" * 10_000))) == 303


def test_watch_loop_lists_then_marks_ready() -> None:
    async def scenario() -> None:
        api = FakeNodes(node("swap", 1))
        labeller = Labeller(api, DEFAULT_LABEL, LabellerMetrics(), leading=lambda: True)
        stop = asyncio.Event()
        task = asyncio.create_task(labeller.watch_loop(stop))
        for _ in range(100):
            if labeller.synced:
                break
            await asyncio.sleep(0.01)
        stop.set()
        task.cancel()
        assert labeller.synced and set(labeller.nodes) == {"swap"}

    asyncio.run(scenario())


# ------------------------------------------------------------------------------- http


def test_readiness_follows_the_cache_and_metrics_are_served() -> None:
    metrics = LabellerMetrics()
    ready = False
    app = create_app(metrics, ready=lambda: ready, leading=lambda: False)
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        response = client.get("/readyz")
        assert response.status_code == 503 and response.json() == {"ready": False,
                                                                     "leader": False}
        ready = True
        assert client.get("/readyz").status_code == 200
        metrics.labels_added.inc(3)
        body = client.get("/metrics").text
    assert "swapwise_labeller_labels_added_total 3.0" in body
    assert "swapwise_labeller_is_leader 0.0" in body
    assert body == generate_latest(metrics.registry).decode()


# -------------------------------------------------------------------------------- CLI


@pytest.mark.parametrize(("args", "message"), [
    (["--label", "no-value"], "'no-value': expected key=value"),
    (["--label", "x=not valid"], "the value must be"),
    (["--retry-period", "20"], "retry period < renew deadline < lease duration"),
    (["--metrics-port", "0"], "--metrics-port 0 is out of range"),
    (["--resync", "0"], "--resync must be greater than zero"),
    (["--kubelet-config-ttl", "0"], "--kubelet-config-ttl must be greater than zero"),
    (["--kubelet-config-ttl", "nan"], "--kubelet-config-ttl must be greater than zero"),
    (["--label", f"{PERMILLE}=true"], "is the per-mille label label-nodes always manages"),
])
def test_label_nodes_refuses_bad_options_before_connecting(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["label-nodes", *args]) == 1
    assert message in capsys.readouterr().err


def test_label_nodes_without_a_cluster_exits_1_with_the_reason(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "swapwise"
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "missing"), "HOME": str(tmp_path)}
    proc = subprocess.run([str(exe), "label-nodes"], capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    assert proc.returncode == 1
    assert f"Configuration file {tmp_path / 'missing'} not found" in proc.stderr


# ------------------------------------------------------------- the node proxy adapter


def proxy_client(handler: Callable[[httpx2.Request], httpx2.Response]) -> KubeNodes:
    """KubeNodes on a lightkube client whose HTTP goes to ``handler`` instead of a server."""
    config = KubeConfig.from_dict({
        "clusters": [{"name": "c", "cluster": {"server": "https://api.test"}}],
        "users": [{"name": "u", "user": {"token": "t0k3n"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    })
    return KubeNodes(AsyncClient(config=config, transport=httpx2.MockTransport(handler)))


def test_kubelet_config_is_read_through_the_node_proxy_with_the_clients_credentials() -> None:
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, json=KUBELET_SWAP)

    async def scenario() -> Any:
        return await proxy_client(handler).kubelet_config("node-1")

    assert asyncio.run(scenario()) == KUBELET_SWAP
    [request] = seen
    assert request.method == "GET"
    assert str(request.url) == "https://api.test/api/v1/nodes/node-1/proxy/configz"
    assert request.headers["Authorization"] == "Bearer t0k3n"


@pytest.mark.parametrize(("response", "message"), [
    (httpx2.Response(403, json={"kind": "Status", "message": 'nodes "node-1" is forbidden: '
                                "cannot get resource \"nodes/proxy\""}),
     'HTTP 403: nodes "node-1" is forbidden'),
    (httpx2.Response(502, text="Error trying to reach service: dial tcp 10.0.0.1:10250"),
     "HTTP 502: Error trying to reach service"),
    (httpx2.Response(503), "HTTP 503: (empty body)"),
    (httpx2.Response(502, content=b"proxy error " + b"x" * (2 << 20)), "HTTP 502: proxy error x"),
    (httpx2.Response(500, json={"kind": "Status"}), 'HTTP 500: {"kind":'),
    (httpx2.Response(200, text="<html>not json</html>"), "configz answer is not JSON"),
    (httpx2.Response(200, content=b"\xff\xfe{"), "configz answer is not JSON"),
    (httpx2.Response(200, content=b'{"kubeletconfig": "' + b"x" * (2 << 20) + b'"}'),
     "configz answer larger than 1048576 bytes"),
])
def test_a_bad_configz_answer_is_an_error_with_its_reason(
    response: httpx2.Response, message: str
) -> None:
    async def scenario() -> None:
        with pytest.raises(KubeletConfigError, match=re.escape(message)):
            await proxy_client(lambda _request: response).kubelet_config("node-1")

    asyncio.run(scenario())

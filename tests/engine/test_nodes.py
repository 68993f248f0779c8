"""webhook/engine/nodes.py: the one reading of a Node that the agent, ``audit``, ``plan`` and
placement share. A Node is another writer's object: every field is read without trusting
its shape, junk reads as "not reported", never as an exception."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.base.quantity import MAX_INT64
from webhook.engine.nodes import (
    BEHAVIOR_LABEL,
    FACTS_ANNOTATION,
    NodeFacts,
    Permille,
    as_mapping,
    declared_behavior,
    label_permille,
    memory_capacity,
    node_annotations,
    node_labels,
    node_name,
    permille_of,
    status_permille,
    swap_capacity,
)

GIB = 1 << 30


def with_status(capacity: Any = None, swap: Any = None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if capacity is not None:
        status["capacity"] = {"memory": capacity}
    if swap is not None:
        status["nodeInfo"] = {"swap": {"capacity": swap}}
    return {"metadata": {"name": "n"}, "status": status}


JUNK = [None, 5, "x", [], ["a"], {"a": 1}, True]


@pytest.mark.parametrize("junk", JUNK)
def test_metadata_of_any_shape_reads_as_empty(junk: Any) -> None:
    assert (node_name({"metadata": junk}), dict(node_labels({"metadata": junk})),
            dict(node_annotations({"metadata": junk}))) == ("", {}, {})
    obj = {"metadata": {"name": junk, "labels": junk, "annotations": junk}}
    assert node_name(obj) == (junk if isinstance(junk, str) else "")
    assert dict(node_labels(obj)) == (junk if isinstance(junk, dict) else {})
    assert dict(node_annotations(obj)) == (junk if isinstance(junk, dict) else {})
    assert declared_behavior(obj) is None


def test_as_mapping() -> None:
    assert as_mapping({"a": 1}) == {"a": 1}
    for junk in (None, [], "s", 3):
        assert as_mapping(junk) == {}


def test_labels_and_behavior() -> None:
    obj = {"metadata": {"name": "n", "labels": {BEHAVIOR_LABEL: "LimitedSwap", "x": "y"},
                        "annotations": {"a": "b"}}}
    assert node_name(obj) == "n"
    assert node_labels(obj) == {BEHAVIOR_LABEL: "LimitedSwap", "x": "y"}
    assert node_annotations(obj) == {"a": "b"}
    assert declared_behavior(obj) == "LimitedSwap"
    obj["metadata"]["labels"][BEHAVIOR_LABEL] = 1
    assert declared_behavior(obj) is None


# -- capacities


@pytest.mark.parametrize("raw,expected", [
    ("8Gi", 8 * GIB), (8 * GIB, 8 * GIB), ("8G", 8_000_000_000), ("1.5Gi", 3 * GIB // 2),
    ("1500m", 2),  # 1.5 bytes: rounded up to a whole byte, as the API server's Value() does
    ("0", 0), ("-1Gi", 0),  # negative: none
])
def test_swap_capacity(raw: Any, expected: int) -> None:
    assert swap_capacity(with_status(swap=raw)) == expected


@pytest.mark.parametrize("raw", [None, True, False, "lots", [], {}, 1.5e400, "1e400",
                                 MAX_INT64 + 1])
def test_swap_capacity_junk_is_not_reported(raw: Any) -> None:
    assert swap_capacity(with_status(swap=raw)) is None


def test_swap_capacity_of_a_node_without_node_info() -> None:
    assert swap_capacity({}) is None
    assert swap_capacity({"status": {"nodeInfo": {"swap": None}}}) is None
    assert swap_capacity({"status": "x"}) is None


@pytest.mark.parametrize("raw,expected", [("8Gi", 8 * GIB), (1024, 1024), ("1k", 1000),
                                          ("1500m", 2), ("0.5", 1)])
def test_memory_capacity(raw: Any, expected: int) -> None:
    assert memory_capacity(with_status(capacity=raw)) == (expected, "")


@pytest.mark.parametrize("raw,problem", [
    (None, "no memory capacity reported (status.capacity.memory)"),
    ("lots", "memory capacity (status.capacity.memory) unreadable: 'lots' is not a valid"),
    (True, "memory capacity (status.capacity.memory) unreadable"),
    ("0", "memory capacity (status.capacity.memory) '0' is not positive"),
    ("-8Gi", "memory capacity (status.capacity.memory) '-8Gi' is not positive"),
    ([1], "memory capacity (status.capacity.memory) unreadable"),
])
def test_memory_capacity_unreadable_says_why(raw: Any, problem: str) -> None:
    obj = {"status": {"capacity": {"memory": raw}}} if raw is not None else {}
    memory, why = memory_capacity(obj)
    assert memory is None
    assert why.startswith(problem)


# -- per-mille


def test_permille_of_rounds_down() -> None:
    obj = with_status(capacity="3Gi")
    assert permille_of(GIB, obj) == Permille(GIB, 3 * GIB, 333)
    assert permille_of(0, obj) == Permille(0, 3 * GIB, 0)
    assert permille_of(6 * GIB, obj).value == 2000


def test_permille_of_without_memory_says_why() -> None:
    result = permille_of(GIB, with_status())
    assert (result.memory, result.value) == (None, None)
    assert "no memory capacity" in result.problem


def test_permille_beyond_64_bits_is_refused() -> None:
    result = permille_of(MAX_INT64, with_status(capacity="1"))
    assert result.value is None
    assert "beyond a 64-bit per-mille" in result.problem


def test_status_permille_counts_all_reported_swap() -> None:
    assert status_permille(with_status(capacity="8Gi", swap="4Gi")).value == 500
    assert status_permille(with_status(capacity="8Gi")).value == 0
    assert status_permille(with_status(swap="4Gi")).value is None


@pytest.mark.parametrize("value,expected", [
    ("250", 250), ("0", 0), ("+5", 5), ("-3", -3), ("007", 7),
    (str(MAX_INT64), MAX_INT64), (str(-MAX_INT64 - 1), -MAX_INT64 - 1),
])
def test_label_permille_as_the_scheduler_reads_it(value: str, expected: int) -> None:
    assert label_permille(value) == expected


@pytest.mark.parametrize("value", [
    None, 250, 2.5, "", " 250", "250 ", "2.5", "1_000", "0x10", "abc", "٣",  # Arabic 3
    str(MAX_INT64 + 1), str(-MAX_INT64 - 2), "9" * 26, "9" * 10_000,
])
def test_label_permille_refuses_what_the_scheduler_cannot_parse(value: Any) -> None:
    assert label_permille(value) is None


# -- the facts annotation


FACTS = NodeFacts(permille=250, swap_bytes=3 * GIB, disk_bytes=2 * GIB, zram_bytes=GIB,
                  backing_bytes=2 * GIB, memory_bytes=8 * GIB, swap_behavior="LimitedSwap",
                  behavior_source="kubelet", zswap=True, declared_permille=500)


def annotated(text: Any) -> dict[str, Any]:
    return {"metadata": {"annotations": {FACTS_ANNOTATION: text}}}


def test_facts_json_is_compact_and_sorted() -> None:
    text = FACTS.to_json()
    assert " " not in text
    assert list(json.loads(text)) == sorted(json.loads(text))
    assert json.loads(text) == {
        "permille": 250, "swapBytes": 3 * GIB, "diskBytes": 2 * GIB, "zramBytes": GIB,
        "backingBytes": 2 * GIB, "memoryBytes": 8 * GIB, "swapBehavior": "LimitedSwap",
        "behaviorSource": "kubelet", "zswap": True, "declaredPermille": 500}


def test_facts_without_a_declared_per_mille_omit_the_key() -> None:
    facts = NodeFacts(None, 0, 0, 0, 0, None, None, "declared", False)
    assert "declaredPermille" not in facts.to_json()
    assert json.loads(facts.to_json())["permille"] is None


def test_facts_read_back() -> None:
    assert NodeFacts.of(annotated(FACTS.to_json())) == FACTS


@pytest.mark.parametrize("text", [None, 5, "not json", "[1]", '"s"', "{" * 10_000,
                                  json.dumps({"permille": 1, "pad": "x" * 5000})])
def test_facts_unreadable_are_none(text: Any) -> None:
    assert NodeFacts.of(annotated(text)) is None
    assert NodeFacts.of({}) is None


def test_facts_fields_of_the_wrong_type_read_as_absent() -> None:
    facts = NodeFacts.of(annotated(json.dumps({
        "permille": True, "swapBytes": "3", "diskBytes": 1.5, "zramBytes": None,
        "memoryBytes": [1], "swapBehavior": 5, "behaviorSource": None, "zswap": "true",
        "declaredPermille": False})))
    assert facts == NodeFacts(None, 0, 0, 0, 0, None, None, "", False, None)


@settings(max_examples=200, deadline=None)
@given(st.builds(NodeFacts,
                 st.none() | st.integers(-MAX_INT64 - 1, MAX_INT64), st.integers(0, 1 << 50),
                 st.integers(0, 1 << 50), st.integers(0, 1 << 50), st.integers(0, 1 << 50),
                 st.none() | st.integers(1, 1 << 50),
                 st.none() | st.text(max_size=40), st.sampled_from(["declared", "kubelet"]),
                 st.booleans(), st.none() | st.integers(-MAX_INT64 - 1, MAX_INT64)))
def test_facts_round_trip(facts: NodeFacts) -> None:
    assert NodeFacts.of(annotated(facts.to_json())) == facts

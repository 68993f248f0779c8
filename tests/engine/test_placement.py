"""docs/rules.md: node affinity and tolerations (engine/placement.py)."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.engine_check import apply
from testkit.engine_tables import (
    BACKED_2GI,
    DEFAULT,
    NO_MARKS,
    PREFERRED,
    REQUIRED,
    SWAP,
    SWAP_EXPR,
    memory,
    profile,
    terms,
)
from testkit.pods import container, guaranteed, pod
from webhook.engine import mutate_pod


def test_required_placement_created_from_nothing() -> None:
    result, _ = apply(pod(guaranteed()), DEFAULT)
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, BACKED_2GI]}]


def test_every_required_term_gets_the_expression() -> None:
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    affinity = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [
        {"matchExpressions": [zone]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
        {"matchExpressions": [SWAP_EXPR]},
    ]}}, "podAntiAffinity": {}}
    result, _ = apply(pod(guaranteed(), affinity=affinity), DEFAULT)
    t = terms(result)
    assert t[0]["matchExpressions"] == [zone, SWAP_EXPR, *NO_MARKS, BACKED_2GI]
    assert t[1]["matchExpressions"] == [SWAP_EXPR, *NO_MARKS, BACKED_2GI]
    assert "matchFields" in t[1]
    assert t[2]["matchExpressions"] == [SWAP_EXPR, *NO_MARKS, BACKED_2GI]
    assert result["spec"]["affinity"]["podAntiAffinity"] == {}


def test_existing_preferred_affinity_kept_when_adding_required() -> None:
    preferred = [{"weight": 5, "preference": {"matchExpressions": [
        {"key": "x", "operator": "Exists"}]}}]
    result, _ = apply(pod(guaranteed(), affinity={"nodeAffinity": {PREFERRED: preferred}}),
                      DEFAULT)
    assert result["spec"]["affinity"]["nodeAffinity"][PREFERRED] == preferred
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, BACKED_2GI]}]


def test_multiple_node_selector_pairs_all_added() -> None:
    prof = profile(placement={"nodeSelector": {SWAP: "true", "pool": "swap"}})
    result, _ = apply(pod(guaranteed()), prof)
    assert terms(result) == [{"matchExpressions": [
        SWAP_EXPR, {"key": "pool", "operator": "In", "values": ["swap"]}, *NO_MARKS,
        BACKED_2GI]}]


def test_preferred_placement_added_once() -> None:
    prof = profile(placement={"mode": "preferred", "weight": 40})
    result, _ = apply(pod(guaranteed()), prof)
    assert result["spec"]["affinity"]["nodeAffinity"] == {
        PREFERRED: [{"weight": 40, "preference": {"matchExpressions": [SWAP_EXPR]}}]}


def test_preferred_appends_to_existing_terms() -> None:
    other = {"weight": 1, "preference": {"matchExpressions": [{"key": "x", "operator": "Exists"}]}}
    prof = profile(placement={"mode": "preferred"})
    result, _ = apply(pod(guaranteed(), affinity={"nodeAffinity": {PREFERRED: [other]}}), prof)
    assert result["spec"]["affinity"]["nodeAffinity"][PREFERRED] == [
        other, {"weight": 100, "preference": {"matchExpressions": [SWAP_EXPR]}}]


def test_placement_none() -> None:
    result, _ = apply(pod(guaranteed()), profile(placement={"mode": "none"}))
    assert "affinity" not in result["spec"]
    assert memory(result)["request"] == "683Mi"


def test_tolerations_appended_unless_equal_exists() -> None:
    swap_taint = {"key": "swap", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    other = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    prof = profile(placement={"tolerations": [swap_taint, other]})
    existing = [{"key": "swap", "value": "true", "effect": "NoSchedule"}]  # operator defaults
    result, _ = apply(pod(guaranteed(), tolerations=existing), prof)
    assert result["spec"]["tolerations"] == [*existing, other]
    fresh, _ = apply(pod(guaranteed()), prof)
    assert fresh["spec"]["tolerations"] == [swap_taint, other]


@pytest.mark.parametrize(
    "extra",
    [
        {"nodeName": "node-1"},
    ],
)
def test_no_placement_for_bound_pods(extra: dict[str, Any]) -> None:
    result, _ = apply(pod(guaranteed(), **extra), DEFAULT)
    assert "affinity" not in result["spec"]
    assert memory(result)["request"] == "683Mi"


def test_no_placement_for_daemonset_pods() -> None:
    p = pod(guaranteed())
    p["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "1",
         "controller": True}]
    result, _ = apply(p, DEFAULT)
    assert "affinity" not in result["spec"]
    assert memory(result)["request"] == "683Mi"
    template, _ = apply(pod(guaranteed()), DEFAULT, daemonset=True)
    assert "affinity" not in template["spec"]


def test_no_placement_when_nothing_can_swap() -> None:
    # BestEffort: no memory anywhere.
    assert mutate_pod(pod(container(cpu=None)), DEFAULT).patch == []


def test_pod_level_resources_keep_pod_guaranteed_so_no_placement() -> None:
    p = pod(guaranteed("1Gi"), resources={"requests": {"memory": "1Gi", "cpu": "500m"},
                                          "limits": {"memory": "1Gi", "cpu": "500m"}})
    result, _ = apply(p, DEFAULT)
    assert memory(result)["request"] == "342Mi"
    assert "affinity" not in result["spec"]
    assert result["spec"]["resources"] == p["spec"]["resources"]

"""docs/rules.md "The pressure marks": ``swapwise.io/memory-pressure DoesNotExist`` and
``swapwise.io/cpu-pressure DoesNotExist`` in every required term of a pod that gets required
placement.

The node agent labels a swap node under sustained memory or CPU pressure
``swapwise.io/memory-pressure: "true"`` or ``swapwise.io/cpu-pressure: "true"``; these entries
keep new reshaped pods off it. Every case runs through ``apply``: the
patch is applied with jsonpatch, nothing but memory, affinity, tolerations and annotations
changes, and a second pass over the result gives no patch at all. tests/e2e/
test_admission_policy.py replays these cases through the rendered admission policies on a
real API server.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from testkit.engine_check import apply
from testkit.engine_tables import (
    BACKED_2GI,
    CPU_PRESSURE,
    DEFAULT,
    NO_CPU_PRESSURE,
    NO_MARKS,
    NO_PRESSURE,
    PREFERRED,
    PRESSURE,
    REQUIRED,
    SWAP,
    SWAP_EXPR,
    profile,
    terms,
)
from testkit.pods import container, guaranteed, pod
from webhook.engine import mutate_pod
from webhook.engine.pressure import CPU_MARK, MARKS, MEMORY_MARK

TERMS = f"/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms"
ZONE = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
HOSTNAME = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
NO_BACKING = profile(placement={"swapBacking": "off"})
ELIGIBLE = container("app", request="64Mi", limit="2Gi")  # swap-eligible as it comes


def required(*term_list: Any) -> dict[str, Any]:
    return {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": list(term_list)}}}


def pressure_ops(mutation: Any) -> list[dict[str, Any]]:
    return [op for op in mutation.patch
            if PRESSURE in str(op.get("value")) or CPU_PRESSURE in str(op.get("value"))]


def test_the_entries_are_the_agents_marks_with_no_values_member() -> None:
    assert (MEMORY_MARK.key, CPU_MARK.key) == (PRESSURE, CPU_PRESSURE)
    assert [mark.key for mark in MARKS] == [PRESSURE, CPU_PRESSURE]
    result, _ = apply(pod(guaranteed()), DEFAULT)
    entries = terms(result)[0]["matchExpressions"][1:3]
    assert entries == [{"key": "swapwise.io/memory-pressure", "operator": "DoesNotExist"},
                       {"key": "swapwise.io/cpu-pressure", "operator": "DoesNotExist"}]
    assert all("values" not in entry for entry in entries)


# --------------------------------------------------------------------------- where it goes


def test_created_term_has_it_between_the_swap_label_and_the_backing_entry() -> None:
    result, mutation = apply(pod(guaranteed()), DEFAULT)
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, BACKED_2GI]}]
    assert len(pressure_ops(mutation)) == 1


def test_without_backing_it_comes_last() -> None:
    result, mutation = apply(pod(guaranteed()), NO_BACKING)
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS]}]
    assert mutation.warnings == ["swapwise: app memory request 2Gi -> 683Mi (limit 2Gi)"]


def test_every_user_term_gets_it_exactly_once() -> None:
    pool = {"key": "pool", "operator": "In", "values": ["swap"]}
    p = pod(guaranteed(), affinity=required(
        {"matchExpressions": [ZONE]}, HOSTNAME, {"matchExpressions": [SWAP_EXPR, pool]},
        {**HOSTNAME, "matchExpressions": [ZONE]}))
    result, mutation = apply(p, DEFAULT)
    assert terms(result) == [
        {"matchExpressions": [ZONE, SWAP_EXPR, *NO_MARKS, BACKED_2GI]},
        {**HOSTNAME, "matchExpressions": [SWAP_EXPR, *NO_MARKS, BACKED_2GI]},
        {"matchExpressions": [SWAP_EXPR, pool, *NO_MARKS, BACKED_2GI]},
        {**HOSTNAME, "matchExpressions": [ZONE, SWAP_EXPR, *NO_MARKS, BACKED_2GI]},
    ]
    # a term with expressions gets them appended one by one; one without, all at once
    assert [op for op in mutation.patch if op["path"].startswith(TERMS)] == [
        {"op": "add", "path": f"{TERMS}/0/matchExpressions/-", "value": SWAP_EXPR},
        {"op": "add", "path": f"{TERMS}/0/matchExpressions/-", "value": NO_PRESSURE},
        {"op": "add", "path": f"{TERMS}/0/matchExpressions/-", "value": NO_CPU_PRESSURE},
        {"op": "add", "path": f"{TERMS}/0/matchExpressions/-", "value": BACKED_2GI},
        {"op": "add", "path": f"{TERMS}/1/matchExpressions",
         "value": [SWAP_EXPR, *NO_MARKS, BACKED_2GI]},
        {"op": "add", "path": f"{TERMS}/2/matchExpressions/-", "value": NO_PRESSURE},
        {"op": "add", "path": f"{TERMS}/2/matchExpressions/-", "value": NO_CPU_PRESSURE},
        {"op": "add", "path": f"{TERMS}/2/matchExpressions/-", "value": BACKED_2GI},
        {"op": "add", "path": f"{TERMS}/3/matchExpressions/-", "value": SWAP_EXPR},
        {"op": "add", "path": f"{TERMS}/3/matchExpressions/-", "value": NO_PRESSURE},
        {"op": "add", "path": f"{TERMS}/3/matchExpressions/-", "value": NO_CPU_PRESSURE},
        {"op": "add", "path": f"{TERMS}/3/matchExpressions/-", "value": BACKED_2GI},
    ]


@pytest.mark.parametrize("backing", [True, False])
def test_null_and_empty_terms(backing: bool) -> None:
    p = pod(guaranteed(), affinity=required(None, {}, {"matchExpressions": None},
                                            {"matchExpressions": []}, HOSTNAME))
    result, _ = apply(p, DEFAULT if backing else NO_BACKING)
    want = [SWAP_EXPR, *NO_MARKS, BACKED_2GI] if backing else [SWAP_EXPR, *NO_MARKS]
    assert [t["matchExpressions"] for t in terms(result)] == [want] * 5
    assert terms(result)[4]["matchFields"] == HOSTNAME["matchFields"]


def test_affinity_objects_created_on_the_way() -> None:
    for affinity in ({}, {"podAntiAffinity": {}}, {"nodeAffinity": {}},
                     {"nodeAffinity": {PREFERRED: []}}, {"nodeAffinity": {REQUIRED: {}}},
                     required()):
        for prof, want in ((DEFAULT, [SWAP_EXPR, *NO_MARKS, BACKED_2GI]),
                           (NO_BACKING, [SWAP_EXPR, *NO_MARKS])):
            result, _ = apply(pod(guaranteed(), affinity=copy.deepcopy(affinity)), prof)
            assert terms(result) == [{"matchExpressions": want}], affinity


# --------------------------------------------------------------------------- already there


def test_present_in_a_term_is_not_added_again_there() -> None:
    p = pod(guaranteed(), affinity=required(
        {"matchExpressions": [*NO_MARKS, ZONE]}, {"matchExpressions": [ZONE]},
        {"matchExpressions": [SWAP_EXPR, *NO_MARKS]}))
    result, mutation = apply(p, DEFAULT)
    assert terms(result) == [
        {"matchExpressions": [*NO_MARKS, ZONE, SWAP_EXPR, BACKED_2GI]},
        {"matchExpressions": [ZONE, SWAP_EXPR, *NO_MARKS, BACKED_2GI]},
        {"matchExpressions": [SWAP_EXPR, *NO_MARKS, BACKED_2GI]},
    ]
    assert pressure_ops(mutation) == [
        {"op": "add", "path": f"{TERMS}/1/matchExpressions/-", "value": NO_PRESSURE},
        {"op": "add", "path": f"{TERMS}/1/matchExpressions/-", "value": NO_CPU_PRESSURE}]


def test_present_with_an_empty_values_list_counts_as_present() -> None:
    # the key and the operator decide; DoesNotExist takes no values (an empty list is one)
    present = [{**entry, "values": []} for entry in NO_MARKS]
    p = pod(guaranteed(), affinity=required({"matchExpressions": [SWAP_EXPR, *present]}))
    result, mutation = apply(p, NO_BACKING)
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *present]}]
    assert pressure_ops(mutation) == []


def test_everything_present_gives_no_patch_at_all() -> None:
    # a pod already swap-eligible, with every entry of its profile: nothing to do
    p = pod(ELIGIBLE, affinity=required({"matchExpressions": [SWAP_EXPR, *NO_MARKS]}))
    assert mutate_pod(p, DEFAULT).patch == []
    p = pod(ELIGIBLE, affinity=required({"matchExpressions": [*NO_MARKS]}))
    assert mutate_pod(p, profile(placement={"nodeSelector": {}})).patch == []


def test_only_the_missing_entries_are_added_to_a_pod_placed_before_the_marks() -> None:
    # reshaped by a swapwise without the marks (annotations, swap label, backing), reinvoked
    before, _ = apply(pod(guaranteed()), DEFAULT)
    del before["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"][0][
        "matchExpressions"][1:3]
    assert terms(before) == [{"matchExpressions": [SWAP_EXPR, BACKED_2GI]}]
    result, mutation = apply(before, DEFAULT)
    assert mutation.patch == [
        {"op": "add", "path": f"{TERMS}/0/matchExpressions/-", "value": NO_PRESSURE},
        {"op": "add", "path": f"{TERMS}/0/matchExpressions/-", "value": NO_CPU_PRESSURE}]
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, BACKED_2GI, *NO_MARKS]}]


@pytest.mark.parametrize(
    "theirs",
    [
        {"key": PRESSURE, "operator": "Exists"},
        {"key": PRESSURE, "operator": "In", "values": ["true"]},
        {"key": PRESSURE, "operator": "NotIn", "values": ["true"]},
        {"key": PRESSURE, "operator": "In", "values": ["false"]},
        {"key": "example.com/memory-pressure", "operator": "DoesNotExist"},
    ],
)
def test_other_entries_on_the_key_are_the_users_and_ours_is_added(
    theirs: dict[str, Any]
) -> None:
    p = pod(guaranteed(), affinity=required({"matchExpressions": [theirs]}))
    result, mutation = apply(p, DEFAULT)
    assert terms(result) == [{"matchExpressions": [theirs, SWAP_EXPR, *NO_MARKS,
                                                   BACKED_2GI]}]
    assert pressure_ops(mutation) == [
        {"op": "add", "path": f"{TERMS}/0/matchExpressions/-", "value": NO_PRESSURE},
        {"op": "add", "path": f"{TERMS}/0/matchExpressions/-", "value": NO_CPU_PRESSURE}]


# --------------------------------------------------------------------------- which pods


def test_empty_node_selector_still_gets_it() -> None:
    empty = profile(placement={"nodeSelector": {}})
    result, _ = apply(pod(guaranteed()), empty)
    assert terms(result) == [{"matchExpressions": [*NO_MARKS, BACKED_2GI]}]
    result, mutation = apply(pod(guaranteed()),
                             profile(placement={"nodeSelector": {}, "swapBacking": "off"}))
    assert terms(result) == [{"matchExpressions": [*NO_MARKS]}]
    assert mutation.warnings == ["swapwise: app memory request 2Gi -> 683Mi (limit 2Gi)"]
    result, _ = apply(pod(guaranteed(), affinity=required({"matchExpressions": [ZONE]}, {})),
                      empty)
    assert terms(result) == [{"matchExpressions": [ZONE, *NO_MARKS, BACKED_2GI]},
                             {"matchExpressions": [*NO_MARKS, BACKED_2GI]}]


@pytest.mark.parametrize("node_selector", [None, {}])
def test_already_eligible_pod_swapwise_did_not_change_gets_it(
    node_selector: dict[str, str] | None
) -> None:
    placement = {} if node_selector is None else {"nodeSelector": node_selector}
    result, mutation = apply(pod(ELIGIBLE), profile(placement=placement))
    want = [*NO_MARKS] if node_selector == {} else [SWAP_EXPR, *NO_MARKS]
    assert terms(result) == [{"matchExpressions": want}]
    assert mutation.changes == [] and mutation.warnings == []
    assert result["metadata"]["annotations"] == {"swapwise.io/profile": "p"}


@pytest.mark.parametrize("mode", ["preferred", "none"])
def test_not_with_preferred_or_none_placement(mode: str) -> None:
    own = required({"matchExpressions": [ZONE]})
    for p in (pod(guaranteed()), pod(ELIGIBLE), pod(guaranteed(), affinity=own)):
        for placement in ({"mode": mode}, {"mode": mode, "nodeSelector": {}}):
            result, mutation = apply(copy.deepcopy(p), profile(placement=placement))
            assert PRESSURE not in str(mutation.patch)
            assert PRESSURE not in str(result["spec"].get("affinity"))
    result, _ = apply(pod(guaranteed(), affinity=copy.deepcopy(own)),
                      profile(placement={"mode": mode}))
    assert terms(result) == [{"matchExpressions": [ZONE]}]  # the user's terms as they were
    # preferred: the swap label as a preference only
    if mode == "preferred":
        result, _ = apply(pod(guaranteed()), profile(placement={"mode": mode}))
        assert result["spec"]["affinity"] == {"nodeAffinity": {PREFERRED: [
            {"weight": 100, "preference": {"matchExpressions": [SWAP_EXPR]}}]}}


def test_not_for_pods_that_get_no_placement() -> None:
    daemon = pod(guaranteed())
    daemon["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "1",
         "controller": True}]
    for p in (pod(guaranteed(), nodeName="node-1"), daemon, pod(container(cpu=None)),
              pod(guaranteed(), labels={"swapwise.io/skip": "true"})):
        assert PRESSURE not in str(mutate_pod(p, DEFAULT).patch)


# --------------------------------------------------------------------------- reinvocation


@pytest.mark.parametrize("prof", [DEFAULT, NO_BACKING, profile(placement={"nodeSelector": {}})])
def test_second_pass_gives_no_patch(prof: Any) -> None:
    for p in (pod(guaranteed()), pod(ELIGIBLE),
              pod(guaranteed(), affinity=required({"matchExpressions": [ZONE]}, None, HOSTNAME))):
        result, _ = apply(p, prof)
        again = mutate_pod(result, prof)
        assert again.patch == [] and again.warnings == []
        assert all(t["matchExpressions"].count(entry) == 1
                   for t in terms(result) for entry in NO_MARKS)


def test_reinvoked_after_another_webhook_added_a_term() -> None:
    first, _ = apply(pod(guaranteed()), DEFAULT)
    first["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"].append(
        {"matchExpressions": [ZONE]})
    second, mutation = apply(first, DEFAULT)
    assert terms(second) == [
        {"matchExpressions": [SWAP_EXPR, *NO_MARKS, BACKED_2GI]},
        {"matchExpressions": [ZONE, SWAP_EXPR, *NO_MARKS]},  # nothing changed: no backing
    ]
    assert pressure_ops(mutation) == [
        {"op": "add", "path": f"{TERMS}/1/matchExpressions/-", "value": NO_PRESSURE},
        {"op": "add", "path": f"{TERMS}/1/matchExpressions/-", "value": NO_CPU_PRESSURE}]


def test_patch_applies_to_the_pod_as_sent() -> None:
    p = pod(guaranteed(), affinity=required(
        {"matchExpressions": [{"key": PRESSURE, "operator": "Exists"}, SWAP_EXPR]}, None,
        {"matchExpressions": [*NO_MARKS]}))
    mutation = mutate_pod(p, DEFAULT)
    result = jsonpatch.apply_patch(p, mutation.patch)
    assert terms(result) == [
        {"matchExpressions": [{"key": PRESSURE, "operator": "Exists"}, SWAP_EXPR, *NO_MARKS,
                              BACKED_2GI]},
        {"matchExpressions": [SWAP_EXPR, *NO_MARKS, BACKED_2GI]},
        {"matchExpressions": [*NO_MARKS, SWAP_EXPR, BACKED_2GI]},
    ]
    assert SWAP in str(result) and mutate_pod(result, DEFAULT).patch == []

"""docs/rules.md "Swap backing": the swap-permille expression in every required term.

The numbers are worked out by hand in the comments (need = ceil(1000 x (limit - request) ÷
request), the expression is ``Gt need - 1``), not with webhook.engine.backing, so a broken
rule fails here. Every case runs through ``apply``: the patch is applied with jsonpatch,
nothing but memory, affinity, tolerations and annotations changes, and a second pass over
the result gives no patch at all. tests/e2e/test_admission_policy.py replays these cases
through the rendered admission policies on a real API server.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from testkit.engine_check import apply
from testkit.engine_tables import (
    BACKED_2GI,
    DEFAULT,
    NO_MARKS,
    PERMILLE,
    PREFERRED,
    REQUIRED,
    SWAP,
    SWAP_EXPR,
    backing_warning,
    memory,
    profile,
    terms,
)
from testkit.pods import container, guaranteed, pod
from webhook.engine import mutate_pod

TERMS = f"/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms"
ZONE = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
HOSTNAME = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}


def gt(value: str) -> dict[str, Any]:
    return {"key": PERMILLE, "operator": "Gt", "values": [value]}


def required(*term_list: Any, **node_affinity: Any) -> dict[str, Any]:
    return {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": list(term_list)},
                             **node_affinity}}


def backing_ops(mutation: Any) -> list[dict[str, Any]]:
    return [op for op in mutation.patch if PERMILLE in str(op.get("value"))]


# --------------------------------------------------------------------------- the arithmetic


def test_worked_example_of_the_docs() -> None:
    # swapRatio 2, limit 256Mi: request ceilMi(256/3) = 86Mi; 1000 x 170 / 86 = 1976.7 -> 1977
    result, mutation = apply(pod(guaranteed("256Mi")), profile(swapRatio=2))
    assert memory(result) == {"request": "86Mi", "limit": "256Mi"}
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, gt("1976")]}]
    assert mutation.warnings[-1] == (
        "swapwise: needs nodes whose swap is >= 1977\u2030 of their RAM (node label "
        "swapwise.io/swap-permille, from the node agent)")
    assert mutation.warnings.count(mutation.warnings[-1]) == 1


def test_request_of_one_mebibyte() -> None:
    # minRequest 1Mi, limit 3Mi: request ceilMi(1Mi) = 1Mi; 1000 x 2Mi / 1Mi = 2000 exactly
    result, mutation = apply(pod(guaranteed("3Mi")), profile(minRequest="1Mi", swapRatio=2))
    assert memory(result) == {"request": "1Mi", "limit": "3Mi"}
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, gt("1999")]}]
    assert mutation.warnings[-1] == backing_warning(2000)


def test_limit_a_thousand_times_the_request() -> None:
    # requestRatio 0.001, limit 1000Mi: request 1Mi; 1000 x 999Mi / 1Mi = 999000
    result, mutation = apply(pod(guaranteed("1000Mi")),
                             profile(minRequest="1Mi", requestRatio=0.001))
    assert memory(result) == {"request": "1Mi", "limit": "1000Mi"}
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, gt("998999")]}]
    assert mutation.warnings[-1] == backing_warning(999000)
    assert len(mutation.warnings[-1]) <= 120


def test_need_rounds_up_to_the_next_permille() -> None:
    # limit 1001Mi, minRequest 1000Mi: 1000 x 1 / 1000 = 1 exactly; limit 1002Mi with
    # request 1000Mi: 2; a 1Mi excess over a 1001Mi request: 0.999 -> 1
    for limit, minimum, need in (("1001Mi", "1000Mi", 1), ("1002Mi", "1000Mi", 2),
                                 ("1002Mi", "1001Mi", 1)):
        result, _ = apply(pod(guaranteed(limit)), profile(minRequest=minimum))
        assert memory(result)["request"] == minimum
        assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS,
                                                       gt(str(need - 1))]}], limit


def test_exabyte_limits_are_exact() -> None:
    # 7Ei = 7 x 2^60 B; request ceilMi(7Ei / 3) = 2565527131478Mi = 2690150177416675328 B,
    # excess 5380300354831253504 B: 1000 x excess / request = 1999.99999999922 -> 2000.
    # 1000 x excess does not fit in 64 bits, and a double rounds the quotient to 2000.0:
    # the rendered CEL must still get exactly 2000.
    result, _ = apply(pod(guaranteed("7Ei")), profile(swapRatio=2))
    assert memory(result)["request"] == "2565527131478Mi"
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, gt("1999")]}]


def test_defaulted_limit_counts() -> None:
    # defaultLimit 1Gi: request 342Mi; 1000 x 682 / 342 = 1994.2 -> 1995
    result, mutation = apply(pod(container(cpu=None)), profile(defaultLimit="1Gi"))
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, gt("1994")]}]
    assert mutation.warnings[-1] == backing_warning(1995)


def test_raised_limit_of_a_vpa_managed_container_counts() -> None:
    # vpaPods raiseLimit: request 1Gi kept, limit raised to 3Gi: 1000 x 2Gi / 1Gi = 2000
    p = pod(guaranteed("1Gi"), annotations={
        "vpaObservedContainers": "app",
        "vpaUpdates": "Pod resources updated by v: container 0: memory request, memory limit"})
    result, mutation = apply(p, DEFAULT)
    assert memory(result) == {"request": "1Gi", "limit": "3Gi"}
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, gt("1999")]}]
    assert mutation.warnings[-1] == backing_warning(2000)


# --------------------------------------------------------------------------- which containers


def test_only_containers_changed_in_this_pass_count() -> None:
    # "left" is already swap-eligible: 1000 x (4096 - 64) / 64 = 63000, but swapwise did not
    # choose its request, so it is not counted; "app" (2Gi -> 683Mi) needs 1999.
    p = pod(container("left", request="64Mi", limit="4Gi"), guaranteed("2Gi"))
    result, mutation = apply(p, DEFAULT)
    assert memory(result, 0) == {"request": "64Mi", "limit": "4Gi"}
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, BACKED_2GI]}]
    assert mutation.warnings[-1] == backing_warning(1999)


def test_a_container_left_unchanged_by_a_too_high_target_does_not_count() -> None:
    # "small" (16Mi) keeps request == limit (target 16Mi is not below it): need 0 for it.
    p = pod(guaranteed("16Mi", name="small"), guaranteed("3Gi"))
    result, mutation = apply(p, DEFAULT)
    assert memory(result, 0) == {"request": "16Mi", "limit": "16Mi"}
    # 3Gi -> 1Gi: 2000
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, gt("1999")]}]
    assert mutation.warnings[0].startswith("swapwise: small memory left unchanged")


def test_init_container_can_hold_the_largest_need() -> None:
    # init 3Gi -> 1Gi: 2000; app 2Gi -> 683Mi: 1999
    p = pod(guaranteed("2Gi"), init=[guaranteed("3Gi", name="setup")])
    result, mutation = apply(p, DEFAULT)
    assert memory(result, 0, "initContainers")["request"] == "1Gi"
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, gt("1999")]}]
    assert mutation.warnings[-1] == backing_warning(2000)


def test_sidecar_counts_and_plain_init_container_alone_counts() -> None:
    # sidecar 1.5Gi -> 512Mi: 2000; app 4Gi -> 1366Mi: 1999
    sidecar = {**guaranteed("1.5Gi", name="proxy"), "restartPolicy": "Always"}
    result, _ = apply(pod(guaranteed("4Gi"), init=[sidecar]), DEFAULT)
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, gt("1999")]}]
    # only a plain init container changes (the app container is already eligible):
    # minRequest 64Mi, init 100Mi -> 64Mi: 1000 x 36 / 64 = 562.5 -> 563
    p = pod(container("app", request="64Mi", limit="4Gi"), init=[guaranteed("100Mi", "1", "i")])
    result, mutation = apply(p, profile(minRequest="64Mi"))
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, gt("562")]}]
    assert mutation.warnings[-1] == backing_warning(563)


# --------------------------------------------------------------------------- the user's terms


def test_several_own_terms_each_get_the_expression_after_the_swap_label() -> None:
    p = pod(guaranteed(), affinity=required(
        {"matchExpressions": [ZONE]}, HOSTNAME, {"matchExpressions": [SWAP_EXPR]},
        {"matchExpressions": [ZONE, SWAP_EXPR, gt("5000")]}))
    result, mutation = apply(p, DEFAULT)
    assert terms(result) == [
        {"matchExpressions": [ZONE, SWAP_EXPR, *NO_MARKS, BACKED_2GI]},
        {**HOSTNAME, "matchExpressions": [SWAP_EXPR, *NO_MARKS, BACKED_2GI]},
        {"matchExpressions": [SWAP_EXPR, *NO_MARKS, BACKED_2GI]},
        # a stricter backing entry is left alone; the pressure entry is appended after it
        {"matchExpressions": [ZONE, SWAP_EXPR, gt("5000"), *NO_MARKS]},
    ]
    assert [op["path"] for op in backing_ops(mutation)] == [
        f"{TERMS}/0/matchExpressions/-", f"{TERMS}/1/matchExpressions",
        f"{TERMS}/2/matchExpressions/-"]


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("1998", True),  # equal: already ours
        ("1999", True),  # higher: stricter, never loosened
        ("0001998", True),  # a decimal integer with leading zeros, equal
        ("9" * 25, True),  # beyond 64 bits, still a decimal integer: higher
        ("1997", False),  # lower: replaced
        ("0", False),
        ("000", False),
    ],
)
def test_an_earlier_gt_on_the_key_is_kept_when_it_implies_ours_else_replaced(
    value: str, kept: bool
) -> None:
    p = pod(guaranteed(), affinity=required({"matchExpressions": [gt(value), ZONE]}))
    result, mutation = apply(p, DEFAULT)
    ours = gt(value) if kept else BACKED_2GI
    assert terms(result) == [{"matchExpressions": [ours, ZONE, SWAP_EXPR, *NO_MARKS]}]
    if not kept:
        assert backing_ops(mutation) == [
            {"op": "replace", "path": f"{TERMS}/0/matchExpressions/0", "value": BACKED_2GI}]


@pytest.mark.parametrize(
    "theirs",
    [
        gt("abc"),
        gt("-5"),  # a Gt the label (never negative) always meets
        gt("+5000"),
        gt("1e4"),
        gt(" 5000"),
        gt("\u0665\u0660\u0660\u0660"),  # Arabic-Indic digits: not a decimal integer here
        {"key": PERMILLE, "operator": "Gt", "values": ["5000", "6000"]},
        {"key": PERMILLE, "operator": "Gt", "values": []},
        {"key": PERMILLE, "operator": "In", "values": ["1500", "5000"]},
        {"key": PERMILLE, "operator": "Lt", "values": ["3000"]},
        {"key": PERMILLE, "operator": "Exists"},
        {"key": "example.com/swap-permille", "operator": "Gt", "values": ["5000"]},
    ],
)
def test_other_entries_on_the_key_are_the_users_and_ours_is_added(
    theirs: dict[str, Any]
) -> None:
    p = pod(guaranteed(), affinity=required({"matchExpressions": [theirs]}))
    result, mutation = apply(p, DEFAULT)
    assert terms(result) == [{"matchExpressions": [theirs, SWAP_EXPR, *NO_MARKS,
                                                   BACKED_2GI]}]
    assert [op["op"] for op in backing_ops(mutation)] == ["add"]


def test_only_the_first_weaker_entry_is_replaced() -> None:
    p = pod(guaranteed(), affinity=required(
        {"matchExpressions": [SWAP_EXPR, gt("100"), ZONE, gt("200")]},
        {"matchExpressions": [gt("100"), gt("1998")]},  # one implies ours: term left alone
    ))
    result, mutation = apply(p, DEFAULT)
    assert terms(result) == [
        {"matchExpressions": [SWAP_EXPR, BACKED_2GI, ZONE, gt("200"), *NO_MARKS]},
        {"matchExpressions": [gt("100"), gt("1998"), SWAP_EXPR, *NO_MARKS]},
    ]
    assert backing_ops(mutation) == [
        {"op": "replace", "path": f"{TERMS}/0/matchExpressions/1", "value": BACKED_2GI}]


def test_null_and_empty_terms() -> None:
    p = pod(guaranteed(), affinity=required(None, {}, {"matchExpressions": None},
                                            {"matchExpressions": []}))
    result, _ = apply(p, DEFAULT)
    assert [t["matchExpressions"] for t in terms(result)] == \
        [[SWAP_EXPR, *NO_MARKS, BACKED_2GI]] * 4


def test_affinity_objects_created_on_the_way() -> None:
    for affinity in ({}, {"podAntiAffinity": {}}, {"nodeAffinity": {}},
                     {"nodeAffinity": {PREFERRED: []}}, {"nodeAffinity": {REQUIRED: {}}},
                     required()):
        result, _ = apply(pod(guaranteed(), affinity=copy.deepcopy(affinity)), DEFAULT)
        assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, BACKED_2GI]}], \
            affinity


# --------------------------------------------------------------------------- profile settings


def test_empty_node_selector_still_requires_backing() -> None:
    prof = profile(placement={"nodeSelector": {}})
    result, mutation = apply(pod(guaranteed()), prof)
    assert terms(result) == [{"matchExpressions": [*NO_MARKS, BACKED_2GI]}]
    assert mutation.warnings[-1] == backing_warning(1999)
    result, _ = apply(pod(guaranteed(), affinity=required({"matchExpressions": [ZONE]}, None)),
                      prof)
    assert terms(result) == [{"matchExpressions": [ZONE, *NO_MARKS, BACKED_2GI]},
                             {"matchExpressions": [*NO_MARKS, BACKED_2GI]}]
    # nothing changed: no backing and no swap label to require, the pressure entry only
    eligible = pod(container("app", request="64Mi", limit="2Gi"))
    result, mutation = apply(eligible, prof)
    assert terms(result) == [{"matchExpressions": [*NO_MARKS]}] and mutation.warnings == []


def test_swap_backing_off() -> None:
    prof = profile(placement={"swapBacking": "off"})
    result, mutation = apply(pod(guaranteed(), affinity=required(
        {"matchExpressions": [gt("100")]})), prof)
    assert terms(result) == [{"matchExpressions": [gt("100"), SWAP_EXPR, *NO_MARKS]}]
    assert mutation.warnings == ["swapwise: app memory request 2Gi -> 683Mi (limit 2Gi)"]


@pytest.mark.parametrize("mode", ["preferred", "none"])
def test_backing_only_with_required_placement(mode: str) -> None:
    result, mutation = apply(pod(guaranteed()), profile(placement={"mode": mode}))
    assert PERMILLE not in str(result["spec"].get("affinity"))
    assert not any("needs nodes" in w for w in mutation.warnings)


def test_no_backing_when_no_placement() -> None:
    for extra in ({"nodeName": "node-1"},
                  {"resources": {"requests": {"memory": "2Gi", "cpu": "500m"},  # Guaranteed
                                 "limits": {"memory": "2Gi", "cpu": "500m"}}}):
        result, mutation = apply(pod(guaranteed(), **extra), DEFAULT)
        assert memory(result)["request"] == "683Mi"
        assert "affinity" not in result["spec"]
        assert not any("needs nodes" in w for w in mutation.warnings)


def test_already_eligible_pod_gets_no_backing_entry() -> None:
    result, mutation = apply(pod(container("app", request="64Mi", limit="2Gi")), DEFAULT)
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS]}]
    assert mutation.warnings == []


def test_namespace_override_turns_backing_off() -> None:
    from webhook.policy import build_policy
    policy = build_policy({"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                           "profiles": {"p": {}},
                           "namespaces": {"legacy": {"placement": {"swapBacking": "off"}}}})
    on, off = policy.resolve("p", "other"), policy.resolve("p", "legacy")
    assert on is not None and off is not None
    assert PERMILLE in str(mutate_pod(pod(guaranteed()), on).patch)
    assert PERMILLE not in str(mutate_pod(pod(guaranteed()), off).patch)


# --------------------------------------------------------------------------- reinvocation


def test_second_pass_gives_no_patch() -> None:
    result, _ = apply(pod(guaranteed(), init=[guaranteed("3Gi", name="setup")]), DEFAULT)
    again = mutate_pod(result, DEFAULT)
    assert again.patch == [] and again.warnings == []


def test_reinvoked_after_another_webhook_added_a_container() -> None:
    # Pass 1 reshaped a 32Mi container (need 1000: Gt 999); then another webhook added a
    # 2Gi one. Pass 2 counts only the new change (1999) and replaces the weaker entry.
    first, _ = apply(pod(guaranteed("32Mi", name="small")), DEFAULT)
    assert terms(first) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, gt("999")]}]
    first["spec"]["containers"].append(guaranteed("2Gi", name="added"))
    second, mutation = apply(first, DEFAULT)
    assert terms(second) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, BACKED_2GI]}]
    assert backing_ops(mutation) == [
        {"op": "replace", "path": f"{TERMS}/0/matchExpressions/3", "value": BACKED_2GI}]
    # The other way round: the stricter entry of pass 1 stays.
    first, _ = apply(pod(guaranteed("2Gi")), DEFAULT)
    first["spec"]["containers"].append(guaranteed("32Mi", name="added"))
    second, mutation = apply(first, DEFAULT)
    assert terms(second) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, BACKED_2GI]}]
    assert backing_ops(mutation) == []
    assert mutation.warnings[-1] == backing_warning(1000)


def test_patch_applies_to_the_pod_as_sent() -> None:
    p = pod(guaranteed(), affinity=required({"matchExpressions": [gt("7"), SWAP_EXPR]},
                                            {"matchExpressions": [ZONE]}))
    mutation = mutate_pod(p, DEFAULT)
    result = jsonpatch.apply_patch(p, mutation.patch)
    assert terms(result) == [{"matchExpressions": [BACKED_2GI, SWAP_EXPR, *NO_MARKS]},
                             {"matchExpressions": [ZONE, SWAP_EXPR, *NO_MARKS, BACKED_2GI]}]
    assert SWAP in str(result)

"""The audit's autoscaling checks (webhook.analysis.provisioning, docs/autoscaling.md):
reshaped pods that no node and no Karpenter NodePool can take, a declared per-mille the node
agent found overstated, and swap that a NoSwap kubelet does not give.

The same against Karpenter itself: tests/e2e/test_autoscaling.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonpatch
import pytest

from webhook.analysis.audit import Cluster, Finding, audit
from webhook.analysis.provisioning import (
    Expression,
    NodeTemplate,
    nodepool_templates,
    required_terms,
    swapwise_keys,
    unplaceable,
)
from webhook.base.kubeapi import KubeError, NotServed
from webhook.cli.audit_cmd import _nodepools
from webhook.engine import mutate_pod
from webhook.policy import Policy, default_policy, parse_policy
from webhook.profile import SWAP_LABEL

GI = 1024**3
SWAP_NODE = "swapwise.io/swap-node"
PERMILLE = "swapwise.io/swap-permille"
FACTS = "swapwise.io/node-facts"
POLICY: Policy = default_policy()  # placement on swapwise.io/swap-node, the node agent's label
LABEL = (SWAP_LABEL, "true")


def namespace(name: str = "team") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"swapwise.io/profile": "default"}}}


def reshaped(name: str, limit: str = "2Gi", owner: str | None = None,
             **status: Any) -> dict[str, Any]:
    """A Guaranteed pod reshaped by the real engine (need 1999 for 2Gi), Pending unbound
    unless ``status`` says otherwise."""
    pod: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"containers": [{"name": "app", "image": "x", "resources": {
            "requests": {"memory": limit}, "limits": {"memory": limit}}}]},
        "status": {"phase": "Pending", **status},
    }
    if owner:
        pod["metadata"]["ownerReferences"] = [
            {"kind": "ReplicaSet", "name": owner, "controller": True}]
    result: dict[str, Any] = jsonpatch.apply_patch(
        pod, mutate_pod(pod, POLICY.profiles["default"]).patch)
    return result


def node(name: str, labels: dict[str, str] | None = None, swap: int | None = None,
         facts: dict[str, Any] | str | None = None) -> dict[str, Any]:
    annotations = {} if facts is None else {
        FACTS: facts if isinstance(facts, str) else json.dumps(facts)}
    info = {} if swap is None else {"swap": {"capacity": swap}}
    return {"metadata": {"name": name, "labels": dict(labels or {}),
                         "annotations": annotations},
            "status": {"nodeInfo": info, "capacity": {"memory": "16Gi"}}}


def nodepool(name: str, labels: dict[str, str] | None = None,
             requirements: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
            "spec": {"template": {"metadata": {"labels": dict(labels or {})},
                                  "spec": {"requirements": list(requirements or [])}}}}


SWAP_POOL = nodepool("swap", {SWAP_NODE: "true", PERMILLE: "2000"})


def run(pods: list[dict[str, Any]], nodes: list[dict[str, Any]] | None = None,
        nodepools: list[dict[str, Any]] | None = None) -> list[Finding]:
    report = audit(Cluster(namespaces=[namespace()], nodes=nodes or [], pods=pods,
                           nodepools=nodepools), POLICY, LABEL)
    return report.findings


def of(findings: list[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]


# -- the deadlock ---------------------------------------------------------------------------


def test_no_node_and_no_nodepool_api_names_both_labels_and_the_autoscaler_templates() -> None:
    [finding] = of(run([reshaped("a")]), "reshaped-pods-unplaceable")
    assert (finding.namespace, finding.object, finding.action) == ("team", "Pod/a", True)
    assert finding.details["missing"] == [
        f"{SWAP_NODE}=true", f"{PERMILLE} > 1998 (>= 1999)"]
    assert finding.details["nodePoolsServed"] is False
    assert f"no node has {SWAP_NODE}=true and {PERMILLE} > 1998 (>= 1999)" in finding.message
    assert "cluster-autoscaler" in finding.message and "--node-labels" in finding.message


def test_a_nodepool_without_the_labels_is_named_and_one_with_them_clears_it() -> None:
    plain = nodepool("general", requirements=[
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}])
    findings = run([reshaped("a")], nodepools=[plain])
    [finding] = of(findings, "reshaped-pods-unplaceable")
    assert finding.details["nodePools"] == ["general"]
    assert "NodePool(s) general do not declare them" in finding.message
    # No node carries the per-mille yet: the cluster-wide finding says so too.
    assert of(findings, "no-swap-permille-label")

    findings = run([reshaped("a")], nodepools=[plain, SWAP_POOL])
    assert of(findings, "reshaped-pods-unplaceable") == []
    # A NodePool that declares the per-mille makes nodes that carry it: not that finding.
    assert of(findings, "no-swap-permille-label") == []


def test_a_nodepool_whose_permille_is_too_low_misses_only_the_permille() -> None:
    low = nodepool("small-swap", {SWAP_NODE: "true", PERMILLE: "1000"})
    [finding] = of(run([reshaped("a")], nodepools=[low]), "reshaped-pods-unplaceable")
    assert finding.details["missing"] == [f"{PERMILLE} > 1998 (>= 1999)"]
    assert finding.details["eachProvidedSomewhere"] is False
    # A larger need is not met by a pool that backs a 2Gi pod either.
    findings = run([reshaped("a")], nodepools=[nodepool("p", {SWAP_NODE: "true",
                                                              PERMILLE: "1999"})])
    assert of(findings, "reshaped-pods-unplaceable") == []


@pytest.mark.parametrize(("requirement", "stuck"), [
    ({"key": PERMILLE, "operator": "In", "values": ["1500", "2000"]}, False),
    ({"key": PERMILLE, "operator": "In", "values": ["1500"]}, True),
    ({"key": PERMILLE, "operator": "Gt", "values": ["2500"]}, False),
    ({"key": PERMILLE, "operator": "Lt", "values": ["1999"]}, True),
    ({"key": PERMILLE, "operator": "Lt", "values": ["3000"]}, False),
    ({"key": PERMILLE, "operator": "Exists"}, False),
    ({"key": PERMILLE, "operator": "DoesNotExist"}, True),
])
def test_nodepool_requirements_are_judged_as_karpenter_intersects_them(
    requirement: dict[str, Any], stuck: bool,
) -> None:
    pool = nodepool("p", {SWAP_NODE: "true"}, [requirement])
    assert bool(of(run([reshaped("a")], nodepools=[pool]), "reshaped-pods-unplaceable")) is stuck


def test_an_existing_node_with_the_labels_is_no_deadlock_even_when_marked_or_full() -> None:
    marked = node("n", {SWAP_NODE: "true", PERMILLE: "2000",
                        "swapwise.io/memory-pressure": "true"}, swap=32 * GI)
    assert of(run([reshaped("a")], [marked]), "reshaped-pods-unplaceable") == []


def test_labels_provided_only_apart_are_all_named() -> None:
    """A node with the swap label but too little swap, a pool with the per-mille but not the
    swap label: each expression is met somewhere, none has both."""
    nodes = [node("n", {SWAP_NODE: "true", PERMILLE: "500"}, swap=8 * GI)]
    pools = [nodepool("p", {PERMILLE: "3000"})]
    [finding] = of(run([reshaped("a")], nodes, pools), "reshaped-pods-unplaceable")
    assert finding.details["eachProvidedSomewhere"] is True
    assert len(finding.details["missing"]) == 2
    assert "has all of" in finding.message


def test_one_finding_per_workload_and_only_pending_unbound_reshaped_pods() -> None:
    pods = [reshaped(f"web-{i}", owner="web-abc") for i in range(3)]
    pods.append(reshaped("bound"))
    pods[-1]["spec"]["nodeName"] = "somewhere"
    pods.append(reshaped("running", phase="Running"))
    pods.append(reshaped("big", limit="3Gi"))  # need 2000: its own finding
    replicaset = {"metadata": {"name": "web-abc", "namespace": "team", "ownerReferences": [
        {"kind": "Deployment", "name": "web", "controller": True}]}}
    report = audit(Cluster(namespaces=[namespace()], pods=pods, replicasets=[replicaset],
                           nodepools=[]), POLICY, LABEL)
    found = {(f.owner, f.object): f.details for f in of(report.findings,
                                                        "reshaped-pods-unplaceable")}
    assert set(found) == {("Deployment/web", "Pod/web-0"), (None, "Pod/big")}
    assert found[("Deployment/web", "Pod/web-0")]["pods"] == ["web-0", "web-1", "web-2"]
    assert found[(None, "Pod/big")]["missing"][-1] == f"{PERMILLE} > 1999 (>= 2000)"


def test_pods_without_required_placement_are_not_judged() -> None:
    preferred = parse_policy("""\
apiVersion: swapwise.io/v1alpha1
kind: SwapPolicy
profiles:
  default: {placement: {mode: preferred}}
""")
    pod = {"metadata": {"name": "a", "namespace": "team"},
           "spec": {"containers": [{"name": "app", "image": "x",
                                    "resources": {"limits": {"memory": "2Gi"}}}]},
           "status": {"phase": "Pending"}}
    pod = jsonpatch.apply_patch(pod, mutate_pod(pod, preferred.profiles["default"]).patch)
    report = audit(Cluster(namespaces=[namespace()], pods=[pod]), preferred, LABEL)
    assert of(report.findings, "reshaped-pods-unplaceable") == []


def test_unreadable_nodepools_are_said_and_the_check_goes_on() -> None:
    report = audit(Cluster(namespaces=[namespace()], pods=[reshaped("a")], nodepools=None,
                           nodepools_problem="forbidden"), POLICY, LABEL)
    assert any(s.startswith("NodePools (karpenter.sh/v1): forbidden") for s in report.skipped)
    assert of(report.findings, "reshaped-pods-unplaceable")


def test_terms_expressions_and_templates() -> None:
    keys = swapwise_keys(((SWAP_NODE, "true"),))
    pod: dict[str, Any] = {"spec": {"nodeSelector": {SWAP_NODE: "true", "zone": "a"}, "affinity": {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": PERMILLE, "operator": "Gt", "values": ["1998"]},
                {"key": "swapwise.io/memory-pressure", "operator": "DoesNotExist"},
                {"key": "zone", "operator": "In", "values": ["a"]}]}]}}}}}
    assert required_terms(pod, keys) == [[Expression(SWAP_NODE, "In", ("true",)),
                                          Expression(PERMILLE, "Gt", ("1998",))]]
    # A term without swapwise's expressions lets the pod go anywhere: nothing to judge.
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"].append({"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["b"]}]})
    pod["spec"].pop("nodeSelector")
    assert required_terms(pod, keys) == []

    gt = Expression(PERMILLE, "Gt", ("1998",))
    assert [gt.matches(v) for v in ("1999", "1998", "x", None, " 2000")] == [
        True, False, False, False, False]
    assert Expression(SWAP_NODE, "Exists").text() == f"{SWAP_NODE} (any value)"
    # Karpenter denies a custom label a template does not define.
    assert not NodeTemplate("NodePool", "p").offers(gt)
    assert unplaceable([], [], []) is None
    [template] = nodepool_templates([{"metadata": {"name": 3}, "spec": {"template": {
        "metadata": {"labels": {PERMILLE: 2000, SWAP_NODE: "true"}},
        "spec": {"requirements": ["junk", {"key": PERMILLE, "operator": "In",
                                           "values": ["2000", 7]}]}}}}])
    assert template.name == "?" and dict(template.labels) == {SWAP_NODE: "true"}
    assert template.requirements == ((PERMILLE, "In", ("2000",)),)


# -- what the node agent measured -----------------------------------------------------------


def test_a_declared_permille_above_the_measured_one_is_reported() -> None:
    over = node("over", {SWAP_NODE: "true", PERMILLE: "1987"}, 32 * GI,
                {"permille": 1987, "declaredPermille": 2000, "swapBehavior": "LimitedSwap"})
    under = node("under", {SWAP_NODE: "true", PERMILLE: "2084"}, 32 * GI,
                 {"permille": 2084, "declaredPermille": 2000, "swapBehavior": "LimitedSwap"})
    junk = node("junk", {SWAP_NODE: "true", PERMILLE: "2000"}, 32 * GI, "{not json")
    [finding] = of(run([], [over, under, junk]), "node-permille-overstated")
    assert (finding.object, finding.action) == ("Node/over", True)
    assert finding.details == {"declaredPermille": 2000, "measuredPermille": 1987,
                               "label": "1987"}


def test_swap_a_noswap_kubelet_does_not_give_is_reported_once() -> None:
    """AKS today: swap capacity, kubelet NoSwap. From the agent's facts or the declared
    label; information unless the node is labelled a swap node anyway."""
    from_facts = node("aks", {}, 8 * GI, {"permille": 500, "swapBehavior": "NoSwap"})
    declared = node("declared", {"swapwise.io/swap-behavior": "NoSwap"}, 8 * GI)
    liar = node("liar", {SWAP_NODE: "true", "swapwise.io/swap-behavior": "NoSwap"}, 8 * GI)
    findings = run([], [from_facts, declared, liar])
    assert [(f.check, f.object, f.action) for f in findings if f.object != "Node/*"] == [
        ("node-swap-noswap", "Node/aks", False),
        ("node-swap-noswap", "Node/declared", False),
        ("node-swap-noswap", "Node/liar", True),
    ]
    assert "Azure/AKS#4352" in findings[0].message


# -- reading NodePools ------------------------------------------------------------------------


def _refused(code: int) -> KubeError:
    """What webhook/base/kubeapi.py's paged list raises for an HTTP status."""
    return NotServed("not served", code) if code == 404 else KubeError(f"HTTP {code}", code)


@pytest.mark.parametrize(("code", "expected"), [
    (404, {"nodepools": None}),
    (403, {"nodepools": None, "nodepools_problem": "forbidden (list nodepools in "
           "karpenter.sh: docs/audit.md has the ClusterRole)"}),
])
def test_nodepools_not_served_or_forbidden(code: int, expected: dict[str, Any]) -> None:
    async def listing(kind: Any) -> list[dict[str, Any]]:
        raise _refused(code)

    assert asyncio.run(_nodepools(listing)) == expected


def test_nodepools_other_errors_are_not_swallowed() -> None:
    async def listing(kind: Any) -> list[dict[str, Any]]:
        raise _refused(500)

    with pytest.raises(KubeError, match="HTTP 500"):
        asyncio.run(_nodepools(listing))

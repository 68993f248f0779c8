"""The audit's pure decisions (webhook.audit): objects in, findings out.

The whole command against a real API server is tests/e2e/test_audit.py; here the edges.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonpatch

from tests.test_cli import swapwise
from webhook.audit import Cluster, Finding, audit, original_pod
from webhook.engine import mutate_pod
from webhook.policy import build_policy, default_policy, parse_policy

GI, MI = 1024**3, 1024**2
SWAP = "feature.node.kubernetes.io/memory-swap"


def ns(name: str, profile: str | None = "default") -> dict[str, Any]:
    labels = {"swapwise.io/profile": profile} if profile else {}
    return {"metadata": {"name": name, "labels": labels}}


def pod(name: str, namespace: str = "team", limit: str = "2Gi", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "app", "image": "x",
                                     "resources": {"limits": {"memory": limit}}}], **spec},
            "status": {"phase": "Running"}}


def reshaped(p: dict[str, Any]) -> dict[str, Any]:
    mutation = mutate_pod(p, default_policy().profiles["default"])
    result: dict[str, Any] = jsonpatch.apply_patch(p, mutation.patch)
    return result


def node(name: str, labelled: bool, swap: int | None) -> dict[str, Any]:
    info: dict[str, Any] = {} if swap is None else {"swap": {"capacity": swap}}
    return {"metadata": {"name": name, "labels": {SWAP: "true"} if labelled else {}},
            "status": {"nodeInfo": info}}


def checks(findings: list[Finding]) -> list[tuple[str, str, bool]]:
    return [(f.check, f.object, f.action) for f in findings]


def test_a_reshaped_pod_is_in_shape_and_the_original_is_recoverable() -> None:
    before = pod("a", nodeName="n")
    after = reshaped(before)
    assert after["spec"]["containers"][0]["resources"]["requests"] == {"memory": "683Mi"}
    restored = original_pod(after)
    assert restored is not None
    assert restored["spec"]["containers"][0]["resources"] == {
        "requests": {"memory": "2Gi"}, "limits": {"memory": "2Gi"}}
    report = audit(Cluster(namespaces=[ns("team")], nodes=[node("n", True, GI)],
                           pods=[after]), default_policy())
    assert report.findings == [] and not report.needs_action


def test_finished_pods_excluded_namespaces_and_unopted_ones_are_not_audited() -> None:
    done = pod("done")
    done["status"]["phase"] = "Succeeded"
    report = audit(Cluster(
        namespaces=[ns("team"), ns("kube-system"), ns("other", None)],
        pods=[done, pod("sys", "kube-system"), pod("o", "other")],
    ), default_policy())
    assert report.findings == []
    assert report.namespaces == {"team": "default"}


def test_pod_owner_is_resolved_through_its_replicaset() -> None:
    p = pod("web-abc-1")
    p["metadata"]["ownerReferences"] = [
        {"kind": "ReplicaSet", "name": "web-abc", "controller": True}]
    rs = {"metadata": {"name": "web-abc", "namespace": "team", "ownerReferences": [
        {"kind": "Deployment", "name": "web", "controller": True}]}}
    report = audit(Cluster(namespaces=[ns("team")], pods=[p], replicasets=[rs]),
                   default_policy())
    [finding] = report.findings
    assert (finding.check, finding.owner) == ("pod-not-reshaped", "Deployment/web")
    assert report.needs_action


def test_reshaped_pods_on_nodes_without_swap() -> None:
    pods = [reshaped(pod(f"p{i}", nodeName=f"n{i}")) for i in range(4)]
    nodes = [node("n0", True, 0), node("n1", False, GI), node("n2", True, GI)]  # n3 gone
    report = audit(Cluster(namespaces=[ns("team")], nodes=nodes, pods=pods), default_policy())
    reasons = {f.object: f.details["reasons"] for f in report.findings
               if f.check == "reshaped-pod-without-swap"}
    assert reasons == {
        "Pod/p0": ["the node reports swap capacity 0"],
        "Pod/p1": [f"the node has no label {SWAP}=true"],
        "Pod/p3": ["the node is gone"],
    }
    assert sorted(checks([f for f in report.findings if f.object.startswith("Node/")])) == [
        ("node-labelled-without-swap", "Node/n0", True),
        ("node-swap-unlabelled", "Node/n1", True),
    ]


def test_hpa_on_a_reshaped_workload_uses_the_recorded_original() -> None:
    p = reshaped(pod("web-1"))
    p["metadata"]["ownerReferences"] = [{"kind": "StatefulSet", "name": "web"}]
    hpa = {"metadata": {"name": "web", "namespace": "team"},
           "spec": {"scaleTargetRef": {"kind": "StatefulSet", "name": "web"}, "metrics": [
               {"type": "Resource", "resource": {"name": "memory", "target": {
                   "type": "Utilization", "averageUtilization": 90}}}]}}
    report = audit(Cluster(namespaces=[ns("team")], pods=[p], hpas=[hpa]), default_policy())
    [finding] = [f for f in report.findings if f.check == "hpa-memory-utilisation"]
    assert finding.details["requestBefore"] == 2 * GI
    assert finding.details["requestAfter"] == 683 * MI
    assert finding.details["suggestedAverageUtilization"] == 270


def test_vpa_off_is_information_and_a_missing_api_is_said() -> None:
    p = reshaped(pod("web-1"))
    p["metadata"]["ownerReferences"] = [{"kind": "StatefulSet", "name": "web"}]
    vpa = {"metadata": {"name": "v", "namespace": "team"},
           "spec": {"targetRef": {"kind": "StatefulSet", "name": "web"},
                    "updatePolicy": {"updateMode": "Off"}}}
    report = audit(Cluster(namespaces=[ns("team")], pods=[p], vpas=[vpa]), default_policy())
    assert checks(report.findings) == [("vpa", "VerticalPodAutoscaler/v", False)]
    assert report.skipped == [] and not report.needs_action
    vpa["spec"]["updatePolicy"] = {}  # default mode: Auto, which evicts
    skip_policy = build_policy({"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                                "profiles": {"default": {"vpaPods": "skip"}}})
    report = audit(Cluster(namespaces=[ns("team")], pods=[p], vpas=[vpa]), skip_policy)
    assert checks(report.findings) == [("vpa", "VerticalPodAutoscaler/v", True)]
    assert "vpaPods: skip" in report.findings[0].message
    # The default, raiseLimit, gives the same pods in either webhook order: information.
    report = audit(Cluster(namespaces=[ns("team")], pods=[p], vpas=[vpa]), default_policy())
    assert checks(report.findings) == [("vpa", "VerticalPodAutoscaler/v", False)]
    assert "in either webhook order" in report.findings[0].message
    report = audit(Cluster(namespaces=[ns("team")], pods=[p]), default_policy())
    assert report.skipped == ["vpa: the autoscaling.k8s.io API is not served by this cluster"]


def limitrange(**item: Any) -> dict[str, Any]:
    return {"metadata": {"name": "lr", "namespace": "team"},
            "spec": {"limits": [{"type": "Container", **item}]}}


POLICY = """\
apiVersion: swapwise.io/v1alpha1
kind: SwapPolicy
profiles:
  default: {}
  capped: {maxLimitRequestRatio: 2, minRequest: 256Mi, defaultLimit: 4Gi}
"""


def test_limitranges_against_the_profile() -> None:
    policy = parse_policy(POLICY)
    lrs = [limitrange(maxLimitRequestRatio={"memory": "2"}, min={"memory": "256Mi"},
                      max={"memory": "2Gi"})]
    report = audit(Cluster(namespaces=[ns("team")], limitranges=lrs), policy)
    details = [f.details for f in report.findings]
    # default profile: ratio 3 > 2 and minRequest 16Mi < 256Mi; no defaultLimit, so max is fine
    assert details == [{"maxLimitRequestRatio": 2.0, "profileRatio": 3.0},
                       {"min": 256 * MI, "minRequest": 16 * MI}]
    report = audit(Cluster(namespaces=[ns("team", "capped")], limitranges=lrs), policy)
    # capped: its maxLimitRequestRatio and minRequest already comply; defaultLimit 4Gi > max
    assert [f.details for f in report.findings] == [{"max": 2 * GI, "defaultLimit": 4 * GI}]


def test_quota_refusing_default_limits_and_limits_quota_nearly_full() -> None:
    policy = parse_policy(POLICY)
    bare = {"metadata": {"name": "bare", "namespace": "team"},
            "spec": {"containers": [{"name": "app", "image": "x"}]}}
    quotas = [
        {"metadata": {"name": "tight", "namespace": "team"},
         "spec": {"hard": {"limits.memory": "3Gi", "requests.memory": "1Gi"}},
         "status": {"used": {"limits.memory": "0", "requests.memory": "0"}}},
        {"metadata": {"name": "full", "namespace": "other"},
         "spec": {"hard": {"limits.memory": "10Gi"}},
         "status": {"used": {"limits.memory": "9500Mi"}}},
    ]
    report = audit(Cluster(namespaces=[ns("team", "capped"), ns("other")], pods=[bare],
                           quotas=quotas), policy)
    found = [(f.object, f.details["resource"], f.action) for f in report.findings
             if f.check == "resourcequota"]
    # bare gets limit 4Gi (> 3Gi) and request 2Gi (> 1Gi: ratio 2 caps it)
    assert found == [("ResourceQuota/tight", "requests.memory", True),
                     ("ResourceQuota/tight", "limits.memory", True),
                     ("ResourceQuota/full", "limits.memory", False)]


def test_unknown_profile_and_json_shape() -> None:
    report = audit(Cluster(namespaces=[ns("team", "nope")]), default_policy())
    assert checks(report.findings) == [("unknown-profile", "Namespace/team", True)]
    document = json.loads(json.dumps(report.to_json()))
    assert document["needsAction"] is True
    assert document["findings"][0]["check"] == "unknown-profile"


def test_noswap_declared_nodes_are_information() -> None:
    n = node("n", False, GI)
    n["metadata"]["labels"]["swapwise.io/swap-behavior"] = "NoSwap"
    report = audit(Cluster(nodes=[n]), default_policy())
    assert checks(report.findings) == [("node-swap-unlabelled", "Node/n", False)]
    assert not report.needs_action


def test_a_pending_pod_without_placement_is_not_in_shape() -> None:
    """Already swap-eligible (request < limit) but created before the opt-in: the engine
    would still add the swap-node affinity."""
    p = pod("pending")
    p["spec"]["containers"][0]["resources"]["requests"] = {"memory": "512Mi"}
    report = audit(Cluster(namespaces=[ns("team")], pods=[p]), default_policy())
    [finding] = report.findings
    assert finding.check == "pod-not-reshaped"
    assert "no memory change: node placement or annotations missing" in finding.message


def test_cli_without_a_reachable_cluster_exits_2(tmp_path: Path) -> None:
    out = swapwise("audit", "--kubeconfig", str(tmp_path / "missing"))
    assert out.returncode == 2
    assert out.stderr.startswith("swapwise: audit: cannot read the cluster:")
    bad = swapwise("audit", "--label", "novalue")
    assert bad.returncode == 1 and "expected key=value" in bad.stderr

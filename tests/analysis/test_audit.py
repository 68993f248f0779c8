"""The audit's pure decisions (webhook.analysis.audit): objects in, findings out.

The whole command against a real API server is tests/e2e/test_audit.py; here the edges.
"""

from __future__ import annotations

import json
import subprocess
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from testkit import fake_upstream as fake
from tests.cli.test_cli import swapwise
from webhook.analysis.audit import Cluster, Finding, audit, label_permille
from webhook.cli import build_parser
from webhook.engine import mutate_pod
from webhook.engine.annotations import original_pod
from webhook.policy import build_policy, default_policy, parse_policy

GI, MI = 1024**3, 1024**2
SWAP = "swapwise.io/swap-node"
PERMILLE = "swapwise.io/swap-permille"


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


def node(name: str, labelled: bool, swap: int | None, permille: str | None = None,
         memory: Any = None) -> dict[str, Any]:
    """A Node; ``permille`` is its swapwise.io/swap-permille label, ``memory`` its
    ``status.capacity.memory``."""
    info: dict[str, Any] = {} if swap is None else {"swap": {"capacity": swap}}
    labels = {SWAP: "true"} if labelled else {}
    if permille is not None:
        labels[PERMILLE] = permille
    status: dict[str, Any] = {"nodeInfo": info}
    if memory is not None:
        status["capacity"] = {"memory": memory}
    return {"metadata": {"name": name, "labels": labels}, "status": status}


# A swap node labelled as the node agent does (swap 2 x RAM): it backs the default profile's pods.
BACKING = node("backing", True, 32 * GI, "2000", "16Gi")


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
    report = audit(Cluster(namespaces=[ns("team")], nodes=[node("n", True, GI, "2000")],
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
    nodes = [node("n0", True, 0), node("n1", False, GI), node("n2", True, GI, "2000")]
    # n3 is gone; n0, n1 and n3 are reported without swap, and not again as not backed.
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
    report = audit(Cluster(namespaces=[ns("team")], pods=[p], vpas=[vpa], nodes=[BACKING]),
                   default_policy())
    assert checks(report.findings) == [("vpa", "VerticalPodAutoscaler/v", False)]
    assert report.skipped == [] and not report.needs_action
    vpa["spec"]["updatePolicy"] = {}  # default mode: Auto, which evicts
    skip_policy = build_policy({"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                                "profiles": {"default": {"vpaPods": "skip"}}})
    report = audit(Cluster(namespaces=[ns("team")], pods=[p], vpas=[vpa], nodes=[BACKING]),
                   skip_policy)
    assert checks(report.findings) == [("vpa", "VerticalPodAutoscaler/v", True)]
    assert "vpaPods: skip" in report.findings[0].message
    # The default, raiseLimit, gives the same pods in either webhook order: information.
    report = audit(Cluster(namespaces=[ns("team")], pods=[p], vpas=[vpa], nodes=[BACKING]),
                   default_policy())
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
    assert checks(report.findings) == [("node-swap-noswap", "Node/n", False)]
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
    # Not "needs action" (1) either: the audit could not be made.
    bad = swapwise("audit", "--label", "novalue")
    assert bad.returncode == 2 and "expected key=value" in bad.stderr
    unreadable = swapwise("audit", "--policy", str(tmp_path / "missing.yaml"))
    assert unreadable.returncode == 2 and "cannot read the policy file" in unreadable.stderr


def test_cli_says_a_crash_on_cluster_data_is_a_bug_with_exit_2(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever slips past the checks below is a clear error with its own exit status, not
    a traceback with status 1 (which means "needs action")."""
    from webhook.cli import audit_cmd as audit_cli

    async def fetch(kubeconfig: str | None) -> Cluster:
        return Cluster(namespaces=[ns("team")])

    def crash(*args: Any) -> Any:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(audit_cli, "fetch", fetch)
    monkeypatch.setattr("webhook.analysis.audit.audit", crash)
    assert audit_cli.run(build_parser().parse_args(["audit"])) == 2
    err = capsys.readouterr().err
    assert err.startswith("swapwise: audit: cannot judge what the cluster returned "
                          "(RecursionError: maximum recursion depth exceeded); this is a "
                          "swapwise bug"), err


# ------------------------------------------------------------------------- swap backing


def on(name: str, node_name: str, limit: str = "2Gi") -> dict[str, Any]:
    """A pod reshaped by the default profile (app 2Gi -> 683Mi: need 1999), bound to a node."""
    return reshaped(pod(name, limit=limit, nodeName=node_name))


def not_backed(report: Any) -> dict[str, Finding]:
    return {f.object: f for f in report.findings if f.check == "reshaped-pod-not-backed"}


def test_reshaped_pods_on_nodes_that_do_not_back_them() -> None:
    nodes = [
        node("big", True, 32 * GI, "2000", "16Gi"),  # backs need 1999
        node("edge", True, 32 * GI, "1999", "16Gi"),  # exactly the need: backs
        node("small", True, GI, "15", "64Gi"),  # 1000 * 1Gi / 64Gi = 15.6
        node("nolabel", True, GI, None, "64Gi"),  # computed from its status: 15
        node("junklabel", True, GI, "abc", "65536Mi"),  # not comparable: from status
        node("stale", True, GI, "2000", "64Gi"),  # the label is what the scheduler sees
        node("unknown", True, GI, None, "lots"),  # neither: cannot be judged
    ]
    pods = [on(f"p-{n['metadata']['name']}", n["metadata"]["name"]) for n in nodes]
    report = audit(Cluster(namespaces=[ns("team")], nodes=nodes, pods=pods), default_policy())
    found = not_backed(report)
    assert sorted(found) == ["Pod/p-junklabel", "Pod/p-nolabel", "Pod/p-small"]
    assert found["Pod/p-small"].details == {
        "node": "small", "need": 1999, "containers": {"app": 1999}, "nodePermille": 15,
        "permilleSource": "label", "backingApplies": True}
    assert found["Pod/p-small"].action
    message = found["Pod/p-small"].message
    assert message.startswith("needs swap-permille >= 1999 (container app) but runs on node "
                              "small, whose swap-permille is 15 (its label "
                              "swapwise.io/swap-permille)")
    assert "re-create it so that it lands on a node that backs it" in message
    status = found["Pod/p-nolabel"]
    assert (status.details["nodePermille"], status.details["permilleSource"]) == (15, "status")
    assert ("computed from its status: swap 1073741824 bytes, memory 68719476736 bytes; it "
            "has no label swapwise.io/swap-permille") in status.message
    assert "its label swapwise.io/swap-permille='abc' is not an integer the scheduler can " \
        "compare" in found["Pod/p-junklabel"].message
    assert sorted(report.skipped) == [
        "reshaped-pod-not-backed: Pod team/p-unknown on node unknown: it has no label "
        "swapwise.io/swap-permille, and memory capacity (status.capacity.memory) unreadable: "
        "'lots' is not a valid quantity (e.g. 512Mi, 2Gi, 1.5G, 2e9)",
        "vpa: the autoscaling.k8s.io API is not served by this cluster"]
    assert all(f.check != "no-swap-permille-label" for f in report.findings)


def test_a_pod_reported_without_swap_hides_no_namesake_in_another_namespace() -> None:
    nodes = [node("noswap", True, None), node("small", True, GI, "15", "64Gi")]
    pods = [on("p", "noswap"), reshaped(pod("p", "other", nodeName="small"))]
    report = audit(Cluster(namespaces=[ns("team"), ns("other")], nodes=nodes, pods=pods),
                   default_policy())
    assert sorted((f.check, f.namespace, f.object) for f in report.findings
                  if f.object == "Pod/p") == [
        ("reshaped-pod-not-backed", "other", "Pod/p"),
        ("reshaped-pod-without-swap", "team", "Pod/p")]


def test_with_backing_off_a_pod_on_a_node_that_does_not_back_it_is_information() -> None:
    policy = parse_policy(POLICY.replace("default: {}", "default: {placement: {mode: preferred}}"))
    n = node("small", True, GI, "15", "64Gi")
    report = audit(Cluster(namespaces=[ns("team")], nodes=[n], pods=[on("p", "small")]), policy)
    [finding] = not_backed(report).values()
    assert not finding.action and finding.details["backingApplies"] is False
    assert "backing is off for profile default (placement.mode: preferred), so nothing keeps " \
        "such pods off this node" in finding.message
    assert not report.needs_action


def test_need_counts_only_current_containers_swapwise_changed_and_below_their_limit() -> None:
    p = pod("p", nodeName="n")
    p["spec"]["containers"].append({"name": "tool", "image": "x", "resources": {
        "requests": {"memory": "100Mi"}, "limits": {"memory": "2Gi"}}})  # needs 19480
    p["spec"]["initContainers"] = [{"name": "proxy", "image": "x", "restartPolicy": "Always",
                                    "resources": {"limits": {"memory": "3Gi"}}}]
    p = reshaped(p)
    # proxy 3Gi -> 1Gi: exactly 2000; app 1999; tool is not swapwise's: not counted.
    assert json.loads(p["metadata"]["annotations"]["swapwise.io/original"]).keys() == {
        "proxy", "app"}
    lr = node("n", True, 32 * GI, "1999", "16Gi")
    report = audit(Cluster(namespaces=[ns("team")], nodes=[lr], pods=[p]), default_policy())
    [finding] = not_backed(report).values()
    assert finding.details["containers"] == {"proxy": 2000, "app": 1999}
    assert finding.details["need"] == 2000 and "(container proxy)" in finding.message
    # Resized back in place to request == limit: that container needs nothing any more.
    p["spec"]["initContainers"][0]["resources"]["requests"]["memory"] = "3Gi"
    report = audit(Cluster(namespaces=[ns("team")], nodes=[lr], pods=[p]), default_policy())
    assert not_backed(report) == {}


@pytest.mark.parametrize("junk", [
    "not json", "[]", '{"app": {"request": 5}}', '{"app": "2Gi"}',
    '{"app": {"request": "2Gi", "extra": "x"}}', "[" * 100_000, 7,
])
def test_an_unreadable_original_annotation_is_never_traced_back(junk: Any) -> None:
    p = on("p", "small")
    p["metadata"]["annotations"]["swapwise.io/original"] = junk
    n = node("small", True, GI, "15", "64Gi")
    report = audit(Cluster(namespaces=[ns("team")], nodes=[n], pods=[p]), default_policy())
    assert not_backed(report) == {}
    assert (
        "reshaped-pod-not-backed: Pod team/p: its swapwise.io/original annotation is "
        "unreadable, so which containers swapwise changed is not known") in report.skipped
    assert original_pod(p) is None  # nor restored for the HPA check


def test_a_reshaped_pod_whose_containers_swapwise_left_alone_needs_nothing() -> None:
    # Already request < limit: swapwise added placement and its profile annotation only.
    p = pod("p", nodeName="small")
    p["spec"]["containers"][0]["resources"]["requests"] = {"memory": "100Mi"}
    p["metadata"]["annotations"] = {"swapwise.io/profile": "default"}
    n = node("small", True, GI, "15", "64Gi")
    report = audit(Cluster(namespaces=[ns("team")], nodes=[n], pods=[p]), default_policy())
    assert not_backed(report) == {}
    assert report.skipped == ["vpa: the autoscaling.k8s.io API is not served by this cluster"]


def test_no_node_with_the_permille_label_while_reshaped_pods_run() -> None:
    plain = node("n", True, 32 * GI, None, "16Gi")
    report = audit(Cluster(namespaces=[ns("team")], nodes=[plain], pods=[on("p", "n")]),
                   default_policy())
    [finding] = [f for f in report.findings if f.check == "no-swap-permille-label"]
    assert (finding.object, finding.action) == ("Node/*", True)
    assert finding.details == {"reshapedPods": 1, "profiles": ["default"]}
    assert "every new reshaped pod of theirs stays Pending; run swapwise node-agent" in \
        finding.message
    # Computed from its status, that node backs the pod: no other finding.
    assert checks(report.findings) == [("no-swap-permille-label", "Node/*", True)]
    # Backing off everywhere: for information.
    policy = parse_policy(POLICY.replace("default: {}", "default: {placement: {mode: none}}"))
    report = audit(Cluster(namespaces=[ns("team")], nodes=[plain], pods=[on("p", "n")]), policy)
    assert [(f.check, f.action) for f in report.findings] == [
        ("no-swap-permille-label", False)]
    # Any node with the label (a wrong value included), or no reshaped pod: nothing to say.
    for cluster in (Cluster(namespaces=[ns("team")], nodes=[plain, BACKING], pods=[on("p", "n")]),
                    Cluster(namespaces=[ns("team")], nodes=[plain], pods=[pod("q")])):
        assert all(f.check != "no-swap-permille-label" for f in
                   audit(cluster, default_policy()).findings)


@pytest.mark.parametrize(("value", "expected"), [
    ("2000", 2000), ("0", 0), ("+15", 15), ("007", 7), ("-1", -1),
    ("9223372036854775807", 2**63 - 1), ("9223372036854775808", None), ("1" * 30, None),
    ("2000 ", None), ("2e3", None), ("", None), ("abc", None), (2000, None), (None, None),
])
def test_a_permille_label_is_read_as_the_scheduler_reads_it(value: Any, expected: int | None
                                                            ) -> None:
    assert label_permille(value) == expected


def test_cluster_data_of_the_wrong_type_never_crashes_the_audit() -> None:
    weird_nodes: list[Any] = [
        {"metadata": {"name": "a", "labels": ["x"]}, "status": "up"},
        {"metadata": {"name": "b", "labels": {SWAP: "true", PERMILLE: ["2000"]}},
         "status": {"capacity": {"memory": {"x": 1}}, "nodeInfo": {"swap": {"capacity": "8Gi"}}}},
        {"metadata": None},
        {"metadata": {"name": "c", "labels": {SWAP: "true"}},
         "status": {"capacity": [], "nodeInfo": {"swap": {"capacity": True}}}},
    ]
    odd = on("odd", "b")
    odd["metadata"]["annotations"]["swapwise.io/original"] = {"app": {"request": "2Gi"}}
    broken = on("broken", "c")
    broken["spec"]["containers"][0]["resources"] = {"requests": {"memory": "lots"}}
    bound_to_int = on("int", "a")
    bound_to_int["spec"]["nodeName"] = 7
    report = audit(Cluster(namespaces=[ns("team")], nodes=weird_nodes,
                           pods=[odd, broken, bound_to_int, on("ok", "b")]), default_policy())
    assert isinstance(report.to_json(), dict)
    # b's label is not an integer and its status has no readable memory: not judged.
    assert ("reshaped-pod-not-backed: Pod team/ok on node b: its label "
            "swapwise.io/swap-permille is a list, not an integer the scheduler can compare, "
            "and memory capacity (status.capacity.memory) unreadable: a dict is not a quantity"
            ) in report.skipped
    assert "reshaped-pod-not-backed: Pod team/broken: the pod cannot be read (" in "\n".join(
        report.skipped)


# -------------------------------------------------------------------- memory pressure

PRESSURE = "swapwise.io/memory-pressure"


def marked(n: dict[str, Any], note: Any = None) -> dict[str, Any]:
    """``n`` carrying the pressure guard's mark, and its annotation when ``note`` is given."""
    n["metadata"]["labels"][PRESSURE] = "true"
    if note is not None:
        n["metadata"]["annotations"] = {PRESSURE: note}
    return n


def pressure(report: Any) -> dict[str, Finding]:
    return {f.object: f for f in report.findings if f.check == "node-memory-pressure"}


def test_marked_nodes_are_listed_with_the_reshaped_pods_stuck_there() -> None:
    note = ("marked: memory PSI some avg10 47.2% >= 40% for 60 s (full avg10 12.1%) at "
            "2026-01-01T12:00:00Z")
    nodes = [marked(node("hot", True, 32 * GI, "2000", "16Gi"), note),
             node("calm", True, 32 * GI, "2000", "16Gi"),
             marked(node("by-hand", True, 32 * GI, "2000", "16Gi"))]
    plain = pod("plain", "other", nodeName="hot")  # not opted in: not counted
    report = audit(Cluster(namespaces=[ns("team"), ns("other", None)], nodes=nodes,
                           pods=[on("a", "hot"), on("b", "hot"), on("c", "calm"), plain,
                                 pod("unshaped", nodeName="hot")]),
                   default_policy())
    found = pressure(report)
    assert sorted(found) == ["Node/by-hand", "Node/hot"]
    hot = found["Node/hot"]
    assert hot.action and hot.namespace is None
    assert hot.message == (
        f"marked {PRESSURE} (label) by the node agent ({note}): new reshaped pods with "
        "required placement are not placed there; 2 reshaped pod(s) already there keep "
        "stalling on swap-in (swapwise evicts nothing): move or resize those with the largest "
        "hot memory, or give the node more RAM; while the label is on, a restart of the "
        "node's kubelet fails them (it re-admits pods against their node affinity, reason "
        "NodeAffinity)")
    assert hot.details == {"annotation": note, "reshapedPods": ["team/a", "team/b"],
                           "everySwapNodeMarked": False, "markedWith": ["label"]}
    assert "(no annotation: not marked by swapwise node-agent?)" in found[
        "Node/by-hand"].message
    assert found["Node/by-hand"].details["reshapedPods"] == []
    assert report.needs_action
    assert report.to_json()["findings"][-1]["check"] == "node-memory-pressure"


def test_a_node_marked_with_the_taint_is_listed_with_what_the_taint_keeps_off() -> None:
    tainted = node("hot", True, 32 * GI, "2000", "16Gi")
    tainted["spec"] = {"taints": [{"key": "other", "effect": "NoExecute"},
                                  {"key": PRESSURE, "value": "true", "effect": "NoSchedule"}]}
    only_other = node("calm", True, 32 * GI, "2000", "16Gi")
    only_other["spec"] = {"taints": [{"key": "other", "effect": "NoSchedule"}]}
    report = audit(Cluster(namespaces=[ns("team")], nodes=[tainted, only_other],
                           pods=[on("a", "hot")]), default_policy())
    found = pressure(report)
    assert sorted(found) == ["Node/hot"]
    message = found["Node/hot"].message
    assert message.startswith(f"marked {PRESSURE} (taint) by the node agent (no annotation")
    assert ("no new pod that does not tolerate its NoSchedule taint is placed there; 1 "
            "reshaped pod(s) already there") in message
    assert "restart" not in message  # the kubelet ignores NoSchedule taints when it restarts
    assert found["Node/hot"].details["markedWith"] == ["taint"]


def test_every_swap_node_marked_means_new_reshaped_pods_stay_pending() -> None:
    nodes = [marked(node("a", True, 32 * GI, "2000", "16Gi"), "marked: x"),
             marked(node("b", True, 32 * GI, "2000", "16Gi"), "marked: y"),
             node("plain", False, None)]
    found = pressure(audit(Cluster(namespaces=[ns("team")], nodes=nodes), default_policy()))
    assert sorted(found) == ["Node/a", "Node/b"]
    for finding in found.values():
        assert finding.details["everySwapNodeMarked"] is True
        assert finding.message.endswith(
            f"; every node labelled {SWAP}=true is marked, so new reshaped pods with required "
            "placement stay Pending until one is cleared")
    # No swap node at all: nothing is said of "every" (and a marked plain node is listed).
    found = pressure(audit(Cluster(namespaces=[ns("team")], nodes=[
        marked(node("plain", False, None), 7)]), default_policy()))
    assert found["Node/plain"].details == {"annotation": None, "reshapedPods": [],
                                           "everySwapNodeMarked": False,
                                           "markedWith": ["label"]}


def test_no_mark_no_finding_and_odd_annotations_do_not_crash() -> None:
    nodes = [node("a", True, 32 * GI, "2000", "16Gi")]
    assert pressure(audit(Cluster(namespaces=[ns("team")], nodes=nodes), default_policy())) == {}
    odd = marked(node("odd", True, 32 * GI, "2000", "16Gi"))
    odd["metadata"]["annotations"] = ["not", "a", "map"]
    report = audit(Cluster(namespaces=[ns("team")], nodes=[odd]), default_policy())
    assert pressure(report)["Node/odd"].details["annotation"] is None


# ------------------------------------------------------------- cluster data of any type


def nested(depth: int) -> list[Any]:
    """A list nested ``depth`` deep, built without recursion."""
    root: list[Any] = []
    current = root
    for _ in range(depth - 1):
        current.append([])
        current = current[0]
    return root


def a_workload() -> dict[str, Any]:
    """A reshaped pod of Deployment web (through its ReplicaSet) with an HPA on web that
    scales on memory utilisation, VPA, LimitRange and quota: every check has work."""
    p = reshaped(pod("web-1", nodeName="backing"))
    p["metadata"]["ownerReferences"] = [
        {"kind": "ReplicaSet", "name": "web-5d", "controller": True}]
    rs = {"metadata": {"name": "web-5d", "namespace": "team", "ownerReferences": [
        {"kind": "Deployment", "name": "web", "controller": True}]}}
    hpa = {"metadata": {"name": "web", "namespace": "team"},
           "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "metrics": [
               {"type": "Resource", "resource": {"name": "memory", "target": {
                   "type": "Utilization", "averageUtilization": 90}}}]}}
    vpa = {"metadata": {"name": "web", "namespace": "team"},
           "spec": {"targetRef": {"kind": "Deployment", "name": "web"}}}
    lr = {"metadata": {"name": "lr", "namespace": "team"},
          "spec": {"limits": [{"type": "Container", "maxLimitRequestRatio": {"memory": "2"}}]}}
    quota = {"metadata": {"name": "q", "namespace": "team"},
             "spec": {"hard": {"limits.memory": "2Gi"}}, "status": {"used": {
                 "limits.memory": "2Gi"}}}
    return {"namespaces": [ns("team")], "nodes": [BACKING], "pods": [p], "replicasets": [rs],
            "hpas": [hpa], "vpas": [vpa], "limitranges": [lr], "quotas": [quota]}


def test_a_deep_original_annotation_with_an_hpa_on_its_deployment_is_not_traced_back() -> None:
    """Anyone who can create pods can write swapwise.io/original: 5,000-deep JSON there is
    read by the engine's validating reader, and the HPA check then has no original."""
    cluster = a_workload()
    cluster["pods"][0]["metadata"]["annotations"]["swapwise.io/original"] = (
        '{"app":' * 5000 + "1" + "}" * 5000)
    report = audit(Cluster(**cluster), default_policy())
    assert not [f for f in report.findings if f.check == "hpa-memory-utilisation"]
    assert any("swapwise.io/original annotation is unreadable" in s for s in report.skipped)
    # The same cluster with the annotation as swapwise wrote it: the HPA is found.
    assert [f.check for f in audit(Cluster(**a_workload()), default_policy()).findings
            if f.check == "hpa-memory-utilisation"] == ["hpa-memory-utilisation"]


def _set(cluster: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    node: Any = cluster
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


WRONG_TYPES: list[Any] = [["team"], {"name": "team"}, 7, None, True, "x", nested(3000)]
PATHS: list[tuple[str | int, ...]] = [
    ("replicasets", 0, "metadata", "namespace"), ("hpas", 0, "metadata", "namespace"),
    ("vpas", 0, "metadata", "namespace"), ("quotas", 0, "metadata", "namespace"),
    ("limitranges", 0, "metadata", "namespace"), ("limitranges", 0, "spec", "limits"),
    ("limitranges", 0, "spec", "limits", 0), ("pods", 0, "spec", "containers"),
    ("pods", 0, "spec", "containers", 0), ("pods", 0, "spec", "containers", 0, "name"),
    ("pods", 0, "spec", "containers", 0, "resources"),
    ("pods", 0, "spec", "containers", 0, "resources", "limits"),
    ("pods", 0, "spec", "nodeName"), ("pods", 0, "metadata", "name"),
    ("pods", 0, "metadata", "namespace"), ("pods", 0, "metadata", "ownerReferences", 0, "name"),
    ("replicasets", 0, "metadata", "ownerReferences"),
    ("hpas", 0, "spec", "scaleTargetRef", "kind"), ("hpas", 0, "spec", "metrics"),
    ("vpas", 0, "spec", "targetRef", "name"), ("quotas", 0, "spec", "hard"),
    ("quotas", 0, "status", "used", "limits.memory"),
    ("nodes", 0, "metadata", "labels", PERMILLE), ("nodes", 0, "status"),
    ("namespaces", 0, "metadata", "labels", "swapwise.io/profile"),
    # whole objects, and whole listings
    *[(listing, 0) for listing in ("namespaces", "nodes", "pods", "replicasets", "hpas", "vpas",
                                   "limitranges", "quotas")],
    *[(listing,) for listing in ("nodes", "pods", "replicasets", "hpas", "limitranges",
                                 "quotas")],
]


@pytest.mark.parametrize("value", WRONG_TYPES, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("path", PATHS, ids=lambda p: ".".join(map(str, p)))
def test_cluster_data_of_any_type_anywhere_is_never_traced_back(
        path: tuple[str | int, ...], value: Any) -> None:
    """audit.py assumed types for containers, container names, resources, the namespaces
    of ReplicaSets, HPAs, VPAs and ResourceQuotas, LimitRange spec.limits; the API server
    only ever sends the right ones, but the audit must not trace back when it does not."""
    cluster = a_workload()
    _set(cluster, path, value)
    report = audit(Cluster(**cluster), default_policy())
    assert isinstance(report.to_json(), dict)


def test_objects_the_audit_cannot_read_are_said_not_dropped_silently() -> None:
    cluster = a_workload()
    deep = reshaped(pod("deep", nodeName="backing"))
    deep["spec"]["containers"][0]["env"] = nested(3000)  # copying it would exhaust the stack
    cluster["pods"] += [deep, "junk"]
    cluster["hpas"] = {"items": []}
    report = audit(Cluster(**cluster), default_policy())
    assert "Pod: deep: nested deeper than 64 levels; not read" in report.skipped
    assert "Pod: ?: not an object; not read" in report.skipped
    assert "HorizontalPodAutoscaler: the listing is not a list; none read" in report.skipped
    # The readable pod is still audited.
    assert [f.object for f in report.findings if f.check == "vpa"] == [
        "VerticalPodAutoscaler/web"]


# ------------------------------------------------------ a hostile or broken API server
# The whole command against a stand-in on loopback (testkit/fake_upstream.py), issue 46.

PLURALS = {"namespaces": "Namespace", "nodes": "Node", "pods": "Pod",
           "replicasets": "ReplicaSet", "horizontalpodautoscalers": "HorizontalPodAutoscaler",
           "limitranges": "LimitRange", "resourcequotas": "ResourceQuota"}


def api(objects: dict[str, list[dict[str, Any]]],
        special: Callable[[fake.Handler, str, str], bool] | None = None) -> fake.Respond:
    """An API server holding ``objects`` (by plural); ``special`` may answer a request
    itself (returning True). The VPA API is not served (404), as on most clusters."""
    def respond(handler: fake.Handler, method: str, path: str, body: bytes) -> None:
        route, _, query = path.partition("?")
        plural = route.rstrip("/").split("/")[-1]
        if special is not None and special(handler, plural, query):
            return
        if plural not in PLURALS:
            handler.send(404, b"404 page not found\n", "text/plain")
            return
        parts = route.split("/")
        namespace = parts[parts.index("namespaces") + 1] if "namespaces" in parts[:-1] \
            else None
        items = [o for o in objects.get(plural, [])
                 if namespace is None or o["metadata"].get("namespace") == namespace]
        handler.json(200, fake.object_list(PLURALS[plural], items))
    return respond


def opted_in_cluster() -> dict[str, list[dict[str, Any]]]:
    """One opted-in namespace and one pod in it that is not in shape: a finding."""
    return {"namespaces": [ns("team")], "pods": [pod("web-0")]}


def audit_against(server: fake.Upstream, tmp_path: Path, *args: str
                  ) -> subprocess.CompletedProcess[str]:
    config = fake.kubeconfig(tmp_path / "kubeconfig", server.url)
    return swapwise("audit", "--kubeconfig", str(config), *args)


def test_audit_reads_a_cluster_through_the_stand_in(tmp_path: Path) -> None:
    with fake.upstream(api(opted_in_cluster())) as server:
        out = audit_against(server, tmp_path)
    assert out.returncode == 1, out.stderr
    assert "pod-not-reshaped" in out.stdout and "Pod/web-0" in out.stdout


def test_a_list_whose_continue_token_repeats_ends_with_a_clear_error(tmp_path: Path) -> None:
    """The same token on every page: audit paged forever."""
    def same_token(handler: fake.Handler, plural: str, query: str) -> bool:
        if plural != "namespaces":
            return False
        handler.json(200, fake.object_list("Namespace", [ns("team")], token="again"))
        return True

    with fake.upstream(api(opted_in_cluster(), same_token)) as server:
        out = audit_against(server, tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("swapwise: audit: cannot read the cluster: list namespaces: "
                                 "the server returned a continue token it had returned "
                                 "before"), out.stderr
    assert len(server.requests) == 2


def test_an_api_server_that_drips_is_given_up_on_at_the_timeout(tmp_path: Path) -> None:
    def drip(handler: fake.Handler, plural: str, query: str) -> bool:
        if plural != "nodes":
            return False
        handler.drip(0.5)
        return True

    with fake.upstream(api(opted_in_cluster(), drip)) as server:
        out = audit_against(server, tmp_path, "--timeout", "3")
    assert out.returncode == 2, out.stderr
    assert out.stderr == ("swapwise: audit: cannot read the cluster: reading the cluster did "
                          "not finish within 3 s (--timeout)\n"), out.stderr


def test_a_busy_api_server_is_retried_with_backoff_and_the_retries_are_said(
        tmp_path: Path) -> None:
    """Two 503s (an API server restarting), then the list: the audit goes on, and says what
    it retried; an API server that never recovers is not hammered (backoff), and the audit
    ends at its timeout."""
    failures = {"left": 2}

    def busy(handler: fake.Handler, plural: str, query: str) -> bool:
        if plural != "namespaces" or failures["left"] == 0:
            return False
        failures["left"] -= 1
        handler.json(503, fake.status(503, "apiserver is shutting down"))
        return True

    with fake.upstream(api(opted_in_cluster(), busy)) as server:
        out = audit_against(server, tmp_path)
    assert out.returncode == 1, out.stderr
    assert "Pod/web-0" in out.stdout
    retries = [line for line in out.stderr.splitlines() if "retrying list namespaces" in line]
    assert len(retries) == 2, out.stderr
    assert "HTTP 503: apiserver is shutting down" in retries[0]

    failures["left"] = 10**9
    with fake.upstream(api(opted_in_cluster(), busy)) as server:
        out = audit_against(server, tmp_path, "--timeout", "4")
    assert out.returncode == 2 and "within 4 s (--timeout)" in out.stderr, out.stderr
    assert "retrying list namespaces" in out.stderr
    # 0.5 + 1 + 2 s of backoff (with 20 % jitter) fit in 4 s: at most 5 requests, not
    # thousands (a slower machine makes fewer).
    assert len(server.requests) <= 5, server.requests


def test_a_gzip_bomb_page_is_refused_while_it_streams(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bomb = fake.gzip_bomb(512 * 1024 * 1024)

    def bombs(handler: fake.Handler, plural: str, query: str) -> bool:
        if plural != "nodes":
            return False
        handler.send(200, bomb, headers={"Content-Encoding": "gzip"})
        return True

    from webhook.cli import main

    with fake.upstream(api(opted_in_cluster(), bombs)) as server:
        config = fake.kubeconfig(tmp_path / "kubeconfig", server.url)
        tracemalloc.start()
        try:
            status = main(["audit", "--kubeconfig", str(config)])
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert status == 2
    assert "list nodes: a page is larger than 64 MiB" in capsys.readouterr().err
    assert peak < 160 * 1024 * 1024, f"peak {peak / 2**20:.0f} MiB"


ESCAPES = "\x1b]0;owned\x07\x1b[2J\x9b31m\nfake: line"


def served(n: dict[str, Any]) -> dict[str, Any]:
    """The node with the nodeInfo fields every API server sets."""
    n["status"]["nodeInfo"] |= {field: "x" for field in (
        "architecture", "bootID", "containerRuntimeVersion", "kernelVersion",
        "kubeProxyVersion", "kubeletVersion", "machineID", "operatingSystem", "osImage",
        "systemUUID")}
    return n


def test_strings_from_the_cluster_reach_no_terminal(tmp_path: Path) -> None:
    """A node annotation (the pressure guard's note) and an API error message, printed
    raw: escape sequences cleared the screen and set the title."""
    cluster = opted_in_cluster()
    cluster["nodes"] = [marked(served(node("n1", True, GI, "2000", "16Gi")), ESCAPES)]
    with fake.upstream(api(cluster)) as server:
        out = audit_against(server, tmp_path)
    assert out.returncode == 1, out.stderr
    assert "node-memory-pressure" in out.stdout
    assert not set(out.stdout) & {"\x1b", "\x07", "\x9b"}, repr(out.stdout)
    assert "\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\x0afake: line" in out.stdout

    def forbidden(handler: fake.Handler, plural: str, query: str) -> bool:
        handler.json(403, fake.status(403, f"nodes is forbidden{ESCAPES}"))
        return True

    with fake.upstream(api(cluster, forbidden)) as server:
        out = audit_against(server, tmp_path)
    assert out.returncode == 2
    assert not set(out.stderr) & {"\x1b", "\x07", "\x9b"}, repr(out.stderr)
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert "forbidden\\x1b]0;owned" in out.stderr and "docs/audit.md" in out.stderr


def test_a_page_nested_past_any_object_is_refused(tmp_path: Path) -> None:
    deep = b'{"items": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}"

    def nested(handler: fake.Handler, plural: str, query: str) -> bool:
        if plural != "nodes":
            return False
        handler.send(200, deep)
        return True

    with fake.upstream(api(opted_in_cluster(), nested)) as server:
        out = audit_against(server, tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("swapwise: audit: cannot read the cluster: ")
    assert "Traceback" not in out.stderr

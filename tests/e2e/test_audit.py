"""`swapwise audit` against a real control plane, as a read-only ServiceAccount.

A control plane of its own (the audit reads every Node, so other tests' nodes must not
show up): fake Nodes in each swap state, a namespace whose pods predate its opt-in, pods
reshaped by the real webhook (one pinned to a node without swap), an HPA on memory
utilisation, a VerticalPodAutoscaler (its CRD installed halfway, to see both the quiet
skip and the finding), a LimitRange and a ResourceQuota that refuse reshaped pods. The
audit runs with the ClusterRole of docs/audit.md and nothing else.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import (
    PROFILE_LABEL,
    SWAP_LABEL,
    ControlPlane,
    Swapwise,
    ensure_binaries,
    register_webhook,
    swapwise_executable,
    wait_for_mutation,
)

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
GI = 1024**3
PERMILLE = "swapwise.io/swap-permille"
POLICY = """\
apiVersion: swapwise.io/v1alpha1
kind: SwapPolicy
profiles:
  default: {}
  limits: {defaultLimit: 1Gi}
"""
VPA_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {
        "name": "verticalpodautoscalers.autoscaling.k8s.io",
        # *.k8s.io groups need it; the VPA's own CRD carries this one.
        "annotations": {"api-approved.kubernetes.io":
                        "https://github.com/kubernetes/kubernetes/pull/63797"},
    },
    "spec": {
        "group": "autoscaling.k8s.io",
        "scope": "Namespaced",
        "names": {"plural": "verticalpodautoscalers", "singular": "verticalpodautoscaler",
                  "kind": "VerticalPodAutoscaler", "shortNames": ["vpa"]},
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "schema": {"openAPIV3Schema": {"type": "object",
                                           "x-kubernetes-preserve-unknown-fields": True}},
        }],
    },
}


def audit_clusterrole() -> dict[str, Any]:
    """The ClusterRole exactly as docs/audit.md documents it."""
    text = (REPO / "docs" / "audit.md").read_text()
    for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
        doc = yaml.safe_load(block)
        if isinstance(doc, dict) and doc.get("kind") == "ClusterRole":
            return doc
    raise AssertionError("docs/audit.md has no ClusterRole")


def container(name: str, memory: str | None, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "registry.k8s.io/pause:3.10", **extra}
    if memory is not None:
        c["resources"] = {"limits": {"memory": memory, "cpu": "100m"}}
    return c


def deployment(name: str, namespace: str, memory: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [container("app", memory)]}}},
    }


def pods_of(cp: ControlPlane, namespace: str, app: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cp.get_json("pods", "-n", namespace, "-l", f"app={app}")["items"]
    return items


class Audit:
    def __init__(self, cp: ControlPlane, kubeconfig: Path, policy: Path) -> None:
        self.cp, self.kubeconfig, self.policy = cp, kubeconfig, policy

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [swapwise_executable(), "audit", "--kubeconfig", str(self.kubeconfig),
             "--policy", str(self.policy), *args],
            capture_output=True, text=True, timeout=60, check=False,
        )

    def json(self) -> tuple[int, dict[str, Any]]:
        proc = self.run("-o", "json")
        assert proc.returncode in (0, 1), proc.stderr
        return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, Audit]]:
    workdir = tmp_path_factory.mktemp("audit")
    with ControlPlane(ensure_binaries()) as cp:
        policy = workdir / "policy.yaml"
        policy.write_text(POLICY)
        cp.apply(json.dumps(audit_clusterrole()))
        cp.kubectl("create", "serviceaccount", "auditor", "-n", "default")
        cp.kubectl("create", "clusterrolebinding", "auditor", "--clusterrole",
                   "swapwise-audit", "--serviceaccount", "default:auditor")
        token = cp.kubectl("create", "token", "auditor", "-n", "default").stdout.strip()
        admin = json.loads(cp.kubeconfig.read_text())
        kubeconfig = workdir / "auditor.kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "clusters": admin["clusters"],
            "users": [{"name": "auditor", "user": {"token": token}}],
            "contexts": [{"name": "a", "context": {"cluster": admin["clusters"][0]["name"],
                                                  "user": "auditor"}}],
            "current-context": "a",
        }))
        with Swapwise(workdir / "swapwise", policy=policy) as sw:
            register_webhook(cp, sw.url_base, sw.ca_bundle, ["default", "limits"])
            yield cp, Audit(cp, kubeconfig, policy)


def test_audit_end_to_end(cluster: tuple[ControlPlane, Audit]) -> None:
    cp, audit = cluster
    # A healthy cluster: swap node labelled, plain node neither; nothing opted in.
    cp.create_node("swap-a", "16Gi", "8", {SWAP_LABEL: "true"}, swap_capacity=32 * GI)
    cp.create_node("plain-a", "16Gi", "8")
    proc = audit.run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing needs action" in proc.stdout

    # Pods that predate the opt-in, then the opt-in.
    cp.create_namespace("team")
    cp.apply(json.dumps(deployment("legacy", "team", "2Gi")))
    legacy = cp.wait_for(lambda: pods_of(cp, "team", "legacy") or None, what="legacy pod")
    cp.create_namespace("strict")
    bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare", "namespace": "strict"},
            "spec": {"containers": [container("app", None)]}}
    cp.apply(json.dumps(bare))
    cp.apply(json.dumps({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "mem", "namespace": "strict"},
        "spec": {"hard": {"limits.memory": "512Mi"}},
    }))
    cp.apply(json.dumps({
        "apiVersion": "v1", "kind": "LimitRange",
        "metadata": {"name": "ratio", "namespace": "strict"},
        "spec": {"limits": [{"type": "Container", "maxLimitRequestRatio": {"memory": "2"}}]},
    }))
    cp.kubectl("label", "namespace", "team", f"{PROFILE_LABEL}=default")
    cp.kubectl("label", "namespace", "strict", f"{PROFILE_LABEL}=limits")
    cp.create_namespace("typo", {PROFILE_LABEL: "sandbox"})
    wait_for_mutation(cp, "team")

    # Reshaped by the webhook: a Deployment under an HPA, and a pod pinned to a node that
    # is labelled but gives no swap.
    cp.apply(json.dumps(deployment("web", "team", "2Gi")))
    web = cp.wait_for(lambda: pods_of(cp, "team", "web") or None, what="web pod")
    assert web[0]["metadata"]["annotations"][PROFILE_LABEL] == "default"
    assert web[0]["spec"]["containers"][0]["resources"]["requests"]["memory"] == "683Mi"
    cp.apply(json.dumps({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "web", "namespace": "team"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                 "minReplicas": 1, "maxReplicas": 5,
                 "metrics": [{"type": "Resource", "resource": {
                     "name": "memory", "target": {"type": "Utilization",
                                                  "averageUtilization": 60}}}]},
    }))
    cp.create_node("liar", "16Gi", "8", {SWAP_LABEL: "true"})
    cp.create_node("unlabelled", "16Gi", "8", swap_capacity=8 * GI)
    cp.create_node("noswap", "16Gi", "8", {"swapwise.io/swap-behavior": "NoSwap"},
                   swap_capacity=8 * GI)
    pinned = {"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": "pinned", "namespace": "team"},
              "spec": {"nodeName": "liar", "containers": [container("app", "1Gi")]}}
    cp.apply(json.dumps(pinned))

    code, report = audit.json()
    assert code == 1
    assert report["needsAction"] is True
    assert report["policy"] == str(audit.policy)
    assert report["namespaces"] == {"strict": "limits", "team": "default", "typo": "sandbox"}
    assert report["skipped"] == [
        "vpa: the autoscaling.k8s.io API is not served by this cluster"]
    found = {(f["check"], f["namespace"], f["object"]): f for f in report["findings"]}

    unshaped = found[("pod-not-reshaped", "team", f"Pod/{legacy[0]['metadata']['name']}")]
    assert unshaped["owner"] == "Deployment/legacy"  # resolved through its ReplicaSet
    assert unshaped["details"]["changes"] == [
        "swapwise: app memory request 2Gi -> 683Mi (limit 2Gi)"]
    assert "kubectl rollout restart deployment/legacy -n team" in unshaped["message"]
    assert found[("pod-not-reshaped", "strict", "Pod/bare")]["owner"] is None

    without = found[("reshaped-pod-without-swap", "team", "Pod/pinned")]
    assert without["details"] == {"node": "liar",
                                  "reasons": ["the node reports no swap capacity"]}

    hpa = found[("hpa-memory-utilisation", "team", "HorizontalPodAutoscaler/web")]
    assert hpa["owner"] == "Deployment/web"
    assert hpa["details"]["requestBefore"] == 2 * GI
    assert hpa["details"]["requestAfter"] == 683 * 1024**2
    assert hpa["details"]["factor"] == pytest.approx(2048 / 683)
    assert hpa["details"]["suggestedAverageUtilization"] == 180
    assert "x3.00" in hpa["message"]
    assert "averageValue 1229Mi" in hpa["message"]  # 60 % of 2Gi, rounded up to a MiB
    assert hpa["details"]["suggestedAverageValue"] == 1229 * 1024**2

    assert found[("limitrange", "strict", "LimitRange/ratio")]["details"] == {
        "maxLimitRequestRatio": 2.0, "profileRatio": 3.0}
    quota = found[("resourcequota", "strict", "ResourceQuota/mem")]
    assert quota["details"]["resource"] == "limits.memory"
    assert quota["details"]["projected"] == GI  # defaultLimit 1Gi on the bare pod

    assert found[("unknown-profile", "typo", "Namespace/typo")]["action"] is True
    assert found[("node-labelled-without-swap", None, "Node/liar")]["action"] is True
    assert found[("node-swap-unlabelled", None, "Node/unlabelled")]["action"] is True
    assert found[("node-swap-noswap", None, "Node/noswap")]["action"] is False
    # The web pods wait for a node with swapwise.io/swap-permille that nothing will make
    # (no node has it, and this cluster serves no Karpenter NodePools).
    unplaceable = found[("reshaped-pods-unplaceable", "team", f"Pod/{web[0]['metadata']['name']}")]
    assert unplaceable["owner"] == "Deployment/web"
    assert unplaceable["details"]["missing"] == [f"{PERMILLE} > 1998 (>= 1999)"]
    assert unplaceable["details"]["nodePoolsServed"] is False
    # Reshaped pods exist and no node carries swapwise.io/swap-permille (no node agent here):
    # the default profile requires backing, so new reshaped pods would stay Pending.
    permille = found[("no-swap-permille-label", None, "Node/*")]
    assert permille["action"] is True
    assert permille["details"] == {"reshapedPods": 2, "profiles": ["default"]}
    # Nothing about what is healthy: the swap and plain nodes.
    objects = {f["object"] for f in report["findings"]}
    assert not objects & {"Node/swap-a", "Node/plain-a"}
    assert len(report["findings"]) == 12, report["findings"]

    # The table says the same.
    table = audit.run()
    assert table.returncode == 1
    assert table.stdout.startswith(f"policy: {audit.policy}\n")
    assert "12 finding(s), 11 needing action" in table.stdout
    assert re.search(r"^hpa-memory-utilisation +team +HorizontalPodAutoscaler/web +"
                     r"Deployment/web +yes$", table.stdout, re.M), table.stdout

    # With the VPA API served: a VPA on the reshaped Deployment is found, quietly otherwise.
    cp.apply(json.dumps(VPA_CRD))
    cp.wait_for(lambda: cp.kubectl("get", "vpa", "-A", check=False).returncode == 0 or None,
                what="VPA CRD served")
    cp.apply(json.dumps({
        "apiVersion": "autoscaling.k8s.io/v1", "kind": "VerticalPodAutoscaler",
        "metadata": {"name": "web", "namespace": "team"},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                 "updatePolicy": {"updateMode": "Recreate"}},
    }))
    code, report = audit.json()
    assert code == 1 and report["skipped"] == []
    vpa = [f for f in report["findings"] if f["check"] == "vpa"]
    assert [(v["object"], v["owner"], v["details"]) for v in vpa] == [
        ("VerticalPodAutoscaler/web", "Deployment/web", {"updateMode": "Recreate"})]


def test_audit_read_only_rbac_is_enough_and_needed(cluster: tuple[ControlPlane, Audit]) -> None:
    """The documented ClusterRole lists only; without the binding the audit fails (exit 2)."""
    cp, audit = cluster
    role = audit_clusterrole()
    assert {verb for rule in role["rules"] for verb in rule["verbs"]} == {"list"}
    cp.kubectl("delete", "clusterrolebinding", "auditor")
    try:
        proc = cp.wait_for(lambda: ((p := audit.run()).returncode == 2 and p) or None,
                           what="audit forbidden")
        assert "cannot read the cluster" in proc.stderr
        assert "forbidden" in proc.stderr.lower()
    finally:
        cp.kubectl("create", "clusterrolebinding", "auditor", "--clusterrole",
                   "swapwise-audit", "--serviceaccount", "default:auditor")


def test_audit_reshaped_pods_on_nodes_that_do_not_back_them(
    cluster: tuple[ControlPlane, Audit],
) -> None:
    """Pods reshaped by the real webhook, bound to swap nodes whose share does not cover
    them: the per-mille from the node's label, or from its status when it has none."""
    cp, audit = cluster
    # swap-a labelled as the node agent would (1000 * 32Gi / 16Gi): it backs the web pod
    # (need 1999), which is then bound there, and the cluster-wide finding goes.
    cp.kubectl("label", "node", "swap-a", f"{PERMILLE}=2000")
    web = cp.wait_for(lambda: [p for p in pods_of(cp, "team", "web")
                               if p["spec"].get("nodeName") == "swap-a"],
                      what="the web pod bound to swap-a")
    code, report = audit.json()
    assert not [f for f in report["findings"] if f["check"] == "no-swap-permille-label"
                or f["object"] == f"Pod/{web[0]['metadata']['name']}"], report["findings"]

    # 1Gi of swap on 64Gi of RAM: 1000 * 1Gi / 64Gi = 15.6 -> 15, far below 1999.
    cp.create_node("small", "64Gi", "8", {SWAP_LABEL: "true", PERMILLE: "15"},
                   swap_capacity=GI)
    cp.create_node("small-unlabelled", "64Gi", "8", {SWAP_LABEL: "true"}, swap_capacity=GI)
    for name, node in (("on-small", "small"), ("on-unlabelled", "small-unlabelled"),
                       ("junk", "small")):
        cp.apply(json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team"},
            "spec": {"nodeName": node, "containers": [container("app", "2Gi")]}}))
        pod = cp.get_json("pod", name, "-n", "team")
        assert pod["spec"]["containers"][0]["resources"]["requests"]["memory"] == "683Mi"
    cp.kubectl("annotate", "pod", "junk", "-n", "team", "--overwrite",
               'swapwise.io/original={"app": {"request": 2048}}')

    code, report = audit.json()
    assert code == 1
    found = {f["object"]: f for f in report["findings"]
             if f["check"] == "reshaped-pod-not-backed"}
    assert sorted(found) == ["Pod/on-small", "Pod/on-unlabelled"]
    assert found["Pod/on-small"]["details"] == {
        "node": "small", "need": 1999, "containers": {"app": 1999}, "nodePermille": 15,
        "permilleSource": "label", "backingApplies": True}
    assert found["Pod/on-small"]["action"] is True
    unlabelled = found["Pod/on-unlabelled"]
    assert (unlabelled["details"]["nodePermille"], unlabelled["details"]["permilleSource"]) == (
        15, "status")
    assert "computed from its status: swap 1073741824 bytes, memory 68719476736 bytes; it " \
        "has no label swapwise.io/swap-permille" in unlabelled["message"]
    assert ("reshaped-pod-not-backed: Pod team/junk: its swapwise.io/original annotation is "
            "unreadable, so which containers swapwise changed is not known") in report["skipped"]

    table = audit.run()
    assert re.search(r"^reshaped-pod-not-backed +team +Pod/on-small +- +yes$", table.stdout,
                     re.M), table.stdout
    assert "needs swap-permille >= 1999 (container app) but runs on node small, whose " \
        "swap-permille is 15 (its label swapwise.io/swap-permille)" in table.stdout
    assert "skipped: reshaped-pod-not-backed: Pod team/junk:" in table.stdout

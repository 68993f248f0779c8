"""swapwise and a real Vertical Pod Autoscaler: the stored pods, and no eviction loop.

The VPA admission controller and updater (VPA 1.5.1, built from Go modules by build-vpa.sh)
run against a control plane of this module's own; the test writes each VPA's recommendation
itself (no recommender, no metrics server). The same `swapwise serve` is registered twice, to
show both webhook orders at once - webhooks run in the order of their configurations' names:

| namespace   | profile (vpaPods)       | configuration | calls                              |
|-------------|-------------------------|---------------|------------------------------------|
| early-skip  | default (skip)          | swapwise      | swapwise, VPA, swapwise (reinvoked) |
| early-raise | raise (raiseLimit: the default) | swapwise | swapwise, VPA, swapwise (reinvoked) |
| late-skip   | late (skip)             | zz-swapwise   | VPA, swapwise (VPA never reinvoked) |
| late-raise  | late-raise (raiseLimit: the default) | zz-swapwise | VPA, swapwise           |

Each namespace has a Deployment of one Guaranteed pod (2Gi memory, 500m CPU) under a VPA in
`Recreate` mode recommending 1Gi (range 768Mi..1536Mi). The stored pods are checked, and the
warnings a server-side dry-run of the same pod returns (the reinvocation shows in them). Over
several updater passes nothing is evicted; then one recommendation moves out of the pod's
range and the updater evicts exactly once, so "nothing evicted" is the updater's decision, not
an idle updater. The updater only looks at scheduled pods, so there are fake Nodes (one swap
node, one plain); with no kubelet the pods stay Pending (which the updater may always evict),
and an evicted pod stays Terminating.
docs/vpa.md quotes the figures this prints.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testkit.progress import uncaptured
from tests.e2e import cluster as k8s
from tests.e2e.cluster import ControlPlane, wait_for
from tests.e2e.vpa import UPDATER_INTERVAL, Vpa, set_recommendation, vpa_object
from tests.e2e.vpa import ensure_binaries as ensure_vpa_binaries
from webhook.base.quantity import parse_quantity
from webhook.engine.backing import PERMILLE_LABEL, node_permille
from webhook.engine.mutate import backing_warning

pytestmark = pytest.mark.e2e

GI, MI = 1024**3, 1024**2
POLICY = """\
apiVersion: swapwise.io/v1alpha1
kind: SwapPolicy
profiles:
  default: {vpaPods: skip}
  raise: {}
  late: {vpaPods: skip}
  late-raise: {}
"""
PROFILES = {"early-skip": "default", "early-raise": "raise",
            "late-skip": "late", "late-raise": "late-raise"}
PASSES = 6  # updater passes watched for evictions

RECOMMENDED = {"target": {"cpu": "500m", "memory": "1Gi"},
               "lower": {"cpu": "250m", "memory": "768Mi"},
               "upper": {"cpu": "1", "memory": "1536Mi"}}
RESHAPED = "swapwise: app memory request 2Gi -> 683Mi (limit 2Gi)"
# the swap-backing need of the first pass (2Gi -> 683Mi) and of a raised limit (1Gi -> 3Gi)
BACKED_1999 = backing_warning(1999)
WARNINGS = {
    "early-skip": [RESHAPED, BACKED_1999, "swapwise: VerticalPodAutoscaler ran after swapwise "
                   "reshaped this pod; its memory requests are the VPA's (docs/vpa.md)"],
    "early-raise": [RESHAPED, BACKED_1999],
    "late-skip": ["swapwise: pod left unchanged: a VerticalPodAutoscaler manages its memory "
                  "(vpaPods: skip)"],
    "late-raise": ["swapwise: app memory limit 1Gi -> 3Gi (request 1Gi kept: a "
                   "VerticalPodAutoscaler sets it)", backing_warning(2000)],
}
# The VPA keeps the limit/request ratio of the pod it sees: after swapwise's 2Gi -> 683Mi.
EARLY_LIMIT = 2 * GI * GI // (683 * MI)


@dataclass
class Cluster:
    cp: ControlPlane
    vpa: Vpa


def deployment(namespace: str, replicas: int = 1) -> dict[str, Any]:
    resources = {"memory": "2Gi", "cpu": "500m"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{
                    "name": "app", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": resources, "limits": dict(resources)},
                }]},
            },
        },
    }


@pytest.fixture(scope="module")
def cluster(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Cluster]:
    k8s.skip_unless_e2e()
    with uncaptured(pytestconfig):
        binaries = k8s.ensure_binaries()
        ensure_vpa_binaries()  # a failed build fails here, with its output: never a skip
    work = tmp_path_factory.mktemp("vpa")
    policy = work / "policy.yaml"
    policy.write_text(POLICY)
    with ControlPlane(binaries) as cp, k8s.Swapwise(work / "swapwise", policy=policy) as sw:
        k8s.register_webhook(cp, sw.url_base, sw.ca_bundle, ["default", "raise"], name="swapwise")
        k8s.register_webhook(cp, sw.url_base, sw.ca_bundle, ["late", "late-raise"],
                         name="zz-swapwise")
        # Labelled as the node agent labels a swap node: reshaped pods need the per-mille too.
        cp.create_node("swap-1", memory="16Gi", cpu="8", labels={
            k8s.SWAP_LABEL: "true", PERMILLE_LABEL: str(node_permille(32 * GI, 16 * GI))},
            swap_capacity=32 * GI)
        cp.create_node("plain-1", memory="16Gi", cpu="8")
        for namespace, profile in PROFILES.items():
            cp.create_namespace(namespace, {k8s.PROFILE_LABEL: profile})
            k8s.wait_for_mutation(cp, namespace)
        with Vpa(cp, Path(sw.cert_dir), work / "vpa") as vpa:
            yield Cluster(cp, vpa)


def live_pods(cp: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    pods = cp.get_json("pods", "-n", namespace, "-l", "app=web")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def one_pod(cp: ControlPlane, namespace: str) -> dict[str, Any]:
    """The Deployment's one live pod, once scheduled (the updater only looks at those)."""
    def bound() -> dict[str, Any] | None:
        pods = live_pods(cp, namespace)
        return pods[0] if len(pods) == 1 and pods[0]["spec"].get("nodeName") else None

    found: dict[str, Any] = wait_for(bound, 60, on_timeout=cp.logs,
                                     what=f"one scheduled pod of deployment {namespace}/web")
    return found


def memory(pod: dict[str, Any]) -> tuple[int, int]:
    resources = pod["spec"]["containers"][0]["resources"]
    return (int(parse_quantity(resources["requests"]["memory"])),
            int(parse_quantity(resources["limits"]["memory"])))


def placed_on_swap(pod: dict[str, Any]) -> bool:
    terms = (pod["spec"].get("affinity", {}).get("nodeAffinity", {})
             .get("requiredDuringSchedulingIgnoredDuringExecution", {})
             .get("nodeSelectorTerms", []))
    return any(e["key"] == k8s.SWAP_LABEL for t in terms for e in t.get("matchExpressions", []))


def replicaset_owner(cp: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    """The ownerReferences of the Deployment's pods: its one ReplicaSet, as controller."""
    def found() -> dict[str, Any] | None:
        items = cp.get_json("replicasets", "-n", namespace, "-l", "app=web")["items"]
        return items[0] if len(items) == 1 else None

    rs = wait_for(found, 60, what=f"the ReplicaSet of deployment {namespace}/web")
    return [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs["metadata"]["name"],
             "uid": rs["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]


def dry_run(cp: ControlPlane, namespace: str, owners: list[dict[str, Any]]
            ) -> tuple[dict[str, Any], list[str]]:
    """The Deployment's pod created with server-side dry-run, owned like its pods (the VPA
    matches pods through their owner): the pod as it would be stored, and the warnings."""
    dry = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "generateName": "web-dry-", "labels": {"app": "web"}, "ownerReferences": owners},
        "spec": deployment(namespace)["spec"]["template"]["spec"]}
    out = cp.kubectl("create", "--dry-run=server", "-o", "json", "-n", namespace, "-f", "-",
                     input=json.dumps(dry))
    warnings = [line.removeprefix("Warning: ") for line in out.stderr.splitlines()
                if line.startswith("Warning: ")]
    return json.loads(out.stdout), warnings


def wait_until_the_vpa_updates_pods(cp: ControlPlane, namespace: str) -> None:
    owners = replicaset_owner(cp, namespace)

    def updated() -> bool:
        pod, _ = dry_run(cp, namespace, owners)
        return "memory request" in pod_annotations(pod).get("vpaUpdates", "")

    wait_for(updated, 120, interval=2,
             what=f"the VPA admission controller updating a pod of {namespace}/web")


def pod_annotations(pod: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = pod["metadata"].get("annotations", {})
    return found


def wait_passes(cluster: Cluster, count: int) -> None:
    start = cluster.vpa.updater_passes()

    def done() -> bool:
        cluster.vpa.check_alive()
        return cluster.vpa.updater_passes() >= start + count

    wait_for(done, count * UPDATER_INTERVAL * 4 + 30, interval=1,
             what=f"{count} updater passes", on_timeout=cluster.vpa.logs)


def describe(pod: dict[str, Any]) -> str:
    request, limit = memory(pod)
    ann = pod_annotations(pod)
    return (f"request {request} ({request / MI:.1f}Mi) limit {limit} ({limit / MI:.1f}Mi) "
            f"qos {pod['status'].get('qosClass')} node {pod['spec'].get('nodeName')} "
            f"swap-affinity {placed_on_swap(pod)} "
            f"swapwise.io/original {ann.get('swapwise.io/original')} "
            f"vpaUpdates {ann.get('vpaUpdates')!r}")


def test_vpa_managed_deployments_stored_pods_and_no_eviction_loop(cluster: Cluster) -> None:
    cp = cluster.cp
    for namespace in PROFILES:
        cp.apply(json.dumps(vpa_object("web", namespace, "web")))
        set_recommendation(cp, "web", namespace, "app", RECOMMENDED["target"],
                           RECOMMENDED["lower"], RECOMMENDED["upper"])
    wait_for(lambda: all(
        cp.get_json("vpa", "web", "-n", ns)["status"].get("recommendation") for ns in PROFILES),
        30, what="recommendations stored")
    # The admission controller reads VPAs and pod owners through informers, so a pod created
    # before they have caught up is left alone (on a loaded machine that took seconds). Each
    # Deployment starts with no replica; it gets one once a dry-run pod of its ReplicaSet
    # comes back updated by the VPA.
    for namespace in PROFILES:
        cp.apply(json.dumps(deployment(namespace, replicas=0)))
    for namespace in PROFILES:
        wait_until_the_vpa_updates_pods(cp, namespace)
        cp.kubectl("scale", "deployment", "web", "--replicas=1", "-n", namespace)
    pods = {namespace: one_pod(cp, namespace) for namespace in PROFILES}
    for namespace, pod in pods.items():
        print(f"{namespace}: {describe(pod)}")

    for namespace, pod in pods.items():
        ann = pod_annotations(pod)
        assert "memory request" in ann.get("vpaUpdates", ""), (
            f"{namespace}: the VPA admission controller did not set the memory request "
            f"(did it see the VPA?): {ann}")
        assert ann.get("vpaObservedContainers") == "app"
        assert pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "500m"

    # swapwise first: it reshapes 2Gi -> 683Mi; the VPA sets the request to its target and
    # scales the limit in proportion; the reinvocation leaves that alone, in both modes.
    for namespace in ("early-skip", "early-raise"):
        pod = pods[namespace]
        assert memory(pod) == (GI, EARLY_LIMIT), namespace
        assert json.loads(pod_annotations(pod)["swapwise.io/original"]) == {
            "app": {"request": "2Gi", "limit": "2Gi"}}
        assert pod["status"]["qosClass"] == "Burstable" and placed_on_swap(pod)
        assert pod["spec"]["containers"][0]["resizePolicy"] == [
            {"resourceName": "memory", "restartPolicy": "RestartContainer"}]

    # The VPA first, swapwise after: skip leaves the VPA's Guaranteed pod exactly as it is...
    pod = pods["late-skip"]
    assert memory(pod) == (GI, GI)
    assert pod["status"]["qosClass"] == "Guaranteed" and not placed_on_swap(pod)
    assert not any(key.startswith("swapwise.io/") for key in pod_annotations(pod))
    # ... raiseLimit keeps the VPA's request and raises the limit to request / requestRatio.
    pod = pods["late-raise"]
    assert memory(pod) == (GI, 3 * GI)
    assert json.loads(pod_annotations(pod)["swapwise.io/original"]) == {
        "app": {"request": "1Gi", "limit": "1Gi"}}
    assert pod["status"]["qosClass"] == "Burstable" and placed_on_swap(pod)

    # What a client sees: the same pod, server-side dry-run, owned by the same ReplicaSet (the
    # VPA matches pods through their owner), with the warnings both webhooks return.
    for namespace, expected in WARNINGS.items():
        stored = pods[namespace]
        would_be, warnings = dry_run(cp, namespace, stored["metadata"]["ownerReferences"])
        print(f"{namespace} dry-run warnings: {warnings}")
        assert warnings == expected, namespace
        assert memory(would_be) == memory(stored), namespace

    # Several updater passes: every request is the VPA's target, inside its range: no eviction.
    wait_passes(cluster, PASSES)
    assert cluster.vpa.updater_metric("vpa_updater_controlled_pods_total",
                                      update_mode="Recreate") == len(PROFILES)
    assert cluster.vpa.updater_metric("vpa_updater_evictable_pods_total") == 0
    for namespace, pod in pods.items():
        assert cluster.vpa.evictions(namespace) == 0, namespace
        now = one_pod(cp, namespace)
        assert now["metadata"]["uid"] == pod["metadata"]["uid"], f"{namespace}: pod replaced"
        assert memory(now) == memory(pod)

    # The control: a recommendation the running pod is outside of (1Gi < 1280Mi) is acted on -
    # exactly one eviction, then the new pod is in range and stays.
    set_recommendation(cp, "web", "early-skip", "app", {"cpu": "500m", "memory": "1536Mi"},
                       {"cpu": "250m", "memory": "1280Mi"}, {"cpu": "1", "memory": "2Gi"})
    old = pods["early-skip"]["metadata"]["uid"]
    replaced = wait_for(
        lambda: next((p for p in live_pods(cp, "early-skip")
                      if p["metadata"]["uid"] != old and p["spec"].get("nodeName")), None),
        PASSES * UPDATER_INTERVAL * 4 + 30, interval=1, what="the VPA updater to evict early-skip",
        on_timeout=cluster.vpa.logs)
    print(f"early-skip after the new recommendation: {describe(replaced)}")
    evicted = cp.get_json("pod", "-n", "early-skip", pods["early-skip"]["metadata"]["name"])
    assert evicted["metadata"].get("deletionTimestamp")  # Terminating: no kubelet to finish it
    assert memory(replaced) == (1536 * MI, 2 * GI * 1536 * MI // (683 * MI))
    wait_passes(cluster, PASSES)
    assert cluster.vpa.evictions("early-skip") == 1
    assert one_pod(cp, "early-skip")["metadata"]["uid"] == replaced["metadata"]["uid"]
    for namespace in ("early-raise", "late-skip", "late-raise"):
        assert cluster.vpa.evictions(namespace) == 0, namespace
        assert one_pod(cp, namespace)["metadata"]["uid"] == pods[namespace]["metadata"]["uid"]
    passes = cluster.vpa.updater_passes()
    print(f"updater passes in all: {passes}; evictions: "
          + ", ".join(f"{ns} {cluster.vpa.evictions(ns)}" for ns in PROFILES))

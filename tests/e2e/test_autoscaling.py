"""Scale from zero with Karpenter: reshaped pods get nodes only from a NodePool that declares
swapwise's labels, and consolidation never moves them off nodes that back them
(docs/autoscaling.md).

A control plane of its own (Karpenter provisions for every Pending pod of the cluster and
``swapwise audit`` reads every Node: other modules' pods and nodes must not show up), swapwise
installed by its chart, Karpenter v1.15.0 with its kwok provider and kwok v0.8.0
(tests/e2e/karpenter.py). The scenario, in order:

1. a NodePool ``general`` without swapwise's labels; a Deployment of 40 Guaranteed pods in an
   opted-in namespace, reshaped (2Gi -> 683Mi, need 1999): they stay Pending, Karpenter says
   on the pods that ``general`` is incompatible, no NodeClaim is made, and ``swapwise audit``
   reports ``reshaped-pods-unplaceable`` naming the labels and values missing;
2. pods of a namespace that did not opt in get a node from ``general`` meanwhile;
3. NodePools ``swap`` (declares ``swapwise.io/swap-node: "true"``,
   ``swapwise.io/swap-permille: "2000"``) and ``swap-thin`` (the same with ``"1000"``): every
   reshaped pod binds to a node of ``swap``, whose labels back it; ``swap-thin`` gets no node;
   the audit finding is gone; 10 more replicas bind too (a scale-up with the pool in place);
   pods that are not reshaped get nodes from ``swap`` as well when they ask for it;
4. the Deployment scaled down to 8: Karpenter consolidates the ``swap`` nodes, and on every
   poll each bound reshaped pod is on a node that backs it (never ``general``, whose node has
   room for them all).

Figures (pods bound, nodes provisioned, seconds from creation to binding, consolidation) are
printed and written to build/autoscaling/karpenter.json.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import (
    PROFILE_LABEL,
    SWAP_LABEL,
    ControlPlane,
    ensure_binaries,
    skip_unless_e2e,
    swapwise_executable,
)
from tests.e2e.install import Installation, container, installed
from tests.e2e.karpenter import NODEPOOL_LABEL, Karpenter
from webhook.base.quantity import parse_quantity
from webhook.engine.backing import PERMILLE_LABEL, container_need

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
FIGURES = REPO / "build" / "autoscaling" / "karpenter.json"
SWAP_NODE = SWAP_LABEL  # swapwise.io/swap-node: the profile's default placement.nodeSelector
PROFILE = "sandbox"
PROFILES = {PROFILE: {"swapRatio": 2}}
SANDBOXES, PLAIN = "sandboxes", "plain"  # opted in; not
REPLICAS, MORE, AFTER = 40, 50, 8
SWAP_TYPE = "s-2x-amd64-linux"  # kwok's: 2 CPUs, 8Gi, 32 pods: 11 reshaped pods of 683Mi
GENERAL_TYPE = "c-8x-amd64-linux"  # 8 CPUs, 16Gi: room for every reshaped pod left in step 4
SWAP_LABELS = {SWAP_NODE: "true", PERMILLE_LABEL: "2000",
               "swapwise.io/swap-behavior": "LimitedSwap"}
THIN_LABELS = {**SWAP_LABELS, PERMILLE_LABEL: "1000"}
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"


def deployment(name: str, namespace: str, replicas: int, memory: str, cpu: str, *,
               guaranteed: bool = True, pool: str | None = None,
               annotations: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {"app": name}
    spec: dict[str, Any] = {"containers": [container("app", memory, cpu, guaranteed)],
                            "terminationGracePeriodSeconds": 0}
    if pool:
        spec["nodeSelector"] = {NODEPOOL_LABEL: pool}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels,
                                           "annotations": dict(annotations or {})},
                              "spec": spec}},
    }


def timestamp(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def need_of(pod: dict[str, Any]) -> int:
    """The pod's need from its own resources (not from the affinity the webhook wrote)."""
    resources = pod["spec"]["containers"][0]["resources"]
    request = math.ceil(parse_quantity(resources["requests"]["memory"]))
    limit = math.ceil(parse_quantity(resources["limits"]["memory"]))
    return container_need(request, limit)


def backs(node: dict[str, Any] | None, need: int) -> bool:
    labels = (node or {}).get("metadata", {}).get("labels", {})
    permille = labels.get(PERMILLE_LABEL, "")
    return labels.get(SWAP_NODE) == "true" and permille.isdigit() and int(permille) >= need


def bound_at(pod: dict[str, Any]) -> float | None:
    for condition in pod.get("status", {}).get("conditions", []):
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return timestamp(condition["lastTransitionTime"])
    return None


def seconds(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values), 1), "median": round(statistics.median(values), 1),
            "max": round(max(values), 1)}


class Scene:
    """The cluster as the test reads it, in one pass."""

    def __init__(self, cp: ControlPlane, karpenter: Karpenter) -> None:
        self.cp, self.karpenter = cp, karpenter

    def pods(self, namespace: str, app: str | None = None) -> list[dict[str, Any]]:
        selector = ["-l", f"app={app}"] if app else []
        items: list[dict[str, Any]] = self.cp.get_json("pods", "-n", namespace,
                                                       *selector)["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def bound(self, namespace: str, app: str, count: int | None = None,
              ) -> list[dict[str, Any]] | None:
        """The app's pods once there are ``count`` of them (any number: None) and all are
        bound; else None (for polling)."""
        self.karpenter.check_alive()
        pods = self.pods(namespace, app)
        if not pods or (count is not None and len(pods) != count):
            return None
        return pods if all(p["spec"].get("nodeName") for p in pods) else None

    def created(self, namespace: str, app: str, count: int) -> list[dict[str, Any]] | None:
        pods = self.pods(namespace, app)
        return pods if len(pods) == count else None

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {n["metadata"]["name"]: n for n in self.cp.get_json("nodes")["items"]}

    def claims(self, pool: str) -> list[dict[str, Any]]:
        return [c for c in self.karpenter.nodeclaims()
                if c["metadata"].get("labels", {}).get(NODEPOOL_LABEL) == pool]

    def unbacked(self) -> list[str]:
        """Reshaped pods bound to a node that does not back them (the invariant: none)."""
        nodes = self.nodes()
        wrong = []
        for pod in self.pods(SANDBOXES):
            name = pod["spec"].get("nodeName")
            if name and not backs(nodes.get(name), need_of(pod)):
                labels = nodes.get(name, {}).get("metadata", {}).get("labels", {})
                wrong.append(f"{pod['metadata']['name']} on {name} "
                             f"({NODEPOOL_LABEL}={labels.get(NODEPOOL_LABEL)}, "
                             f"{PERMILLE_LABEL}={labels.get(PERMILLE_LABEL)})")
        return wrong


def audit(cp: ControlPlane, install: Installation) -> list[dict[str, Any]]:
    policy = install.workdir / "policy" / "policy.yaml"  # the chart's, as the server reads it
    proc = subprocess.run([swapwise_executable(), "audit", "--kubeconfig", str(cp.kubeconfig),
                           "--policy", str(policy), "-o", "json"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    findings: list[dict[str, Any]] = json.loads(proc.stdout)["findings"]
    return findings


def karpenter_refusals(cp: ControlPlane, namespace: str) -> list[str]:
    """Karpenter's FailedScheduling messages on the namespace's pods (the scheduler's own
    events have the same reason)."""
    events = cp.get_json("events", "-n", namespace)["items"]
    return [e.get("message", "") for e in events if e.get("reason") == "FailedScheduling"
            and "karpenter" in (e.get("source", {}).get("component", ""),
                                e.get("reportingComponent", ""))]


@pytest.fixture(scope="module")
def cluster(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ControlPlane, Karpenter, Installation]]:
    skip_unless_e2e()
    workdir = tmp_path_factory.mktemp("autoscaling")
    (workdir / "install").mkdir()
    with ControlPlane(ensure_binaries()) as cp, \
            installed(cp, workdir / "install", PROFILES, opted_in=(SANDBOXES, PROFILE)) as install:
        cp.create_namespace(PLAIN)
        with Karpenter(cp, workdir / "karpenter") as karpenter:
            yield cp, karpenter, install


def test_karpenter_scales_swap_nodes_from_zero_for_reshaped_pods(
    cluster: tuple[ControlPlane, Karpenter, Installation],
) -> None:
    cp, karpenter, install = cluster
    scene = Scene(cp, karpenter)
    started = time.monotonic()
    figures: dict[str, Any] = {"karpenter": "v1.15.0 (kwok provider)", "kwok": "v0.8.0",
                               "replicas": REPLICAS, "swapInstanceType": SWAP_TYPE}

    # 1. Only a NodePool without swapwise's labels: the reshaped pods wait, and nothing is made.
    karpenter.nodepool("general", instance_types=[GENERAL_TYPE], consolidate_after="Never")
    cp.apply(json.dumps(deployment("sandbox", SANDBOXES, REPLICAS, "2Gi", "100m")))
    created = cp.wait_for(lambda: scene.created(SANDBOXES, "sandbox", REPLICAS), 60,
                          what=f"{REPLICAS} sandbox pods")
    for pod in created:
        assert pod["metadata"]["annotations"][PROFILE_LABEL] == PROFILE
        assert pod["spec"]["containers"][0]["resources"]["requests"]["memory"] == "683Mi"
        assert need_of(pod) == 1999
    refusals = cp.wait_for(lambda: karpenter_refusals(cp, SANDBOXES), 180,
                           what="Karpenter to weigh the reshaped pods against NodePool general")
    assert any("incompatible requirements" in m and "does not have known values" in m
               and "swapwise.io/" in m for m in refusals), refusals
    assert scene.claims("general") == [], "Karpenter made a node for pods no pool can take"
    assert not [p for p in scene.pods(SANDBOXES) if p["spec"].get("nodeName")]
    figures["karpenterRefusal"] = next(m for m in refusals if "swapwise.io/" in m)

    deadlock = [f for f in audit(cp, install) if f["check"] == "reshaped-pods-unplaceable"]
    assert [(f["namespace"], f["owner"], len(f["details"]["pods"])) for f in deadlock] == [
        (SANDBOXES, "Deployment/sandbox", REPLICAS)]
    assert deadlock[0]["details"]["missing"] == [
        f"{SWAP_NODE}=true", f"{PERMILLE_LABEL} > 1998 (>= 1999)"]
    assert deadlock[0]["details"]["nodePools"] == ["general"]

    # 2. Pods swapwise leaves alone get a node from that NodePool meanwhile.
    cp.apply(json.dumps(deployment("plain-general", PLAIN, 2, "1Gi", "500m", pool="general",
                                   annotations={DO_NOT_DISRUPT: "true"})))
    plain = cp.wait_for(lambda: scene.bound(PLAIN, "plain-general"), 300,
                        what="plain pods bound to a node of NodePool general")
    nodes = scene.nodes()
    for pod in plain:
        assert PROFILE_LABEL not in pod["metadata"].get("annotations", {})
        assert nodes[pod["spec"]["nodeName"]]["metadata"]["labels"][NODEPOOL_LABEL] == "general"
    # Karpenter weighed the reshaped pods again in that pass: one node, for the plain pods,
    # with room for many reshaped ones, and none of them on it or anywhere.
    assert len(scene.claims("general")) == 1
    assert not [p for p in scene.pods(SANDBOXES) if p["spec"].get("nodeName")]
    figures["secondsPendingBeforeSwapPool"] = round(
        time.time() - min(timestamp(p["metadata"]["creationTimestamp"]) for p in created), 1)

    # 3. NodePools that declare the labels: one backs the pods, one declares too little swap.
    pool_created = time.time()
    karpenter.nodepool("swap", labels=SWAP_LABELS, instance_types=[SWAP_TYPE])
    karpenter.nodepool("swap-thin", labels=THIN_LABELS, instance_types=[SWAP_TYPE])

    bound = cp.wait_for(lambda: scene.bound(SANDBOXES, "sandbox", REPLICAS), 600,
                        what=f"all {REPLICAS} reshaped pods bound")
    all_bound_after = time.time() - pool_created
    assert scene.unbacked() == []
    nodes = scene.nodes()
    assert {nodes[p["spec"]["nodeName"]]["metadata"]["labels"][NODEPOOL_LABEL]
            for p in bound} == {"swap"}
    assert scene.claims("swap-thin") == []
    swap_nodes = len(scene.claims("swap"))
    times = [bound_at(p) for p in bound]
    assert None not in times
    figures["deadlockThenPool"] = {
        "podsBound": len(bound),
        "nodesProvisioned": {"swap": swap_nodes, "swap-thin": 0,
                             "general": len(scene.claims("general"))},
        "secondsNodePoolToAllBound": round(all_bound_after, 1),
        "createToBoundSeconds": seconds([t - timestamp(p["metadata"]["creationTimestamp"])
                                         for t, p in zip(times, bound, strict=True) if t]),
        "nodePoolToBoundSeconds": seconds([t - pool_created for t in times if t]),
    }
    assert [f for f in audit(cp, install) if f["check"] == "reshaped-pods-unplaceable"] == []

    # A scale-up with the pool in place: the new pods' own creation-to-binding time.
    before = {p["metadata"]["name"] for p in bound}
    cp.kubectl("scale", "deployment", "sandbox", "-n", SANDBOXES, f"--replicas={MORE}")
    bound = cp.wait_for(lambda: scene.bound(SANDBOXES, "sandbox", MORE), 600,
                        what=f"all {MORE} reshaped pods bound")
    assert scene.unbacked() == []
    new = [p for p in bound if p["metadata"]["name"] not in before]
    figures["scaleUp"] = {
        "pods": len(new),
        "createToBoundSeconds": seconds([
            (bound_at(p) or math.inf) - timestamp(p["metadata"]["creationTimestamp"])
            for p in new]),
        "swapNodes": len(scene.claims("swap")),
    }

    # Pods swapwise leaves alone get nodes from the swap NodePool too when they ask for it.
    cp.apply(json.dumps(deployment("plain-swap", PLAIN, 2, "1Gi", "300m", pool="swap")))
    plain = cp.wait_for(lambda: scene.bound(PLAIN, "plain-swap"), 300,
                        what="plain pods bound to a node of NodePool swap")
    nodes = scene.nodes()
    for pod in plain:
        assert PROFILE_LABEL not in pod["metadata"].get("annotations", {})
        assert nodes[pod["spec"]["nodeName"]]["metadata"]["labels"][NODEPOOL_LABEL] == "swap"

    # 4. Consolidation: fewer replicas, and Karpenter packs what is left onto fewer nodes.
    before_nodes = {c["status"].get("nodeName") for c in scene.claims("swap")}
    before_pods = {p["metadata"]["name"] for p in scene.pods(SANDBOXES, "sandbox")}
    consolidation_started = time.monotonic()
    cp.kubectl("scale", "deployment", "sandbox", "-n", SANDBOXES, f"--replicas={AFTER}")
    polls, violations = 0, []
    moved: set[str] = set()
    stable_since: float | None = None
    last: tuple[int, ...] = ()

    def consolidated() -> bool:
        nonlocal polls, stable_since, last
        karpenter.check_alive()
        polls += 1
        violations.extend(scene.unbacked())
        pods = scene.pods(SANDBOXES, "sandbox")
        moved.update(p["metadata"]["name"] for p in pods
                     if p["metadata"]["name"] not in before_pods)
        claims = scene.claims("swap")
        settled = (len(pods) == AFTER and all(p["spec"].get("nodeName") for p in pods)
                   and not any(c["metadata"].get("deletionTimestamp") for c in claims))
        state = (len(claims), len(moved))
        if not settled or state != last:
            stable_since, last = None, state
            return False
        stable_since = stable_since or time.monotonic()
        # Quiet for 45 s (Karpenter's disruption loop runs every 10 s) after a node went.
        return len(claims) < len(before_nodes) and time.monotonic() - stable_since >= 45

    cp.wait_for(consolidated, 900, interval=1.0,
                what="Karpenter to consolidate the swap nodes and settle")
    assert violations == [], violations
    after_claims = scene.claims("swap")
    assert moved, ("consolidation removed only empty nodes: no reshaped pod was moved, so "
                   "the test shows nothing about where it moves them")
    assert [p for p in scene.pods(SANDBOXES)
            if scene.nodes()[p["spec"]["nodeName"]]["metadata"]["labels"][NODEPOOL_LABEL]
            != "swap"] == []
    assert scene.claims("swap-thin") == []
    figures["consolidation"] = {
        "replicasAfter": AFTER,
        "swapNodesBefore": len(before_nodes),
        "swapNodesAfter": len(after_claims),
        "reshapedPodsMoved": len(moved),
        "polls": polls,
        "violations": 0,
        "seconds": round(time.monotonic() - consolidation_started, 1),
    }
    figures["testSeconds"] = round(time.monotonic() - started, 1)

    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"\nautoscaling figures ({FIGURES}):\n{json.dumps(figures, indent=2)}")

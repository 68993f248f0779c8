"""The pressure guard's mark as the scheduler sees it: real kube-apiserver and scheduler, the
chart's webhook, fake swap nodes.

``swapwise label-nodes --pressure-guard`` labels a thrashing swap node
``swapwise.io/memory-pressure: "true"`` (tests/e2e/test_labeller.py puts it there from a
kubelet's PSI); the webhook gives every pod it places with ``placement.mode: required``
``{key: swapwise.io/memory-pressure, operator: DoesNotExist}`` in every required term
(docs/rules.md "The memory-pressure mark"). Here the label is set by hand on one of two
otherwise equal swap nodes, and the real scheduler decides: reshaped pods avoid the marked
node, a pod of a namespace that did not opt in does not, and with both nodes marked a reshaped
pod stays Pending with the scheduler's node-affinity reason until one is cleared.

The two nodes carry a pool label only this module's profile selects and a taint only its
pods tolerate, and are deleted afterwards, so no other module's pods land on them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.cluster import PROFILE_LABEL, SWAP_LABEL, ControlPlane
from tests.e2e.install import Installation, container, installed, manifest, pod
from webhook.engine.backing import PERMILLE_LABEL, node_permille
from webhook.engine.pressure import PRESSURE_LABEL

pytestmark = pytest.mark.e2e

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
POOL = "e2e.swapwise.io/pressure-pool"
CALM, HOT = "pressure-calm", "pressure-hot"
OPTED_IN, OTHER = "pressure-opted-in", "pressure-other"
TOLERATION = {"key": POOL, "operator": "Exists", "effect": "NoSchedule"}
PROFILES = {"guarded": {"swapRatio": 2, "placement": {
    "nodeSelector": {SWAP_LABEL: "true", POOL: "yes"}, "tolerations": [TOLERATION]}}}
NO_PRESSURE = {"key": PRESSURE_LABEL, "operator": "DoesNotExist"}
# The nodeSelector's pairs (in key order), no mark, and the backing entry: 2Gi -> 683Mi needs
# 1999 per mille (docs/rules.md "Swap backing"); the nodes have 2000
EXPRESSIONS = [
    {"key": POOL, "operator": "In", "values": ["yes"]},
    {"key": SWAP_LABEL, "operator": "In", "values": ["true"]},
    NO_PRESSURE,
    {"key": PERMILLE_LABEL, "operator": "Gt", "values": ["1998"]},
]
NODE_AFFINITY = "didn't match Pod's node affinity/selector"


@pytest.fixture(scope="module")
def nodes(control_plane: ControlPlane) -> Iterator[tuple[str, str]]:
    """Two equal swap nodes (16Gi RAM + 32Gi swap, the per-mille label-nodes writes); HOT
    carries the pressure guard's mark."""
    cp = control_plane
    labels = {SWAP_LABEL: "true", POOL: "yes",
              PERMILLE_LABEL: str(node_permille(32 << 30, 16 << 30))}
    cp.create_node(CALM, memory="16Gi", cpu="8", labels=labels, swap_capacity=32 << 30)
    cp.create_node(HOT, memory="16Gi", cpu="8", labels={**labels, PRESSURE_LABEL: "true"},
                   swap_capacity=32 << 30)
    for name in (CALM, HOT):
        cp.kubectl("taint", "node", name, f"{POOL}=yes:NoSchedule")
    try:
        yield CALM, HOT
    finally:
        for namespace in (OPTED_IN, OTHER):
            cp.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0",
                       "--force", "--wait=true", check=False)
        cp.kubectl("delete", "node", CALM, HOT, "--wait=false", check=False)


@pytest.fixture(scope="module")
def swapwise(
    control_plane: ControlPlane, nodes: tuple[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Installation]:
    with installed(control_plane, tmp_path_factory.mktemp("install"), PROFILES,
                   opted_in=(OPTED_IN, "guarded")) as install:
        control_plane.create_namespace(OTHER)
        yield install


def get(cp: ControlPlane, name: str, namespace: str) -> dict[str, Any]:
    found: dict[str, Any] = cp.get_json("pod", name, "-n", namespace)
    return found


def bound(cp: ControlPlane, name: str, namespace: str) -> str:
    node: str = cp.wait_for(lambda: get(cp, name, namespace)["spec"].get("nodeName"),
                            what=f"pod {namespace}/{name} to be bound")
    return node


def unschedulable(cp: ControlPlane, name: str, namespace: str) -> str:
    """The scheduler's message once it has given up on the pod (it stays unbound)."""
    def message() -> str | None:
        p = get(cp, name, namespace)
        conditions = {c["type"]: c for c in p["status"].get("conditions", [])}
        scheduled = conditions.get("PodScheduled", {})
        if scheduled.get("reason") == "Unschedulable":
            assert not p["spec"].get("nodeName")
            return str(scheduled.get("message", ""))
        return None
    text: str = cp.wait_for(message, what=f"pod {namespace}/{name} to be unschedulable")
    return text


def sandbox(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """The 2Gi / 100m Guaranteed pod."""
    return pod(name, namespace, container(memory="2Gi", cpu="100m"), **spec)


def test_reshaped_pods_are_all_bound_to_the_unmarked_node(
    control_plane: ControlPlane, swapwise: Installation, nodes: tuple[str, str]
) -> None:
    cp = control_plane
    calm, _ = nodes
    # Equal nodes: without the entry the scheduler's spreading puts about half on each.
    names = [f"reshaped-{i}" for i in range(8)]
    cp.apply(manifest(*(sandbox(name, OPTED_IN) for name in names)))
    placed = {name: bound(cp, name, OPTED_IN) for name in names}
    assert set(placed.values()) == {calm}, placed
    for name in names:
        p = get(cp, name, OPTED_IN)
        assert p["metadata"]["annotations"][PROFILE_LABEL] == "guarded"
        assert p["spec"]["containers"][0]["resources"]["requests"]["memory"] == "683Mi"
        assert p["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"] == [
            {"matchExpressions": EXPRESSIONS}]
    cp.kubectl("delete", "pods", "--all", "-n", OPTED_IN, "--grace-period=0", "--force",
               "--wait=true")


def test_a_pod_of_a_namespace_that_did_not_opt_in_can_go_to_the_marked_node(
    control_plane: ControlPlane, swapwise: Installation, nodes: tuple[str, str]
) -> None:
    cp = control_plane
    _, hot = nodes
    # The same pod, pinned to the marked node by its own nodeSelector (and tolerating the
    # test's taint): the mark is a label, not a taint, so it is bound there.
    pinned = {"nodeSelector": {"kubernetes.io/hostname": hot}, "tolerations": [TOLERATION]}
    cp.apply(json.dumps(sandbox("pinned", OTHER, **pinned)))
    assert bound(cp, "pinned", OTHER) == hot
    other = get(cp, "pinned", OTHER)
    assert PROFILE_LABEL not in (other["metadata"].get("annotations") or {})
    assert "affinity" not in other["spec"]
    assert other["status"]["qosClass"] == "Guaranteed"
    # The same pinned pod in the opted-in namespace is reshaped, and the scheduler keeps it
    # off the marked node: nowhere to go.
    cp.apply(json.dumps(sandbox("pinned", OPTED_IN, **pinned)))
    assert NODE_AFFINITY in unschedulable(cp, "pinned", OPTED_IN)
    cp.kubectl("delete", "pod", "pinned", "-n", OPTED_IN, "--grace-period=0", "--force",
               "--wait=true")
    cp.kubectl("delete", "pod", "pinned", "-n", OTHER, "--grace-period=0", "--force",
               "--wait=true")


def test_with_both_nodes_marked_a_reshaped_pod_stays_pending_until_one_is_cleared(
    control_plane: ControlPlane, swapwise: Installation, nodes: tuple[str, str]
) -> None:
    cp = control_plane
    calm, hot = nodes
    cp.kubectl("label", "node", calm, f"{PRESSURE_LABEL}=true")
    try:
        cp.apply(json.dumps(sandbox("waiting", OPTED_IN)))
        message = unschedulable(cp, "waiting", OPTED_IN)
        assert NODE_AFFINITY in message, message
        waiting = get(cp, "waiting", OPTED_IN)
        assert NO_PRESSURE in waiting["spec"]["affinity"]["nodeAffinity"][REQUIRED][
            "nodeSelectorTerms"][0]["matchExpressions"]
        # Nothing else keeps it off: the guard clears the mark, the scheduler binds it.
        cp.kubectl("label", "node", hot, f"{PRESSURE_LABEL}-")
        assert bound(cp, "waiting", OPTED_IN) == hot
    finally:
        cp.kubectl("label", "node", calm, f"{PRESSURE_LABEL}-", check=False)
        cp.kubectl("label", "node", hot, f"{PRESSURE_LABEL}=true", "--overwrite", check=False)
        cp.kubectl("delete", "pods", "--all", "-n", OPTED_IN, "--grace-period=0", "--force",
                   "--wait=true", check=False)

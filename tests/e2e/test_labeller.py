"""`swapwise label-nodes` against a real API server: labels follow the swap nodes.

Fake Nodes report `status.nodeInfo.swap.capacity` (changed through the status subresource,
as a kubelet would) and declare their kubelet's swapBehavior with the node label
`swapwise.io/swap-behavior`; real `swapwise label-nodes` processes watch them. Each test
manages a label key of its own, so the session's other tests keep the NFD label exactly as
they set it, and counters can be predicted exactly. The `kubelet` source against a real
kubelet is tested in tests/node/; here only its failure path (fake nodes have no kubelet).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import (
    K8S_VERSION,
    ClusterError,
    Component,
    ControlPlane,
    free_port,
    swapwise_executable,
    wait_for,
)

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
GI = 1024**3
BEHAVIOR = "swapwise.io/swap-behavior"
ANNOTATION = "swapwise.io/swap-node"
PERMILLE = "swapwise.io/swap-permille"  # one key for every labeller: the value is the node's
LIMITED = {BEHAVIOR: "LimitedSwap"}  # what the node admin sets with kubelet --node-labels
# Short election timing so takeovers take seconds (defaults: 15 / 10 / 2).
TIMING = ["--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5"]


class LabellerProcess:
    """One `swapwise label-nodes` process with its own metrics port and log."""

    def __init__(
        self,
        cp: ControlPlane,
        identity: str,
        label: str,
        lease: str,
        namespace: str = "default",
        kubeconfig: Path | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.identity = identity
        self.port = free_port()
        workdir = cp.workdir / "labeller"
        workdir.mkdir(exist_ok=True)
        argv = [
            swapwise_executable(),
            "label-nodes",
            "--kubeconfig",
            str(kubeconfig or cp.kubeconfig),
            "--label",
            f"{label}=true",
            "--lease-name",
            lease,
            "--lease-namespace",
            namespace,
            "--identity",
            identity,
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(self.port),
            *TIMING,
            *extra,
        ]
        self.component = Component(f"labeller-{identity}", argv, workdir / f"{identity}.log")

    def _get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read().decode()

    def start(self) -> LabellerProcess:
        self.component.start()

        def ready() -> bool:
            self.component.check_alive()
            return self._get("/readyz")[0] == 200

        wait_for(ready, 30, what=f"{self.identity} /readyz", on_timeout=self.component.tail)
        return self

    def metrics(self) -> dict[str, float]:
        status, text = self._get("/metrics")
        assert status == 200, text
        values = {}
        for line in text.splitlines():
            if line.startswith("swapwise_labeller_"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def leading(self) -> bool:
        return self.metrics()["swapwise_labeller_is_leader"] == 1.0

    def stop(self) -> None:
        self.component.stop()


def labels(cp: ControlPlane, node: str) -> dict[str, str]:
    return dict(cp.get_json("node", node)["metadata"].get("labels") or {})


def annotation(cp: ControlPlane, node: str) -> str | None:
    value = (cp.get_json("node", node)["metadata"].get("annotations") or {}).get(ANNOTATION)
    return None if value is None else str(value)


def set_swap(cp: ControlPlane, node: str, capacity: int | None) -> None:
    """What a kubelet reports: through the status subresource (null removes the field)."""
    patch = {"status": {"nodeInfo": {"swap": None if capacity is None else {"capacity": capacity}}}}
    cp.kubectl(
        "patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(patch)
    )


def swap_nodes(cp: ControlPlane) -> set[str]:
    """Swap nodes of the session: swap capacity and declared LimitedSwap."""
    return {
        n["metadata"]["name"]
        for n in cp.get_json("nodes")["items"]
        if ((n["status"].get("nodeInfo") or {}).get("swap") or {}).get("capacity", 0) > 0
        and (n["metadata"].get("labels") or {}).get(BEHAVIOR) == "LimitedSwap"
    }


def wait_label(cp: ControlPlane, node: str, key: str, present: bool) -> None:
    cp.wait_for(
        lambda: (labels(cp, node).get(key) == "true") == present,
        20,
        what=f"label {key} {'on' if present else 'off'} node {node}",
    )


def lease(cp: ControlPlane, name: str, namespace: str = "default") -> dict[str, Any]:
    spec: dict[str, Any] = cp.get_json("lease", name, "-n", namespace)["spec"]
    return spec


def test_label_follows_swap_capacity(control_plane: ControlPlane) -> None:
    cp = control_plane
    key = "e2e.swapwise.io/swap-follow"
    cp.create_node(
        "follow-swap", memory="16Gi", cpu="8", labels={"team": "a", **LIMITED},
        swap_capacity=8 * GI,
    )
    cp.create_node(
        "follow-plain", memory="16Gi", cpu="8", labels={key: "true", "team": "b", **LIMITED}
    )
    labelled_at_start = len(swap_nodes(cp))  # every swap node in the session gets the key
    labeller = LabellerProcess(cp, "follow", key, "labeller-follow").start()
    try:
        wait_label(cp, "follow-swap", key, True)
        wait_label(cp, "follow-plain", key, False)
        assert labels(cp, "follow-swap")["team"] == "a"  # other labels untouched
        assert labels(cp, "follow-plain")["team"] == "b"
        assert annotation(cp, "follow-swap") == (
            f"true: declared swapBehavior LimitedSwap, swap capacity {8 * GI} bytes, memory "
            f"capacity {16 * GI} bytes: {PERMILLE}=500 (source: node label {BEHAVIOR})"
        )
        assert annotation(cp, "follow-plain") == (
            "false: no swap capacity reported (status.nodeInfo.swap.capacity)"
        )

        set_swap(cp, "follow-plain", 4 * GI)  # swap appears
        wait_label(cp, "follow-plain", key, True)
        # Swap turned off: the field is no longer reported. (Not capacity 0: the API server
        # refuses 0 on create and on every later Node update, so a status write of 0 would
        # leave a Node nobody can patch; the unit tests cover 0.)
        set_swap(cp, "follow-swap", None)
        wait_label(cp, "follow-swap", key, False)
        set_swap(cp, "follow-plain", None)
        wait_label(cp, "follow-plain", key, False)
        assert labels(cp, "follow-swap")["team"] == "a"

        metrics = labeller.metrics()
        assert metrics["swapwise_labeller_labels_added_total"] == labelled_at_start + 1
        # follow-plain at start, then follow-swap and follow-plain.
        assert metrics["swapwise_labeller_labels_removed_total"] == 3
        assert metrics["swapwise_labeller_reconcile_errors_total"] == 0
        assert metrics["swapwise_labeller_is_leader"] == 1
        assert lease(cp, "labeller-follow")["holderIdentity"] == "follow"
    finally:
        labeller.stop()


def set_status(cp: ControlPlane, node: str, status: dict[str, Any]) -> None:
    """A merge patch of the node's status, through the status subresource."""
    cp.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p",
               json.dumps({"status": status}))


def wait_permille(cp: ControlPlane, node: str, value: str | None) -> None:
    cp.wait_for(lambda: labels(cp, node).get(PERMILLE) == value, 20,
                what=f"{PERMILLE}={value} on node {node}")


def test_swap_permille_follows_swap_and_memory_capacity(control_plane: ControlPlane) -> None:
    """The per-mille label: its value from the node's status, kept current through /status
    changes, gone when the node is no longer a swap node or its memory is not reported."""
    cp = control_plane
    key = "e2e.swapwise.io/swap-permille"
    cp.create_node("permille-a", memory="16Gi", cpu="8", labels=LIMITED, swap_capacity=8 * GI)
    # The harness node's figures: 1000 * 4294963200 / (2012108 * 1024) = 2084.5.
    cp.create_node("permille-b", memory="2012108Ki", cpu="2", labels=LIMITED,
                   swap_capacity=4294963200)
    # A per-mille left on a node that has no swap (e.g. by hand): swapwise's label, removed.
    cp.create_node("permille-stale", memory="16Gi", cpu="8", labels={**LIMITED, PERMILLE: "2000"})
    labeller = LabellerProcess(cp, "permille", key, "labeller-permille").start()
    try:
        wait_permille(cp, "permille-a", "500")
        wait_permille(cp, "permille-b", "2084")
        wait_permille(cp, "permille-stale", None)
        assert labels(cp, "permille-a")[key] == "true"
        assert annotation(cp, "permille-b") == (
            "true: declared swapBehavior LimitedSwap, swap capacity 4294963200 bytes, memory "
            f"capacity 2060398592 bytes: {PERMILLE}=2084 (source: node label {BEHAVIOR})"
        )

        set_swap(cp, "permille-a", 4 * GI)  # the kubelet restarted with less swap
        wait_permille(cp, "permille-a", "250")
        set_status(cp, "permille-a", {"capacity": {"memory": "32Gi"}})  # more RAM
        wait_permille(cp, "permille-a", "125")
        assert f"memory capacity {32 * GI} bytes: {PERMILLE}=125" in str(
            annotation(cp, "permille-a"))

        # Memory capacity no longer reported: still a swap node, no per-mille, and why.
        set_status(cp, "permille-b", {"capacity": {"memory": None}})
        wait_permille(cp, "permille-b", None)
        assert labels(cp, "permille-b")[key] == "true"
        assert annotation(cp, "permille-b") == (
            "true: declared swapBehavior LimitedSwap, swap capacity 4294963200 bytes; no "
            f"{PERMILLE}: no memory capacity reported (status.capacity.memory) "
            f"(source: node label {BEHAVIOR})"
        )
        set_status(cp, "permille-b", {"capacity": {"memory": "4Gi"}})
        wait_permille(cp, "permille-b", "999")  # 4294963200000 / 4294967296 = 999.999

        # Declared NoSwap: not a swap node any more, both labels go; back, both return.
        cp.kubectl("label", "node", "permille-a", f"{BEHAVIOR}=NoSwap", "--overwrite")
        wait_permille(cp, "permille-a", None)
        assert key not in labels(cp, "permille-a")
        cp.kubectl("label", "node", "permille-a", f"{BEHAVIOR}=LimitedSwap", "--overwrite")
        wait_permille(cp, "permille-a", "125")
        set_swap(cp, "permille-a", None)  # swap turned off
        wait_permille(cp, "permille-a", None)
        wait_label(cp, "permille-a", key, False)

        nodes = cp.get_json("nodes")["items"]
        carrying = sum(PERMILLE in (n["metadata"].get("labels") or {}) for n in nodes)
        cp.wait_for(lambda: labeller.metrics()["swapwise_labeller_permille_nodes"] == carrying,
                    10, what=f"permille_nodes gauge {carrying}")
        log = labeller.component.tail(400)
        assert '"node": "permille-a"' in log and '"permille": 250' in log
        assert f'"swap_bytes": {4 * GI}, "memory_bytes": {16 * GI}' in log
        assert labeller.metrics()["swapwise_labeller_reconcile_errors_total"] == 0
    finally:
        labeller.stop()


def test_a_node_declared_noswap_is_not_labelled_and_its_annotation_says_why(
    control_plane: ControlPlane,
) -> None:
    """Swap capacity alone is not a swap node: the kubelet must run LimitedSwap."""
    cp = control_plane
    key = "e2e.swapwise.io/swap-declared"
    cp.create_node(
        "declared-noswap", memory="16Gi", cpu="8", labels={BEHAVIOR: "NoSwap", key: "true"},
        swap_capacity=8 * GI,
    )
    cp.create_node("declared-none", memory="16Gi", cpu="8", swap_capacity=8 * GI)
    labeller = LabellerProcess(cp, "declared", key, "labeller-declared").start()
    try:
        wait_label(cp, "declared-noswap", key, False)
        assert annotation(cp, "declared-noswap") == (
            f"false: declared swapBehavior NoSwap (source: node label {BEHAVIOR})"
        )
        cp.wait_for(lambda: annotation(cp, "declared-none") is not None, 20,
                    what="annotation on declared-none")
        assert annotation(cp, "declared-none") == (
            f"false: swap capacity {8 * GI} bytes but swapBehavior undeclared "
            f"(set node label {BEHAVIOR}=LimitedSwap where the kubelet runs it)"
        )
        assert key not in labels(cp, "declared-none")

        # The admin switches that kubelet to LimitedSwap and says so.
        cp.kubectl("label", "node", "declared-noswap", f"{BEHAVIOR}=LimitedSwap", "--overwrite")
        wait_label(cp, "declared-noswap", key, True)
        assert annotation(cp, "declared-noswap") == (
            f"true: declared swapBehavior LimitedSwap, swap capacity {8 * GI} bytes, memory "
            f"capacity {16 * GI} bytes: {PERMILLE}=500 (source: node label {BEHAVIOR})"
        )
        expected = len(swap_nodes(cp))
        cp.wait_for(
            lambda: labeller.metrics()["swapwise_labeller_swap_nodes"] == expected,
            10,
            what=f"swap_nodes gauge {expected}",
        )
        metrics = labeller.metrics()
        assert metrics['swapwise_labeller_nodes_by_reason{reason="LimitedSwap"}'] == expected
        assert metrics['swapwise_labeller_nodes_by_reason{reason="SwapBehaviorUndeclared"}'] >= 1
        assert "SwapBehaviorNoSwap" in labeller.component.tail(400)  # the removal, logged
    finally:
        labeller.stop()


def test_two_labellers_only_the_leader_acts_and_the_other_takes_over(
    control_plane: ControlPlane,
) -> None:
    cp = control_plane
    key = "e2e.swapwise.io/swap-elect"
    name = "labeller-elect"
    first = LabellerProcess(cp, "elect-1", key, name).start()
    second = LabellerProcess(cp, "elect-2", key, name).start()
    processes = [first, second]
    try:
        cp.wait_for(lambda: sum(p.leading() for p in processes) == 1, 20, what="exactly one leader")
        leader, follower = (first, second) if first.leading() else (second, first)
        assert lease(cp, name)["holderIdentity"] == leader.identity

        cp.create_node("elect-1", memory="16Gi", cpu="8", labels=LIMITED, swap_capacity=8 * GI)
        wait_label(cp, "elect-1", key, True)
        # For 4 s (8 retry periods) there is never a second leader, and only one acts.
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            assert [p.leading() for p in (leader, follower)] == [True, False]
            time.sleep(0.25)
        swap_count = len(swap_nodes(cp))
        assert leader.metrics()["swapwise_labeller_labels_added_total"] == swap_count
        follower_metrics = follower.metrics()
        assert follower_metrics["swapwise_labeller_labels_added_total"] == 0
        assert follower_metrics["swapwise_labeller_labels_removed_total"] == 0

        leader.stop()  # SIGTERM: it releases the Lease on the way out
        cp.wait_for(follower.leading, 10, what=f"{follower.identity} to take over")
        spec = lease(cp, name)
        assert spec["holderIdentity"] == follower.identity
        assert spec["leaseTransitions"] == 1
        set_swap(cp, "elect-1", None)
        wait_label(cp, "elect-1", key, False)
        assert follower.metrics()["swapwise_labeller_labels_removed_total"] == 1
    finally:
        for process in processes:
            process.stop()


def _helm(cp: ControlPlane) -> Path:
    helm = Path(os.environ.get("HELM") or cp.helm)
    if not os.access(helm, os.X_OK):
        raise ClusterError(f"no helm at {helm}: build it with tests/e2e/build-control-plane.sh")
    return helm


def _apply_chart_rbac(cp: ControlPlane, namespace: str, release: str, *sets: str) -> str:
    """Render the chart's labeller RBAC with `--set`s, apply it; return the subject."""
    account = f"{release}-swapwise-labeller"
    cp.create_namespace(namespace)
    rendered = subprocess.run(
        [
            str(_helm(cp)),
            "template",
            release,
            str(REPO / "charts" / "swapwise"),
            "--namespace",
            namespace,
            "--kube-version",
            K8S_VERSION.lstrip("v"),
            "--set",
            "labeller.enabled=true",
            *(arg for value in sets for arg in ("--set", value)),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    rbac = [
        doc
        for doc in yaml.safe_load_all(rendered)
        if doc
        and doc["kind"]
        in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
        and doc["metadata"]["name"] == account
    ]
    assert sorted(doc["kind"] for doc in rbac) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ]
    cp.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac}))
    return f"system:serviceaccount:{namespace}:{account}"


def _can_i(cp: ControlPlane, subject: str, verb: str, resource: str, *scope: str) -> str:
    answer = cp.kubectl(
        "auth", "can-i", verb, resource, *scope, "--as", subject, check=False
    ).stdout.strip()
    return str(answer)


def _account_kubeconfig(cp: ControlPlane, account: str, namespace: str) -> Path:
    """A kubeconfig that acts as ServiceAccount ``namespace/account`` (a fresh token)."""
    token = cp.kubectl("create", "token", account, "-n", namespace).stdout.strip()
    admin = json.loads(cp.kubeconfig.read_text())
    kubeconfig = cp.workdir / f"labeller-{namespace}-{account}.kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": admin["clusters"],
                "users": [{"name": "labeller", "user": {"token": token}}],
                "contexts": [
                    {
                        "name": "sa",
                        "context": {
                            "cluster": admin["clusters"][0]["name"],
                            "user": "labeller",
                            "namespace": namespace,
                        },
                    }
                ],
                "current-context": "sa",
            }
        )
    )
    return kubeconfig


def test_chart_rbac_is_all_the_labeller_needs(control_plane: ControlPlane) -> None:
    """Run under the chart's ServiceAccount: its ClusterRole and Role must be enough."""
    cp = control_plane
    namespace, release = "labeller-rbac", "lbl"
    account = f"{release}-swapwise-labeller"
    subject = _apply_chart_rbac(cp, namespace, release)
    for verb, resource, scope, allowed in (
        ("patch", "nodes", [], "yes"),
        ("watch", "nodes", [], "yes"),
        ("delete", "nodes", [], "no"),
        ("update", "nodes", ["--subresource=status"], "no"),
        ("get", "nodes", ["--subresource=proxy"], "no"),  # the declared source needs none
        ("update", f"leases/{account}", ["-n", namespace], "yes"),
        ("update", "leases/other", ["-n", namespace], "no"),
        ("create", "leases", ["-n", "default"], "no"),
        ("list", "pods", ["-A"], "no"),
    ):
        answer = _can_i(cp, subject, verb, resource, *scope)
        assert answer == allowed, f"{subject} can-i {verb} {resource} {scope}: {answer}"

    kubeconfig = _account_kubeconfig(cp, account, namespace)
    key = "e2e.swapwise.io/swap-rbac"
    labeller = LabellerProcess(cp, "rbac", key, account, namespace, kubeconfig).start()
    try:
        cp.create_node("rbac-1", memory="16Gi", cpu="8", labels=LIMITED, swap_capacity=GI)
        wait_label(cp, "rbac-1", key, True)
        assert str(annotation(cp, "rbac-1")).startswith("true: ")  # patch covers annotations
        set_swap(cp, "rbac-1", None)
        wait_label(cp, "rbac-1", key, False)
        assert lease(cp, account, namespace)["holderIdentity"] == "rbac"
        metrics = labeller.metrics()
        assert metrics["swapwise_labeller_reconcile_errors_total"] == 0
        assert metrics["swapwise_labeller_watch_restarts_total"] == 0
        assert "forbidden" not in labeller.component.tail(200).lower()
    finally:
        labeller.stop()


def test_kubelet_source_leaves_a_node_alone_when_its_kubelet_cannot_be_asked(
    control_plane: ControlPlane,
) -> None:
    """`--swap-behavior-source kubelet` under the chart's kubelet-variant RBAC.

    Fake nodes have no kubelet, so every /configz read through the node proxy fails: a node
    with swap capacity must then keep its label exactly as it is (on or off) and get no
    annotation, and the failures must be the proxy's, never a 403. A node without swap
    capacity is judged without asking its kubelet.
    """
    cp = control_plane
    namespace, release = "labeller-kubelet", "lblk"
    account = f"{release}-swapwise-labeller"
    subject = _apply_chart_rbac(cp, namespace, release, "labeller.swapBehaviorSource=kubelet")
    for verb, allowed in (("get", "yes"), ("create", "no"), ("update", "no"), ("delete", "no")):
        answer = _can_i(cp, subject, verb, "nodes", "--subresource=proxy")
        assert answer == allowed, f"{subject} can-i {verb} nodes/proxy: {answer}"

    key = "e2e.swapwise.io/swap-kubelet"
    cp.create_node(
        "nokubelet-on", memory="16Gi", cpu="8", labels={key: "true", **LIMITED},
        swap_capacity=8 * GI,
    )
    cp.create_node("nokubelet-off", memory="16Gi", cpu="8", labels=LIMITED, swap_capacity=8 * GI)
    cp.create_node("nokubelet-plain", memory="16Gi", cpu="8", labels={key: "true"})
    kubeconfig = _account_kubeconfig(cp, account, namespace)
    labeller = LabellerProcess(
        cp, "kubelet", key, account, namespace, kubeconfig,
        extra=("--swap-behavior-source", "kubelet"),
    ).start()
    try:
        wait_label(cp, "nokubelet-plain", key, False)
        assert annotation(cp, "nokubelet-plain") == (
            "false: no swap capacity reported (status.nodeInfo.swap.capacity)"
        )
        cp.wait_for(
            lambda: labeller.metrics()["swapwise_labeller_kubelet_config_errors_total"] >= 2,
            20,
            what="configz errors counted",
        )
        time.sleep(2)  # retries come and go (backoff): still nothing may change
        assert labels(cp, "nokubelet-on")[key] == "true"
        assert key not in labels(cp, "nokubelet-off")
        assert annotation(cp, "nokubelet-on") is None
        assert annotation(cp, "nokubelet-off") is None
        metrics = labeller.metrics()
        unavailable = 'swapwise_labeller_nodes_by_reason{reason="KubeletConfigUnavailable"}'
        assert metrics[unavailable] >= 2
        assert metrics["swapwise_labeller_reconcile_errors_total"] == 0
        log = labeller.component.tail(400)
        assert "kubelet configz unavailable" in log and '"node": "nokubelet-on"' in log
        assert "forbidden" not in log.lower()
    finally:
        labeller.stop()

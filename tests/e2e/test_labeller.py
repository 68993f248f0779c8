"""`swapwise label-nodes` against a real API server: labels follow the swap nodes.

Fake Nodes report `status.nodeInfo.swap.capacity` (changed through the status subresource,
as a kubelet would) and declare their kubelet's swapBehavior with the node label
`swapwise.io/swap-behavior`; real `swapwise label-nodes` processes watch them. Each test
manages a label key of its own, so the session's other tests keep the NFD label exactly as
they set it, and counters can be predicted exactly. The `kubelet` source against a real
kubelet is tested in tests/node/; here only its failure path (fake nodes have no kubelet).
The pressure guard reads the memory PSI of fake nodes from stand-in kubelets
(tests/e2e/fakekubelet.py) through the API server's node proxy, as it would real ones.
"""

from __future__ import annotations

import json
import os
import re
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
from tests.e2e.fakekubelet import NO_ADDRESS, fake_kubelets, host_address

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
        and doc["metadata"]["name"] in (account, f"{account}-events")
    ]
    assert sorted(doc["kind"] for doc in rbac) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "Role",  # the Events Role, in `default`
        "RoleBinding",
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
        # Events about Nodes must go to `default`: create there, and nothing more.
        ("create", "events", ["-n", "default"], "yes"),
        ("create", "events", ["-n", namespace], "no"),
        ("delete", "events", ["-n", "default"], "no"),
        ("list", "events", ["-n", "default"], "no"),
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


PRESSURE = "swapwise.io/memory-pressure"  # the mark (label) and its annotation
# Short windows so the test takes seconds: a read every 0.5 s, mark after 3 s at or above
# 40 %, clear after 4 s below 10 %.
GUARD = ("--pressure-guard", "--pressure-interval", "0.5", "--pressure-mark-above", "40",
         "--pressure-clear-below", "10", "--pressure-mark-after", "3",
         "--pressure-clear-after", "4")
MARK_AFTER, CLEAR_AFTER, SLACK = 3.0, 4.0, 10.0  # slack: reads, patch, a busy machine
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def pressure_note(cp: ControlPlane, node: str) -> str | None:
    value = (cp.get_json("node", node)["metadata"].get("annotations") or {}).get(PRESSURE)
    return None if value is None else str(value)


def node_events(cp: ControlPlane, node: str, reason: str) -> list[dict[str, Any]]:
    """Events about ``node`` with ``reason``, found as `kubectl describe node` finds them."""
    items: list[dict[str, Any]] = cp.get_json(
        "events", "-A", "--field-selector",
        f"involvedObject.kind=Node,involvedObject.name={node},reason={reason}")["items"]
    return items


def test_pressure_guard_marks_and_clears_swap_nodes_from_their_kubelets_psi(
    control_plane: ControlPlane,
) -> None:
    """Under the chart's RBAC with the guard on, against stand-in kubelets behind the API
    server's node proxy: a node whose PSI stays high is marked within the window (not
    before), gets the annotation and an Event, and is cleared the same way; a node whose PSI
    jumps across both thresholds on every read is never marked; failed and garbage reads
    change nothing and are counted; a node that is not a swap node is never read."""
    cp = control_plane
    if host_address() is None:
        pytest.skip(NO_ADDRESS)
    namespace, release = "labeller-guard", "lblg"
    account = f"{release}-swapwise-labeller"
    subject = _apply_chart_rbac(cp, namespace, release, "labeller.pressureGuard.enabled=true")
    answer = _can_i(cp, subject, "get", "nodes", "--subresource=proxy")
    assert answer == "yes", f"{subject} can-i get nodes/proxy: {answer}"
    key = "e2e.swapwise.io/swap-guard"
    swap = ("psi-hot", "psi-calm", "psi-flap", "psi-down", "psi-nopsi")
    for name in swap:
        cp.create_node(name, memory="16Gi", cpu="8", labels=LIMITED, swap_capacity=8 * GI)
    cp.create_node("psi-plain", memory="16Gi", cpu="8", labels=LIMITED)  # no swap
    labeller: LabellerProcess | None = None
    try:
        with fake_kubelets(cp, [*swap, "psi-plain"]) as kubelets:
            kubelets["psi-hot"].answer(2.0)
            kubelets["psi-calm"].answer(3.0)
            kubelets["psi-flap"].cycle(55.0, 2.0)  # across both thresholds on every read
            kubelets["psi-down"].answer((500, b'{"kind": "Status", "message": "kubelet '
                                             b'stats unavailable"}'))
            no_psi = {"node": {"nodeName": "psi-nopsi", "memory": {"workingSetBytes": 1}},
                      "pods": []}
            kubelets["psi-nopsi"].answer((200, json.dumps(no_psi).encode()))
            labeller = LabellerProcess(
                cp, "guard", key, account, namespace, _account_kubeconfig(cp, account, namespace),
                extra=GUARD,
            ).start()
            # The guard reads the swap nodes once they are judged: a calm start.
            cp.wait_for(lambda: kubelets["psi-hot"].reads() >= 4, 20, what="psi-hot read")
            assert PRESSURE not in labels(cp, "psi-hot")

            # Pressure: marked once every read has stayed >= 40 % for 3 s, not before.
            start = time.monotonic()
            kubelets["psi-hot"].answer(55.0)
            cp.wait_for(lambda: labels(cp, "psi-hot").get(PRESSURE) == "true",
                        MARK_AFTER + SLACK, interval=0.1, what="psi-hot marked")
            took = time.monotonic() - start
            assert MARK_AFTER <= took <= MARK_AFTER + SLACK, took
            note = str(pressure_note(cp, "psi-hot"))
            assert re.fullmatch(r"marked: memory PSI some avg10 55\.0% >= 40% for [34] s "
                                rf"\(full avg10 0\.5%\) at {STAMP}", note), note
            uid = cp.get_json("node", "psi-hot")["metadata"]["uid"]
            cp.wait_for(lambda: node_events(cp, "psi-hot", "SwapwiseMemoryPressure"), 10,
                        what="the SwapwiseMemoryPressure Event")
            [event] = node_events(cp, "psi-hot", "SwapwiseMemoryPressure")
            assert event["metadata"]["namespace"] == "default"
            assert (event["type"], event["message"]) == ("Warning", note)
            assert event["involvedObject"]["uid"] == uid
            assert event["source"]["component"] == "swapwise-labeller"
            assert labels(cp, "psi-hot")[key] == "true"  # the swap label is untouched
            # swapwise audit lists it, with what the annotation says.
            audit = subprocess.run(
                [swapwise_executable(), "audit", "--kubeconfig", str(cp.kubeconfig), "-o",
                 "json"], capture_output=True, text=True, timeout=120, check=False)
            assert audit.returncode == 1, audit.stderr  # a finding that needs action
            [finding] = [f for f in json.loads(audit.stdout)["findings"]
                         if f["check"] == "node-memory-pressure"]
            assert finding["object"] == "Node/psi-hot" and finding["action"] is True
            assert finding["details"]["annotation"] == note
            metrics = labeller.metrics()
            assert metrics["swapwise_labeller_pressure_marked_nodes"] == 1
            assert metrics['swapwise_labeller_pressure_transitions_total{action="mark"}'] == 1
            hot = 'swapwise_labeller_memory_psi_avg10_percent{kind="some",node="psi-hot"}'
            assert metrics[hot] == 55.0

            # Calm again: cleared once every read has stayed < 10 % for 4 s, not before.
            start = time.monotonic()
            kubelets["psi-hot"].answer(2.0)
            cp.wait_for(lambda: PRESSURE not in labels(cp, "psi-hot"),
                        CLEAR_AFTER + SLACK, interval=0.1, what="psi-hot cleared")
            took = time.monotonic() - start
            assert CLEAR_AFTER <= took <= CLEAR_AFTER + SLACK, took
            note = str(pressure_note(cp, "psi-hot"))
            assert re.fullmatch(r"cleared: memory PSI some avg10 2\.0% < 10% for [45] s "
                                rf"\(full avg10 0\.5%\) at {STAMP}", note), note
            cp.wait_for(lambda: node_events(cp, "psi-hot", "SwapwiseMemoryPressureCleared"),
                        10, what="the SwapwiseMemoryPressureCleared Event")
            [event] = node_events(cp, "psi-hot", "SwapwiseMemoryPressureCleared")
            assert (event["type"], event["message"]) == ("Normal", note)

            # The others, all along: never marked, never annotated.
            # Read for twice the mark window and more, flipping each time: no window ends.
            assert kubelets["psi-flap"].reads() >= 2 * MARK_AFTER / 0.5
            for name in ("psi-calm", "psi-flap", "psi-down", "psi-nopsi"):
                assert PRESSURE not in labels(cp, name), name
                assert pressure_note(cp, name) is None, name
            assert kubelets["psi-plain"].reads() == 0  # not a swap node: never asked
            # Through the proxy, with the query: the kubelet's CPU-and-memory Summary only.
            assert set(kubelets["psi-hot"].requests) == {
                "/stats/summary?only_cpu_and_memory=true"}
            # Every failed read is counted (the session's other swap nodes, which have no
            # kubelet at all, add theirs: at least, not exactly).
            failing = kubelets["psi-down"].reads() + kubelets["psi-nopsi"].reads()
            metrics = labeller.metrics()
            assert failing >= 20
            assert metrics["swapwise_labeller_psi_read_errors_total"] >= failing - 2
            assert metrics["swapwise_labeller_pressure_marked_nodes"] == 0
            assert metrics['swapwise_labeller_pressure_transitions_total{action="clear"}'] == 1
            assert metrics["swapwise_labeller_reconcile_errors_total"] == 0
            assert not any(name.startswith("swapwise_labeller_memory_psi_avg10_percent")
                           and "psi-down" in name for name in metrics)
            log = labeller.component.tail(600)
            assert re.search(r'"memory PSI unreadable; mark and windows left as they are".*'
                             r'"node": "psi-down".*HTTP 500: kubelet stats unavailable', log)
            assert re.search(r'"node": "psi-nopsi".*no node.memory.psi', log)
            assert log.count('"node": "psi-down", "error"') == 1  # logged once, not per read
            assert '"memory pressure mark set"' in log and '"memory pressure mark cleared"' in log
            assert "forbidden" not in log.lower()
            assert lease(cp, account, namespace)["holderIdentity"] == "guard"
    finally:
        if labeller is not None:
            labeller.stop()
        cp.kubectl("delete", "node", *swap, "psi-plain", "--wait=false", check=False)


def taints(cp: ControlPlane, node: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = cp.get_json("node", node)["spec"].get("taints") or []
    return found


def test_the_taint_form_marks_with_a_noschedule_taint_and_keeps_every_other_taint(
    control_plane: ControlPlane,
) -> None:
    """``--pressure-mark-with taint`` on a real API server: the mark is the NoSchedule taint
    (no label), written into a taint list that already has another taint; a taint added
    while the node is marked stays; the clear removes only the mark; the audit names the
    form. The kubelet's side (it ignores NoSchedule taints when it re-admits pods) is in
    docs/labeller.md, "Label or taint"."""
    cp = control_plane
    if host_address() is None:
        pytest.skip(NO_ADDRESS)
    namespace, release = "labeller-taint", "lblt"
    account = f"{release}-swapwise-labeller"
    _apply_chart_rbac(cp, namespace, release, "labeller.pressureGuard.enabled=true",
                      "labeller.pressureGuard.markWith=taint")
    key = "e2e.swapwise.io/swap-taint"
    name = "psi-taint"
    cp.create_node(name, memory="16Gi", cpu="8", labels=LIMITED, swap_capacity=8 * GI)
    cp.kubectl("taint", "node", name, "dedicated=swap:NoSchedule")
    mark = {"key": PRESSURE, "value": "true", "effect": "NoSchedule"}
    dedicated = {"key": "dedicated", "value": "swap", "effect": "NoSchedule"}
    labeller: LabellerProcess | None = None
    try:
        with fake_kubelets(cp, [name]) as kubelets:
            kubelets[name].answer(55.0)
            labeller = LabellerProcess(
                cp, "taint", key, account, namespace, _account_kubeconfig(cp, account, namespace),
                extra=(*GUARD, "--pressure-mark-with", "taint"),
            ).start()
            cp.wait_for(lambda: mark in taints(cp, name), MARK_AFTER + SLACK + 10,
                        interval=0.2, what="the pressure taint")
            assert taints(cp, name) == [dedicated, mark]
            assert PRESSURE not in labels(cp, name) and labels(cp, name)[key] == "true"
            assert str(pressure_note(cp, name)).startswith("marked: memory PSI some avg10 55.0%")
            cp.kubectl("taint", "node", name, "maintenance=soon:PreferNoSchedule")
            audit = subprocess.run(
                [swapwise_executable(), "audit", "--kubeconfig", str(cp.kubeconfig), "-o",
                 "json"], capture_output=True, text=True, timeout=120, check=False)
            [finding] = [f for f in json.loads(audit.stdout)["findings"]
                         if f["check"] == "node-memory-pressure" and f["object"] == f"Node/{name}"]
            assert finding["details"]["markedWith"] == ["taint"], finding
            kubelets[name].answer(2.0)
            cp.wait_for(lambda: mark not in taints(cp, name), CLEAR_AFTER + SLACK,
                        interval=0.2, what="the pressure taint to go")
            maintenance = {"key": "maintenance", "value": "soon", "effect": "PreferNoSchedule"}
            # kubectl taint put its taint first; the labeller keeps the others as they are.
            assert taints(cp, name) == [maintenance, dedicated]
            assert str(pressure_note(cp, name)).startswith("cleared: memory PSI some avg10 2.0%")
            metrics = labeller.metrics()
            assert metrics['swapwise_labeller_pressure_transitions_total{action="mark"}'] == 1
            assert metrics['swapwise_labeller_pressure_transitions_total{action="clear"}'] == 1
            assert metrics["swapwise_labeller_pressure_marked_nodes"] == 0
            log = labeller.component.tail(300)
            assert '"form": "taint"' in log and "forbidden" not in log.lower()
    finally:
        if labeller is not None:
            labeller.stop()
        cp.kubectl("delete", "node", name, "--wait=false", check=False)

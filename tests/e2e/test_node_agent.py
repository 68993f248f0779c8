"""``swapwise node-agent`` against a real API server: what it writes on its Node, and only
there, from the kernel figures a fake host gives it (tests/e2e/agent.py).

Each test has a Node of its own (the agent writes only its own) and an agent process reading
a host directory. The real kernel, kubelet and DaemonSet are tests/node's; what is proven
here is the agent's side of the API: its watch, its merge patches, the keys it leaves alone,
and how it corrects a value declared where the node was made (a Karpenter NodePool, a
node-group template, ``--node-labels``: docs/autoscaling.md).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agent import FakeHost, running_agent
from tests.e2e.cluster import ControlPlane, swapwise_executable, wait_for
from webhook.engine.backing import PERMILLE_LABEL
from webhook.engine.nodes import (
    BEHAVIOR_LABEL,
    FACTS_ANNOTATION,
    KIND_LABEL,
    SWAP_NODE_ANNOTATION,
    SWAP_NODE_LABEL,
    NodeFacts,
)
from webhook.engine.pressure import CPU_MARK, MEMORY_MARK

pytestmark = pytest.mark.e2e

GI = 1 << 30
DISK = ("/dev/vdb", 32 * GI)  # swap = 2 x the 16Gi of memory: per-mille 2000
ZRAM = ("/dev/zram0", 8 * GI)
# Quick windows, so a test waits seconds, not minutes (the defaults are checked on the real
# node); the thresholds are the defaults.
QUICK = ("--mark-window", "2", "--clear-window", "6")
FOREIGN_LABELS = {"example.com/team": "a", "feature.node.kubernetes.io/memory-swap": "true"}
FOREIGN_TAINT = {"key": "example.com/dedicated", "value": "x", "effect": "NoSchedule"}


def node_object(cp: ControlPlane, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cp.get_json("node", name)
    return found


def labels(cp: ControlPlane, name: str) -> dict[str, str]:
    found: dict[str, str] = node_object(cp, name)["metadata"].get("labels", {})
    return found


@pytest.fixture
def node_name(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    test = re.sub(r"[^a-z0-9]+", "-", request.node.name.removeprefix("test_").lower())
    name = f"agent-{test[:40].strip('-')}-{request.node.name[-6:].strip('[]')}".strip("-")
    name = re.sub(r"[^a-z0-9-]+", "-", name).strip("-")
    yield name
    control_plane.kubectl("delete", "node", name, "--wait=false", check=False)


def make_node(cp: ControlPlane, name: str, extra_labels: dict[str, str] | None = None,
              behavior: str | None = "LimitedSwap", taints: list[Any] | None = None) -> None:
    node_labels = {**FOREIGN_LABELS, **(extra_labels or {})}
    if behavior is not None:
        node_labels[BEHAVIOR_LABEL] = behavior
    cp.create_node(name, memory="16Gi", cpu="8", labels=node_labels, swap_capacity=32 * GI)
    body = {"metadata": {"annotations": {"example.com/owner": "ops"}}}
    if taints:
        body["spec"] = {"taints": taints}
    cp.kubectl("patch", "node", name, "--type", "merge", "-p", json.dumps(body))


def wait_labels(cp: ControlPlane, name: str, want: dict[str, str | None], what: str,
                timeout: float = 60) -> dict[str, str]:
    def matches() -> dict[str, str] | None:
        found = labels(cp, name)
        ok = all(found.get(k) == v if v is not None else k not in found
                 for k, v in want.items())
        return found if ok else None

    result: dict[str, str] = wait_for(matches, timeout, what=what,
                                      on_timeout=lambda: json.dumps(labels(cp, name)))
    return result


def test_disk_swap_and_a_declared_limitedswap_make_a_swap_node(
    control_plane: ControlPlane, node_name: str, tmp_path: Path
) -> None:
    cp = control_plane
    make_node(cp, node_name, taints=[FOREIGN_TAINT])
    with running_agent(cp, node_name, tmp_path, QUICK) as (agent, host):
        host.swaps([DISK])
        found = wait_labels(cp, node_name, {SWAP_NODE_LABEL: "true", PERMILLE_LABEL: "2000",
                                            KIND_LABEL: "disk"}, "the swap labels")
        node = node_object(cp, node_name)
        facts = NodeFacts.of(node)
        assert facts is not None and facts.backing_bytes == 32 * GI, facts
        assert facts.swap_behavior == "LimitedSwap" and facts.behavior_source == "declared"
        assert node["metadata"]["annotations"][SWAP_NODE_ANNOTATION].startswith(
            "true: declared swapBehavior LimitedSwap")
        # Nothing that is not swapwise's was touched.
        assert {k: found[k] for k in FOREIGN_LABELS} == FOREIGN_LABELS
        assert node["metadata"]["annotations"]["example.com/owner"] == "ops"
        assert node["spec"]["taints"] == [FOREIGN_TAINT]
        status, metrics = agent.get("/metrics")
        assert status == 200 and "swapwise_node_agent_swap_permille 2000.0" in metrics


def test_zram_counts_as_configured(control_plane: ControlPlane, node_name: str,
                                   tmp_path: Path) -> None:
    """zram's pages live in RAM: by default it backs nothing (per-mille 0, still a swap
    node of kind zram); --zram-backing 0.5 counts half of it; beside disk, kind mixed."""
    cp = control_plane
    make_node(cp, node_name)
    with running_agent(cp, node_name, tmp_path / "a", QUICK) as (_, host):
        host.swaps([ZRAM])
        wait_labels(cp, node_name, {SWAP_NODE_LABEL: "true", PERMILLE_LABEL: "0",
                                    KIND_LABEL: "zram"}, "zram, counted as nothing")
        host.swaps([DISK, ZRAM])
        wait_labels(cp, node_name, {PERMILLE_LABEL: "2000", KIND_LABEL: "mixed"},
                    "disk and zram")
    with running_agent(cp, node_name, tmp_path / "b", (*QUICK, "--zram-backing", "0.5")) as (
            _, host):
        host.swaps([ZRAM])
        wait_labels(cp, node_name, {PERMILLE_LABEL: "250", KIND_LABEL: "zram"},
                    "half of an 8Gi zram on 16Gi: 250")


def test_no_swap_behavior_takes_the_labels_off(control_plane: ControlPlane, node_name: str,
                                               tmp_path: Path) -> None:
    cp = control_plane
    make_node(cp, node_name)
    with running_agent(cp, node_name, tmp_path, QUICK) as (_, host):
        host.swaps([DISK])
        wait_labels(cp, node_name, {SWAP_NODE_LABEL: "true"}, "a swap node first")
        cp.kubectl("label", "node", node_name, "--overwrite", f"{BEHAVIOR_LABEL}=NoSwap")
        wait_labels(cp, node_name, {SWAP_NODE_LABEL: None, PERMILLE_LABEL: None,
                                    KIND_LABEL: "disk"}, "the labels off a NoSwap node")
        note = node_object(cp, node_name)["metadata"]["annotations"][SWAP_NODE_ANNOTATION]
        assert note == "false: declared swapBehavior NoSwap (source: node label " \
                       f"{BEHAVIOR_LABEL})", note
        host.swaps([])
        wait_labels(cp, node_name, {KIND_LABEL: None}, "no swap: no kind")


def test_a_declared_per_mille_gives_way_to_the_measured_one(
    control_plane: ControlPlane, node_name: str, tmp_path: Path
) -> None:
    """A NodePool declared swap-node and 4000 where the node has 2000: the first measurement
    replaces the claim, and the facts keep what was declared (audit reports it)."""
    cp = control_plane
    make_node(cp, node_name, {SWAP_NODE_LABEL: "true", PERMILLE_LABEL: "4000"})
    with running_agent(cp, node_name, tmp_path, QUICK) as (_, host):
        host.swaps([DISK])
        wait_labels(cp, node_name, {PERMILLE_LABEL: "2000"}, "the measured per-mille")
        facts = NodeFacts.of(node_object(cp, node_name))
        assert facts is not None and facts.declared_permille == 4000 and facts.permille == 2000
        # Someone writes the claim again: the watch brings it back to the measurement, and
        # the record of the first declaration stays.
        cp.kubectl("label", "node", node_name, "--overwrite", f"{PERMILLE_LABEL}=9000")
        wait_labels(cp, node_name, {PERMILLE_LABEL: "2000"}, "the measurement again", 30)
        facts = NodeFacts.of(node_object(cp, node_name))
        assert facts is not None and facts.declared_permille == 4000


@pytest.mark.parametrize("form", ["label", "taint"])
def test_pressure_is_marked_and_cleared(control_plane: ControlPlane, node_name: str,
                                        tmp_path: Path, form: str) -> None:
    cp = control_plane
    make_node(cp, node_name, taints=[FOREIGN_TAINT])
    with running_agent(cp, node_name, tmp_path, (*QUICK, "--mark-with", form)) as (_, host):
        host.swaps([DISK])
        wait_labels(cp, node_name, {SWAP_NODE_LABEL: "true"}, "a swap node first")

        def carries(key: str) -> bool:
            node = node_object(cp, node_name)
            if form == "label":
                return node["metadata"].get("labels", {}).get(key) == "true"
            return {"key": key, "value": "true", "effect": "NoSchedule"} in (
                node["spec"].get("taints") or [])

        host.stall("memory", 90)
        wait_for(lambda: carries(MEMORY_MARK.key), 60, what="the memory mark")
        assert not carries(CPU_MARK.key)
        note = node_object(cp, node_name)["metadata"]["annotations"][MEMORY_MARK.key]
        assert note.startswith("marked: memory some"), note
        host.stall("cpu", 95)
        wait_for(lambda: carries(CPU_MARK.key), 60, what="the CPU mark too")
        host.stall("memory", 0)
        host.stall("cpu", 0)
        wait_for(lambda: not carries(MEMORY_MARK.key) and not carries(CPU_MARK.key), 90,
                 what="both marks cleared")
        node = node_object(cp, node_name)
        assert node["metadata"]["annotations"][MEMORY_MARK.key].startswith("cleared:")
        assert FOREIGN_TAINT in node["spec"]["taints"]
        assert MEMORY_MARK.key not in node["metadata"].get("labels", {})


def test_marks_go_when_the_agent_stops(control_plane: ControlPlane, node_name: str,
                                       tmp_path: Path) -> None:
    """An agent that goes (helm uninstall, a rollout) takes its marks with it: a node must
    not stay closed to reshaped pods with nobody left to reopen it."""
    cp = control_plane
    make_node(cp, node_name)
    with running_agent(cp, node_name, tmp_path, QUICK) as (_, host):
        host.swaps([DISK])
        wait_labels(cp, node_name, {SWAP_NODE_LABEL: "true"}, "a swap node first")
        host.stall("memory", 90)
        wait_for(lambda: MEMORY_MARK.key in labels(cp, node_name), 60, what="the mark")
    # running_agent stopped it with SIGTERM
    found = labels(cp, node_name)
    assert MEMORY_MARK.key not in found and found.get(SWAP_NODE_LABEL) == "true", found


def test_marks_off_removes_leftover_marks(control_plane: ControlPlane, node_name: str,
                                          tmp_path: Path) -> None:
    cp = control_plane
    make_node(cp, node_name, {MEMORY_MARK.key: "true", CPU_MARK.key: "true"})
    with running_agent(cp, node_name, tmp_path, (*QUICK, "--no-pressure-marks")) as (_, host):
        host.swaps([DISK])
        host.stall("memory", 100)
        wait_labels(cp, node_name, {MEMORY_MARK.key: None, CPU_MARK.key: None,
                                    SWAP_NODE_LABEL: "true"}, "the leftover marks gone")


def test_the_agent_patches_only_when_something_changed(
    control_plane: ControlPlane, node_name: str, tmp_path: Path
) -> None:
    """A calm node costs no writes: after the first sync the agent's patch count stays put
    while nothing changes (its reads of the kernel go on, once a second)."""
    cp = control_plane
    make_node(cp, node_name)
    with running_agent(cp, node_name, tmp_path, QUICK) as (agent, host):
        host.swaps([DISK])
        wait_labels(cp, node_name, {SWAP_NODE_LABEL: "true", PERMILLE_LABEL: "2000"},
                    "the first sync")
        def counter(name: str) -> float:
            text = agent.get("/metrics")[1]
            line = next(x for x in text.splitlines() if x.startswith(name))
            return float(line.split()[-1])

        def patches() -> float:
            return counter('swapwise_node_agent_patches_total{result="ok"}')

        before = patches()
        events = counter("swapwise_node_agent_node_events_total")
        # Someone else changes the node: the agent sees it (a watch event) and, with nothing
        # of its own to correct, writes nothing.
        cp.kubectl("label", "node", node_name, "--overwrite", "example.com/team=b")
        version = node_object(cp, node_name)["metadata"]["resourceVersion"]
        wait_for(lambda: counter("swapwise_node_agent_node_events_total") > events, 30,
                 what="the agent to see the change")
        wait_for(lambda: agent.get("/healthz")[0] == 200, 10, what="the agent's loop")
        assert patches() == before
        assert node_object(cp, node_name)["metadata"]["resourceVersion"] == version
        assert FACTS_ANNOTATION in node_object(cp, node_name)["metadata"]["annotations"]


def test_a_bad_flag_is_refused_before_anything_is_written(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    host = FakeHost(tmp_path)
    try:
        proc = subprocess.run(
            [swapwise_executable(), "node-agent", "--node-name", "x", "--kubeconfig",
             str(control_plane.kubeconfig), "--memory-mark-above", "5",
             "--memory-clear-below", "50", "--host-proc", str(host.proc)],
            capture_output=True, text=True, timeout=60)
    finally:
        host.close()
    assert proc.returncode == 1
    assert "clear below (50.0) <= mark above (5.0)" in proc.stderr, proc.stderr

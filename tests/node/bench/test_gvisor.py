"""A reshaped pod under gVisor on the real swap node: does it run, and where is its memory?

Opt-in (SWAPWISE_NODE_GVISOR=1, which also has `make node` build runsc and its containerd
shim with build-gvisor.sh): one sandbox takes minutes to start under emulation. The question
is the one docs/sandboxes.md answers from the sources: the kubelet writes LimitedSwap's
``memory.swap.max`` into each container cgroup, but a gVisor pod's memory is the Sentry's,
charged to the sandbox, so the per-container share bounds nothing. Figures go to
build/node-e2e/results.json under ``gvisor.`` (BENCHMARKS.md, "gVisor on the real node").
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from tests.e2e.install import Installation
from tests.node.conftest import GVISOR, Agent
from tests.node.node import RealNode
from tests.node.scenarios import (
    COLD_MIB,
    LIMIT_BYTES,
    container_id,
    create_namespace,
    delete_namespace,
    hot_ops,
    running,
    sandbox_pod,
)
from webhook.base.quantity import parse_bytes

pytestmark = [
    pytest.mark.node,
    pytest.mark.skipif(not GVISOR, reason="the gVisor scenario runs with SWAPWISE_NODE_GVISOR=1"),
]

# What the RuntimeClass declares for the Sentry; the scheduler adds it to each pod's requests
# and the kubelet to the pod cgroup's memory.max.
OVERHEAD = "64Mi"
RUNTIME_CLASS = {
    "apiVersion": "node.k8s.io/v1",
    "kind": "RuntimeClass",
    "metadata": {"name": "gvisor"},
    "handler": "runsc",  # guest/containerd.toml
    "overhead": {"podFixed": {"memory": OVERHEAD}},
}
START_TIMEOUT = 2400  # a sandbox boots in minutes under emulation on a loaded machine


def gvisor_pod(name: str, namespace: str) -> dict[str, Any]:
    pod = sandbox_pod(name, namespace, cold_mib=COLD_MIB)
    pod["spec"]["runtimeClassName"] = "gvisor"
    return pod


def pod_cgroups(status: dict[str, Any], pod_uid: str) -> dict[str, dict[str, Any]]:
    """The pod cgroup and its children (``"pod"``, then each child by its directory name)."""
    found: dict[str, dict[str, Any]] = {}
    for path, files in status["cgroups"].items():
        parts = path.split("/")
        if f"pod{pod_uid}" not in parts:
            continue
        tail = parts[parts.index(f"pod{pod_uid}") + 1:]
        found["pod" if not tail else tail[0]] = files
    return found


def used(files: dict[str, Any]) -> int:
    return int(files["memory.current"]) + int(files["memory.swap.current"])


def test_reshaped_pod_runs_under_gvisor_and_its_memory_is_the_sandboxs(
    node: RealNode, swapwise: Installation, agent: Agent, results: dict[str, Any]
) -> None:
    cp = node.cp
    cp.apply(yaml.safe_dump(RUNTIME_CLASS))
    create_namespace(cp, "gvisor", "sandbox")
    try:
        started = time.monotonic()
        cp.apply(json.dumps(gvisor_pod("gvisor-0", "gvisor")))

        def working() -> dict[str, Any] | None:
            pod: dict[str, Any] = cp.get_json("pod", "gvisor-0", "-n", "gvisor")
            return pod if running(pod) and hot_ops(cp, "gvisor", "gvisor-0") else None

        pod = node.wait_for(working, START_TIMEOUT, interval=10,
                            what="the gVisor pod Running and allocated")
        results["gvisor.seconds_to_working"] = round(time.monotonic() - started)
        results["gvisor.hot_ops_per_s"] = hot_ops(cp, "gvisor", "gvisor-0")
        request = parse_bytes(pod["spec"]["containers"][0]["resources"]["requests"]["memory"])
        results["gvisor.request_bytes"] = request
        assert request < LIMIT_BYTES  # reshaped like a runc pod
        assert pod["spec"]["overhead"] == {"memory": OVERHEAD}

        cgroups = pod_cgroups(node.fresh_status(), pod["metadata"]["uid"])
        workload = cgroups.pop(container_id(pod))
        whole = cgroups.pop("pod")
        # What is left is the sandbox's own cgroup (the pause container's), which holds the
        # Sentry and the gofer: every process of the pod.
        (sandbox_id, sandbox), = cgroups.items()
        for name, files in (("pod", whole), ("sandbox", sandbox), ("container", workload)):
            for key in ("memory.max", "memory.swap.max"):  # results keys nest on dots
                results[f"gvisor.{name}.{key.replace('.', '_')}"] = files[key]
            results[f"gvisor.{name}.used_bytes"] = used(files)
            results[f"gvisor.{name}.swap_current_bytes"] = int(files["memory.swap.current"])
    finally:
        delete_namespace(cp, node, "gvisor")
        cp.kubectl("delete", "runtimeclass", "gvisor", check=False)

    # The pod's memory (the cold set at least) is charged to the pod cgroup, all of it in
    # the sandbox's cgroup and none in the container's: the container cgroup, where the
    # kubelet's swap share would apply, holds no process.
    assert used(whole) >= COLD_MIB * 1024**2, whole
    assert used(sandbox) >= COLD_MIB * 1024**2, (sandbox_id, sandbox)
    assert used(workload) < 1024**2, workload
    # The pod cgroup's limit is the container limit plus the RuntimeClass's overhead.
    assert int(whole["memory.max"]) == LIMIT_BYTES + parse_bytes(OVERHEAD)

"""Sandboxed runtimes end to end: a RuntimeClass with pod overhead, swapwise, the scheduler.

The RuntimeClass admission plugin copies the RuntimeClass's ``overhead.podFixed`` into
``spec.overhead`` before mutating webhooks run and checks it again after them; the scheduler
adds it to the pod's requests. This proves that swapwise reshapes such pods like any other
(the overhead is not a container and is left as it is), and that ``swapwise plan``, given the
same RuntimeClass, predicts how many pods the real scheduler places, with and without
swapwise. No runtime runs anything here (fake nodes): the handler name is only a name.
"""

from __future__ import annotations

import json
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
    swapwise_executable,
    wait_for_mutation,
)
from tests.e2e.install import Installation, container, installed, manifest, pod
from webhook.engine.backing import PERMILLE_LABEL, node_permille
from webhook.engine.pressure import MARKS

pytestmark = pytest.mark.e2e

NODE = "gvisor-1"
RUNTIME_LABEL = "swapwise-e2e/runtime"
# A gVisor-like RuntimeClass: 250Mi for the Sentry, scheduled onto its own tainted node.
RUNTIME_CLASS: dict[str, Any] = {
    "apiVersion": "node.k8s.io/v1",
    "kind": "RuntimeClass",
    "metadata": {"name": "gvisor"},
    "handler": "runsc",
    "overhead": {"podFixed": {"memory": "250Mi"}},
    "scheduling": {
        "nodeSelector": {RUNTIME_LABEL: "gvisor"},
        "tolerations": [
            {"key": RUNTIME_LABEL, "operator": "Equal", "value": "gvisor", "effect": "NoSchedule"}
        ],
    },
}
PROFILES = {"sandbox": {"swapRatio": 2}}
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
SWAP_EXPR = {"key": SWAP_LABEL, "operator": "In", "values": ["true"]}
# 2Gi -> 683Mi needs 1999 per mille (docs/rules.md "Swap backing"); the node has 2000
BACKED = {"key": PERMILLE_LABEL, "operator": "Gt", "values": ["1998"]}
NO_MARKS = [mark.expression() for mark in MARKS]


def sandbox(name: str, namespace: str) -> dict[str, Any]:
    """The 2Gi / 100m Guaranteed sandbox, run by the gvisor RuntimeClass."""
    return pod(name, namespace, container(memory="2Gi", cpu="100m"), runtimeClassName="gvisor")


@pytest.fixture(scope="module")
def swapwise(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installation]:
    with installed(control_plane, tmp_path_factory.mktemp("install"), PROFILES) as install:
        yield install


@pytest.fixture(scope="module")
def gvisor_node(control_plane: ControlPlane) -> str:
    """One 28Gi / 8 CPU swap node (56Gi swap) that only the gvisor RuntimeClass tolerates."""
    control_plane.create_node(
        NODE,
        memory="28Gi",
        cpu="8",
        labels={SWAP_LABEL: "true", RUNTIME_LABEL: "gvisor",
                PERMILLE_LABEL: str(node_permille(56 << 30, 28 << 30))},  # as the node agent does
        swap_capacity=56 * 1024**3,
    )
    control_plane.kubectl("taint", "node", NODE, f"{RUNTIME_LABEL}=gvisor:NoSchedule")
    control_plane.apply(json.dumps(RUNTIME_CLASS))
    return NODE


def namespace(cp: ControlPlane, name: str, profile: str | None) -> None:
    cp.create_namespace(name, {PROFILE_LABEL: profile} if profile else {})
    if profile:
        wait_for_mutation(cp, name)


def test_pod_with_overhead_is_stored_reshaped_with_its_overhead_intact(
    control_plane: ControlPlane, swapwise: Installation, gvisor_node: str
) -> None:
    namespace(control_plane, "gvisor-stored", "sandbox")
    control_plane.apply(json.dumps(sandbox("browser", "gvisor-stored")))
    got = control_plane.get_json("pod", "browser", "-n", "gvisor-stored")
    spec = got["spec"]
    # The admission plugin's overhead, untouched by swapwise (its validation would refuse
    # the pod otherwise).
    assert spec["overhead"] == {"memory": "250Mi"}
    app = spec["containers"][0]
    assert app["resources"]["requests"] == {"memory": "683Mi", "cpu": "100m"}
    assert app["resources"]["limits"] == {"memory": "2Gi", "cpu": "100m"}
    assert app["resizePolicy"] == [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]
    assert json.loads(got["metadata"]["annotations"]["swapwise.io/original"]) == {
        "app": {"request": "2Gi", "limit": "2Gi"}
    }
    assert got["status"]["qosClass"] == "Burstable"
    # swapwise's placement and the RuntimeClass's scheduling, side by side.
    assert spec["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"] == [
        {"matchExpressions": [SWAP_EXPR, *NO_MARKS, BACKED]}
    ]
    assert spec["nodeSelector"] == {RUNTIME_LABEL: "gvisor"}
    assert RUNTIME_CLASS["scheduling"]["tolerations"][0] in spec["tolerations"]
    bound = control_plane.wait_for(
        lambda: control_plane.get_json("pod", "browser", "-n", "gvisor-stored")["spec"].get(
            "nodeName"
        ),
        what="the sandbox pod to be scheduled",
    )
    assert bound == gvisor_node
    # Free the node for the density test (no kubelet: only a forced delete removes it).
    control_plane.kubectl(
        "delete", "pod", "browser", "-n", "gvisor-stored", "--grace-period=0", "--force",
        "--wait=true",
    )


def plan_prediction(tmp_path: Path) -> dict[str, Any]:
    """`swapwise plan -o json` on the RuntimeClass and the pod, for the node's shape."""
    path = tmp_path / "sandbox.yaml"
    path.write_text(yaml.safe_dump_all([RUNTIME_CLASS, sandbox("browser", "any")]))
    out = subprocess.run(
        [swapwise_executable(), "plan", "-f", str(path), "--node-memory", "28Gi",
         "--node-swap", "56Gi", "--node-cpu", "8", "--max-pods", "110", "-o", "json"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    (workload,) = json.loads(out)["workloads"]
    result: dict[str, Any] = workload
    return result


def test_scheduler_places_what_plan_predicts_with_and_without_swapwise(
    control_plane: ControlPlane, swapwise: Installation, gvisor_node: str, tmp_path: Path
) -> None:
    predicted = plan_prediction(tmp_path)
    assert predicted["overhead"] == {"memory": 250 * 1024**2, "cpu": 0.0,
                                     "source": "RuntimeClass/gvisor"}
    total = 40
    counts = {}
    for name, profile in (("gvisor-off", None), ("gvisor-on", "sandbox")):
        namespace(control_plane, name, profile)
        pods = manifest(*(sandbox(f"browser-{i}", name) for i in range(total)))
        counts[name] = control_plane.density(name, pods, total)
    without, with_swapwise = counts["gvisor-off"], counts["gvisor-on"]
    print(
        f"\n2Gi sandbox + 250Mi overhead on a 28Gi/8-CPU swap node: {without} pods without "
        f"swapwise, {with_swapwise} with swapRatio 2; plan predicted "
        f"{predicted['before']['perNode']} and {predicted['after']['perNode']}"
    )
    # By hand: 28672Mi // (2048 + 250)Mi = 12; 28672Mi // (683 + 250)Mi = 30.
    assert (without, with_swapwise) == (
        predicted["before"]["perNode"], predicted["after"]["perNode"])
    assert (without, with_swapwise) == (12, 30)

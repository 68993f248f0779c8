"""Smoke test of the local control plane itself (no swapwise involved).

Why: every other e2e test trusts that the API server admits, the scheduler binds to fake
nodes and the controller manager turns Deployments into pods; prove that first.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import (
    BUILD_SCRIPT,
    DEFAULT_LINE,
    HELM_NAME,
    K8S_VERSION,
    SWAP_LABEL,
    ControlPlane,
    bin_dir,
)

pytestmark = [pytest.mark.e2e, pytest.mark.smoke]


def pod_manifest(name: str, namespace: str, memory: str = "256Mi") -> str:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {
                        "requests": {"cpu": "100m", "memory": memory},
                        "limits": {"memory": memory},
                    },
                }
            ]
        },
    }
    return json.dumps(pod)


def test_api_server_is_ready_and_reports_version(control_plane: ControlPlane) -> None:
    assert control_plane.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    versions = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert versions["clientVersion"]["gitVersion"] == K8S_VERSION
    assert versions["serverVersion"]["gitVersion"] == K8S_VERSION
    assert control_plane.bin == bin_dir(DEFAULT_LINE)
    helm = subprocess.run([str(control_plane.helm), "version", "--template={{.Version}}"],
                          capture_output=True, text=True, timeout=60, check=True).stdout
    assert helm.startswith("v4." if HELM_NAME == "helm4" else "v3.")


@pytest.mark.parametrize("name", ["etcd", "helm4"])
def test_line_independent_binaries_are_built_once_and_copied(
    control_plane: ControlPlane, tmp_path: Path, name: str
) -> None:
    """etcd and helm4 do not depend on the Kubernetes line: a line whose directory lacks
    them gets a copy of another line's build with the same stamp, not a second build."""
    source = control_plane.bin
    if not (source / name).exists():
        subprocess.run(["bash", str(BUILD_SCRIPT), name], check=True, timeout=3600,
                       env={**os.environ, "SWAPWISE_K8S_BIN": str(source),
                            "SWAPWISE_K8S_VERSION": DEFAULT_LINE})
    here, other = tmp_path / "k8s" / "here" / "bin", tmp_path / "k8s" / "other" / "bin"
    other.mkdir(parents=True)
    shutil.copy2(source / name, other / name)
    shutil.copy2(source / f".stamp-{name}", other / f".stamp-{name}")
    env = {**os.environ, "SWAPWISE_K8S_BIN": str(here), "SWAPWISE_K8S_VERSION": DEFAULT_LINE,
           "SWAPWISE_GO_P": "1"}
    out = subprocess.run(["bash", str(BUILD_SCRIPT), name], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert f"==> {name}: copied from {other}" in out, out
    assert filecmp.cmp(here / name, other / name, shallow=False)
    assert (here / f".stamp-{name}").read_text() == (other / f".stamp-{name}").read_text()


def test_fake_nodes_keep_status_and_labels(
    control_plane: ControlPlane, standard_nodes: dict[str, list[str]]
) -> None:
    nodes = {n["metadata"]["name"]: n for n in control_plane.get_json("nodes")["items"]}
    assert set(standard_nodes["swap"] + standard_nodes["plain"]) <= set(nodes)
    swap = control_plane.get_json("nodes", "-l", f"{SWAP_LABEL}=true")["items"]
    assert sorted(n["metadata"]["name"] for n in swap) == sorted(standard_nodes["swap"])
    node = nodes[standard_nodes["swap"][0]]
    assert node["status"]["allocatable"]["memory"] == "16Gi"
    assert node["status"]["nodeInfo"]["swap"]["capacity"] == 32 * 1024**3
    assert not node["spec"].get("taints"), "node lifecycle controller must stay off"


def test_plain_pod_gets_scheduled(
    control_plane: ControlPlane, standard_nodes: dict[str, list[str]]
) -> None:
    control_plane.create_namespace("smoke-pod")
    control_plane.apply(pod_manifest("web", "smoke-pod"))

    def node_name() -> str | None:
        pod = control_plane.get_json("pod", "web", "-n", "smoke-pod")
        return pod["spec"].get("nodeName")  # type: ignore[no-any-return]

    bound = control_plane.wait_for(node_name, 60, what="pod smoke-pod/web to be bound")
    assert bound in standard_nodes["swap"] + standard_nodes["plain"]


def test_deployment_pods_are_created_and_bound(
    control_plane: ControlPlane, standard_nodes: dict[str, list[str]]
) -> None:
    control_plane.create_namespace("smoke-deploy")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "smoke-deploy"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": json.loads(pod_manifest("x", "smoke-deploy"))["spec"],
            },
        },
    }
    control_plane.apply(json.dumps(deployment))

    def bound_pods() -> list[dict[str, Any]] | None:
        pods = control_plane.get_json("pods", "-n", "smoke-deploy", "-l", "app=web")["items"]
        ok = [p for p in pods if p["spec"].get("nodeName")]
        return ok if len(ok) == 3 else None

    pods = control_plane.wait_for(bound_pods, 90, what="3 Deployment pods to be bound")
    for pod in pods:
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"

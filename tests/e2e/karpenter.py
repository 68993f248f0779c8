"""Karpenter (its kwok provider) and kwok against the e2e control plane.

Both are built from Go modules by build-karpenter.sh (Karpenter v1.15.0, kwok v0.8.0); a missing
binary is built, never skipped, and a failed build fails the test with its output.

Why these two: Karpenter's kwok provider (``sigs.k8s.io/karpenter/kwok``) is the real Karpenter
(provisioning, its scheduling simulation, registration, disruption and consolidation) over a
cloud provider that creates Node objects instead of instances, from a built-in list of instance
types. kwok then does what kubelets would: it keeps those Nodes Ready (lease heartbeats) and
the pods bound to them Running, and deletes pods once they are being deleted, so evictions by
consolidation finish. Nothing else is faked: the kube-scheduler binds the pods.

Karpenter's CRDs come from the same module version (``kwok/charts/crds``, with the kwok
provider's restricted-label validation, and ``kwok/apis/crds`` for ``KWOKNodeClass``), kwok's
stages from its module's ``kustomize/stage`` (node-fast, heartbeat-with-lease, pod-fast: what
Karpenter's own kwok install applies as ``stage-fast.yaml``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from tests.e2e.cluster import E2E_DIR, ClusterError, Component, ControlPlane, free_port, wait_for

BUILD = E2E_DIR / "build-karpenter.sh"
BINARIES = ("karpenter-kwok", "kwok")
KWOK_NODE = "kwok.x-k8s.io/node"  # label and annotation the provider puts on its Nodes
NODEPOOL_LABEL = "karpenter.sh/nodepool"
NODE_CLASS = "default"


def _required(module: str, path: str) -> str:
    gomod = (E2E_DIR / "gomod" / module / "go.mod").read_text()
    match = re.search(rf"^require {re.escape(path)} (v\S+)$", gomod, re.M)
    if not match:
        raise RuntimeError(f"tests/e2e/gomod/{module}/go.mod names no {path} version")
    return match[1]


def versions() -> tuple[str, str]:
    """(Karpenter, kwok) as the helper modules pin them, e.g. ("v1.15.0", "v0.8.0")."""
    return _required("karpenter", "sigs.k8s.io/karpenter"), _required("kwok", "sigs.k8s.io/kwok")


def bin_dir() -> Path:
    karpenter, kwok = versions()
    default = Path.home() / ".cache" / "swapwise" / "karpenter" / f"{karpenter}-kwok-{kwok}" / "bin"
    return Path(os.environ.get("SWAPWISE_KARPENTER_BIN") or default)


def ensure_binaries() -> Path:
    """Build (or stamp-check: under a second) both binaries and copy the CRDs and stages;
    fail loudly when that fails."""
    env = {**os.environ, "SWAPWISE_KARPENTER_BIN": str(bin_dir())}
    proc = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=3600,
                          check=False, env=env)
    missing = [b for b in (*BINARIES, "crds", "kwok-stages") if not (bin_dir() / b).exists()]
    if proc.returncode != 0 or missing:
        raise ClusterError(
            f"Karpenter and kwok are needed and {BUILD} did not make them "
            f"(exit {proc.returncode}, missing: {missing or 'nothing'}); run `make karpenter`:\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
        )
    return bin_dir()


def kwok_config(stages: Path) -> str:
    """kwok's configuration with its stages inline: Nodes it manages are those the kwok
    provider annotates; no Stage CRDs needed."""
    documents = [json.dumps({
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        # The options of kwok's own deployment (kustomize/kwok/kwok.yaml): a configuration
        # file replaces kwok's defaults wholesale, parallelism included.
        "options": {
            "enablePodsOnNodeSyncStreamWatch": True,
            "nodeLeaseParallelism": 4,
            "podPlayStageParallelism": 4,
            "nodePlayStageParallelism": 4,
            "manageAllNodes": False,
            "manageNodesWithAnnotationSelector": f"{KWOK_NODE}=fake",
            "nodeLeaseDurationSeconds": 40,
            "cidr": "10.200.0.0/16",
            "nodeIP": "10.255.0.1",
        },
    })]
    documents += [p.read_text() for p in sorted(stages.glob("*.yaml"))]
    return "\n---\n".join(documents) + "\n"


class Karpenter:
    """Karpenter's CRDs installed, a Ready ``KWOKNodeClass`` named ``default``, kwok and
    Karpenter running (torn down with the control plane's components)."""

    def __init__(self, cp: ControlPlane, workdir: Path, *, log_level: str = "debug") -> None:
        self.cp = cp
        self.bin = ensure_binaries()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "kwok.yaml"
        config.write_text(kwok_config(self.bin / "kwok-stages"))
        self.kwok = Component("kwok", [
            str(self.bin / "kwok"), f"--kubeconfig={cp.kubeconfig}", f"--config={config}",
            f"--server-address=127.0.0.1:{free_port()}", f"--node-port={free_port()}",
        ], workdir / "kwok.log")
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.env = {
            **os.environ,
            "KUBECONFIG": str(cp.kubeconfig),
            "DISABLE_LEADER_ELECTION": "true",
            "HEALTH_PROBE_PORT": str(self.health_port),
            "METRICS_PORT": str(self.metrics_port),
            "LOG_LEVEL": log_level,
            "CPU_REQUESTS": "1000",
        }
        self.karpenter = Component("karpenter", [str(self.bin / "karpenter-kwok")],
                                   workdir / "karpenter.log")

    def __enter__(self) -> Karpenter:
        for crd in sorted((self.bin / "crds").glob("*.yaml")):
            self.cp.kubectl("apply", "--server-side", "-f", str(crd))
        for plural in ("nodepools.karpenter.sh", "nodeclaims.karpenter.sh",
                       "kwoknodeclasses.karpenter.kwok.sh"):
            self.cp.kubectl("wait", "--for=condition=Established", f"crd/{plural}",
                            "--timeout=60s")
        self.cp.apply(json.dumps({"apiVersion": "karpenter.kwok.sh/v1alpha1",
                                  "kind": "KWOKNodeClass", "metadata": {"name": NODE_CLASS}}))
        # No controller sets a KWOKNodeClass's status; a NodePool is Ready (and provisioned
        # for) only when its node class is, as Karpenter's own kwok tests set it.
        self.cp.kubectl("patch", "kwoknodeclass", NODE_CLASS, "--subresource=status",
                        "--type=merge", "-p", json.dumps({"status": {"conditions": [{
                            "type": "Ready", "status": "True", "reason": "Ready",
                            "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}))
        for component, env in ((self.kwok, None), (self.karpenter, self.env)):
            component.start(env)
            self.cp.components.append(component)  # logs on failure, teardown with the rest

        def healthy() -> bool:
            self.karpenter.check_alive()
            self.kwok.check_alive()
            url = f"http://127.0.0.1:{self.health_port}/readyz"
            with urllib.request.urlopen(url, timeout=5) as response:
                return bool(response.status == 200)

        wait_for(healthy, 120, what="Karpenter /readyz", on_timeout=self.logs)
        return self

    def __exit__(self, *exc: object) -> None:
        for component in (self.karpenter, self.kwok):
            component.stop(grace=5)

    def logs(self, lines: int = 80) -> str:
        return "\n".join(c.tail(lines) for c in (self.karpenter, self.kwok))

    def check_alive(self) -> None:
        self.karpenter.check_alive()
        self.kwok.check_alive()

    def nodepool(self, name: str, *, labels: dict[str, str] | None = None,
                 instance_types: list[str], consolidate_after: str = "5s",
                 weight: int | None = None) -> dict[str, Any]:
        """Apply a NodePool of the kwok node class, on-demand, of these instance types."""
        pool: dict[str, Any] = {
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
            "spec": {
                "template": {
                    "metadata": {"labels": dict(labels or {})},
                    "spec": {
                        "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass",
                                         "name": NODE_CLASS},
                        "requirements": [
                            {"key": "node.kubernetes.io/instance-type", "operator": "In",
                             "values": instance_types},
                            {"key": "karpenter.sh/capacity-type", "operator": "In",
                             "values": ["on-demand"]},
                        ],
                        "expireAfter": "Never",
                    },
                },
                "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized",
                               "consolidateAfter": consolidate_after,
                               "budgets": [{"nodes": "100%"}]},
            },
        }
        if weight is not None:
            pool["spec"]["weight"] = weight
        self.cp.apply(json.dumps(pool))

        def ready() -> bool:
            self.check_alive()
            stored = self.cp.get_json("nodepool", name)
            conditions = stored.get("status", {}).get("conditions", [])
            return any(c.get("type") == "Ready" and c.get("status") == "True"
                       for c in conditions)

        wait_for(ready, 60, what=f"NodePool {name} Ready", on_timeout=self.logs)
        return pool

    def nodeclaims(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.cp.get_json("nodeclaims")["items"]
        return items

"""The Vertical Pod Autoscaler's admission controller and updater against the e2e control plane.

Both are built from Go modules by build-vpa.sh (VPA 1.5.1, the release for Kubernetes 1.34);
a missing binary is built, never skipped, and a failed build fails the test with its output.
No recommender and no metrics server: the tests write each VPA's ``status.recommendation``
through the status subresource themselves (``set_recommendation``).

The admission controller serves TLS on 127.0.0.1 with certificates from ``swapwise certs`` and
registers itself, as it does in a cluster, as MutatingWebhookConfiguration
``vpa-webhook-config`` - here with ``clientConfig.url`` (there is no kube-proxy), and without
a ``reinvocationPolicy`` (so: ``Never``), exactly as its own self-registration writes it.
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

BUILD = E2E_DIR / "build-vpa.sh"
BINARIES = ("admission-controller", "updater")
CRD_FILE = "vpa-v1-crd-gen.yaml"  # copied next to the binaries from the module's deploy/
WEBHOOK_CONFIG = "vpa-webhook-config"  # the name the admission controller registers itself under
UPDATER_INTERVAL = 3.0  # seconds between the updater's passes (its default is a minute)


def vpa_version() -> str:
    gomod = (E2E_DIR / "gomod" / "vpa" / "go.mod").read_text()
    match = re.search(r"^require k8s\.io/autoscaler/vertical-pod-autoscaler v(\S+)$", gomod, re.M)
    if not match:
        raise RuntimeError("tests/e2e/gomod/vpa/go.mod names no vertical-pod-autoscaler version")
    return match[1]


def bin_dir() -> Path:
    default = Path.home() / ".cache" / "swapwise" / "vpa" / vpa_version() / "bin"
    return Path(os.environ.get("SWAPWISE_VPA_BIN") or default)


def ensure_binaries() -> Path:
    """Build (or stamp-check: under a second) both binaries; fail loudly when that fails."""
    env = {**os.environ, "SWAPWISE_VPA_BIN": str(bin_dir())}
    proc = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=3600,
                          check=False, env=env)
    missing = [b for b in (*BINARIES, CRD_FILE) if not (bin_dir() / b).is_file()]
    if proc.returncode != 0 or missing:
        raise ClusterError(
            f"the VPA binaries are needed and {BUILD} did not make them "
            f"(exit {proc.returncode}, missing: {missing or 'nothing'}); run `make vpa`:\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
        )
    return bin_dir()


class Vpa:
    """VPA CRDs installed, admission controller registered and serving, updater running."""

    def __init__(self, cp: ControlPlane, certs: Path, workdir: Path) -> None:
        """``certs``: a directory with ca.crt, tls.crt, tls.key for 127.0.0.1."""
        self.cp = cp
        self.bin = ensure_binaries()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        kubeconfig = f"--kubeconfig={cp.kubeconfig}"
        self.admission = Component("vpa-admission-controller", [
            str(self.bin / "admission-controller"), kubeconfig, "--v=4",
            f"--client-ca-file={certs / 'ca.crt'}", f"--tls-cert-file={certs / 'tls.crt'}",
            f"--tls-private-key={certs / 'tls.key'}", f"--port={self.port}",
            f"--address=127.0.0.1:{free_port()}", "--register-by-url=true",
            "--webhook-address=https://127.0.0.1", f"--webhook-port={self.port}",
            "--webhook-timeout-seconds=10",
        ], workdir / "vpa-admission-controller.log")
        self.updater_metrics = free_port()
        self.updater = Component("vpa-updater", [
            str(self.bin / "updater"), kubeconfig, "--v=4",
            f"--updater-interval={UPDATER_INTERVAL:g}s", "--min-replicas=1",
            f"--address=127.0.0.1:{self.updater_metrics}",
        ], workdir / "vpa-updater.log")

    def __enter__(self) -> Vpa:
        self.cp.apply((self.bin / CRD_FILE).read_text())
        wait_for(lambda: self.cp.kubectl("get", "verticalpodautoscalers", "-A",
                                         check=False).returncode == 0,
                 60, what="the VerticalPodAutoscaler API")
        for component in (self.admission, self.updater):
            component.start()
            self.cp.components.append(component)  # logs on failure, teardown with the rest

        def registered() -> bool:
            self.admission.check_alive()
            return self.cp.kubectl("get", "mutatingwebhookconfiguration", WEBHOOK_CONFIG,
                                   check=False).returncode == 0

        # It registers itself 10 s after start (its webHookDelay).
        wait_for(registered, 60, what=f"{WEBHOOK_CONFIG} registered", on_timeout=self.logs)
        return self

    def __exit__(self, *exc: object) -> None:
        for component in (self.updater, self.admission):
            component.stop(grace=5)

    def logs(self, lines: int = 60) -> str:
        return "\n".join(c.tail(lines) for c in (self.admission, self.updater))

    def check_alive(self) -> None:
        self.admission.check_alive()
        self.updater.check_alive()

    def updater_metrics_text(self) -> str:
        url = f"http://127.0.0.1:{self.updater_metrics}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    def updater_metric(self, name: str, **labels: str) -> float:
        """Sum of the updater's samples of ``name`` whose labels include ``labels``."""
        total = 0.0
        for line in self.updater_metrics_text().splitlines():
            match = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
            if not match or match[1] != name:
                continue
            found = dict(re.findall(r'(\w+)="([^"]*)"', match[2] or ""))
            if all(found.get(k) == v for k, v in labels.items()):
                total += float(match[3])
        return total

    def updater_passes(self) -> int:
        """Passes that got as far as weighing pods for eviction (VPAs listed, pods listed, the
        admission controller's status valid): its ``AdmissionInit`` step, timed once a pass."""
        return int(self.updater_metric("vpa_updater_execution_latency_seconds_count",
                                       step="AdmissionInit"))

    def evictions(self, namespace: str) -> int:
        return int(self.updater_metric("vpa_updater_evicted_pods_total",
                                       vpa_namespace=namespace))


def vpa_object(name: str, namespace: str, target: str, mode: str = "Recreate") -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling.k8s.io/v1",
        "kind": "VerticalPodAutoscaler",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "updatePolicy": {"updateMode": mode},
        },
    }


def set_recommendation(
    cp: ControlPlane, name: str, namespace: str, container: str,
    target: dict[str, str], lower: dict[str, str], upper: dict[str, str],
) -> None:
    """Write ``status.recommendation`` as the recommender would (status subresource)."""
    status = {"status": {"recommendation": {"containerRecommendations": [{
        "containerName": container, "target": target, "lowerBound": lower,
        "upperBound": upper, "uncappedTarget": target,
    }]}, "conditions": [{"type": "RecommendationProvided", "status": "True",
                         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
    cp.kubectl("patch", "verticalpodautoscaler", name, "-n", namespace, "--subresource=status",
               "--type=merge", "-p", json.dumps(status))

"""Every manifest the chart renders is accepted by the real kube-apiserver (dry run).

kubernetes-validate checks the schema offline (tests/chart); this adds what only the API
server knows: CEL matchConditions compile, webhook and PDB validation, RBAC, defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.chartlib import Chart, is_crd_kind, server_side_dry_run
from tests.e2e.cluster import K8S_VERSION, ControlPlane

pytestmark = [pytest.mark.e2e, pytest.mark.smoke]

VALUES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "profiles-and-fail": {
        "policy": {"profiles": {"sandbox": {"swapRatio": 2}, "ci": {"requestRatio": 0.5}},
                   "namespaces": {"team-a": {"minRequest": "128Mi"}}},
        "webhook": {"failurePolicy": "Fail", "timeoutSeconds": 10,
                    "excludeNamespaces": ["monitoring"]},
    },
    "cert-manager-and-monitor": {
        "certs": {"mode": "certManager"},
        "metrics": {"serviceMonitor": {"enabled": True}},
    },
    "node-agent-off": {"nodeAgent": {"enabled": False}},
    "node-agent-kubelet-taint": {"nodeAgent": {
        "swapBehaviorSource": "kubelet", "kubelet": {"insecureTLS": True},
        "kubepodsPressure": False, "pressureMarks": {
            "markWith": "taint", "memory": {"markAbove": 35, "clearBelow": 5},
            "markWindow": 5, "clearWindow": 120}}},
    "url-mode": {"webhook": {"url": "https://127.0.0.1:8443"}},
}


@pytest.mark.parametrize("name", sorted(VALUES))
def test_rendered_chart_is_accepted_by_the_api_server(
    control_plane: ControlPlane, tmp_path: Path, name: str
) -> None:
    chart = Chart(control_plane.helm, tmp_path, kube_version=K8S_VERSION.lstrip("v"))
    objects = chart.render(VALUES[name], release=f"dry-{name}", namespace=f"dry-{name}")
    core = [o for o in objects if not is_crd_kind(o)]
    assert core, "nothing rendered"
    result = server_side_dry_run(core, kubectl=control_plane.bin / "kubectl",
                                 kubeconfig=control_plane.kubeconfig)
    assert result.returncode == 0, result.stderr
    returned = yaml.safe_load(result.stdout)
    items = returned["items"] if returned["kind"] == "List" else [returned]
    assert sorted(i["kind"] for i in items) == sorted(o["kind"] for o in core)

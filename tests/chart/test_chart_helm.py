"""The chart tests run with the Helm SWAPWISE_HELM selects (3 or 4; `make test` runs both).

This file proves the selection is real (the binary in use is that major version) and pins
what differs between the two for this chart.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from chartlib import CHART, HELM_MAJOR, HELM_VERSION, Chart, helm_major, one


def test_the_selected_helm_is_the_one_in_use(helm_bin: Path) -> None:
    assert helm_major(helm_bin) == HELM_MAJOR
    chart = Chart(helm_bin, Path("."))
    version = chart.run("version", "--template={{.Version}}").stdout.strip()
    assert version == HELM_VERSION


def test_default_kube_version_satisfies_the_chart(chart: Chart) -> None:
    """Without --kube-version, `helm template` assumes a cluster version: Helm 3 the one
    stamped at build time (the line's minor, build-control-plane.sh), Helm 4 the minor of
    the k8s.io/client-go it was built with (v0.37 -> 1.37). Both satisfy kubeVersion."""
    wanted = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    assert wanted == ">=1.34.0-0"
    proc = chart.run("template", "sw", str(CHART), "--namespace", "swapwise-system")
    assert proc.returncode == 0, proc.stderr
    objs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert one(objs, "MutatingWebhookConfiguration")["metadata"]["name"] == "sw-swapwise"
    version = chart.run("version").stdout
    if HELM_MAJOR == "4":
        assert 'KubeClientVersion:"v1.37"' in version, version


def test_too_old_a_cluster_is_refused(chart: Chart) -> None:
    """kubeVersion >=1.34 is enforced by both majors, with the same message."""
    proc = chart.run("template", "sw", str(CHART), "--kube-version", "1.33.0")
    assert proc.returncode != 0
    assert "1.33.0" in proc.stderr and ">=1.34.0-0" in proc.stderr, proc.stderr

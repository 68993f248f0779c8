"""One setting each picks the Kubernetes line (SWAPWISE_K8S_VERSION) and the Helm
(SWAPWISE_HELM) of the e2e suite and the chart tests; the build script reads the same ones."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOMOD = ROOT / "tests" / "e2e" / "gomod"

PROBE = """
import json
from tests.e2e import cluster
from tests.chart import chartlib
print(json.dumps({
    "line": cluster.DEFAULT_LINE, "version": cluster.K8S_VERSION,
    "bin": str(cluster.bin_dir()), "bin_134": str(cluster.bin_dir("1.34")),
    "binaries": cluster.ALL_BINARIES, "helm": cluster.HELM_NAME,
    "chart_helm": [chartlib.HELM_NAME, chartlib.HELM_VERSION, chartlib.HELM_PACKAGE],
}))
"""


def _settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("SWAPWISE_K8S", "SWAPWISE_HELM")) and k != "HELM"}
    return subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False,
                          env={**clean, "HOME": str(tmp_path), **env})


def _required(module: str, path: str) -> str:
    match = re.search(rf"^require {re.escape(path)} (v\S+)$",
                      (GOMOD / module / "go.mod").read_text(), re.MULTILINE)
    assert match, f"no `require {path}` in gomod/{module}/go.mod"
    return match.group(1)


def test_default_is_1_34_with_helm_3(tmp_path: Path) -> None:
    got = json.loads(_settings(tmp_path).stdout)
    assert got["line"] == "1.34" and got["version"] == _required("kubernetes", "k8s.io/kubernetes")
    assert got["bin"] == str(tmp_path / ".cache/swapwise/k8s" / got["version"] / "bin")
    assert got["helm"] == "helm" and got["binaries"][-1] == "helm"
    assert got["chart_helm"] == ["helm", _required("helm", "helm.sh/helm/v3"),
                                 "helm.sh/helm/v3/cmd/helm"]


def test_1_37_with_helm_4(tmp_path: Path) -> None:
    got = json.loads(_settings(tmp_path, SWAPWISE_K8S_VERSION="1.37", SWAPWISE_HELM="4").stdout)
    version = _required("kubernetes-1.37", "k8s.io/kubernetes")
    assert got["line"] == "1.37" and got["version"] == version == "v1.37.2"
    assert got["bin"] == str(tmp_path / ".cache/swapwise/k8s/v1.37.2/bin")
    assert got["bin_134"] == str(tmp_path / ".cache/swapwise/k8s/v1.34.4/bin")
    assert got["helm"] == "helm4" and "helm" not in got["binaries"]
    assert got["chart_helm"] == ["helm4", _required("helm4", "helm.sh/helm/v4"),
                                 "helm.sh/helm/v4/cmd/helm"]


@pytest.mark.parametrize("variable, value", [("SWAPWISE_K8S_VERSION", "1.35"),
                                             ("SWAPWISE_HELM", "2")])
def test_an_unknown_setting_is_refused(tmp_path: Path, variable: str, value: str) -> None:
    proc = _settings(tmp_path, **{variable: value})
    assert proc.returncode != 0
    assert f"{variable}={value}" in proc.stderr


def test_the_build_script_knows_every_line_and_both_helms() -> None:
    from tests.e2e.cluster import BASE_LINE, LINES

    script = (ROOT / "tests" / "e2e" / "build-control-plane.sh").read_text()
    assert re.search(r"^all=\(.*\bhelm helm4\)$", script, re.MULTILINE)
    for line in LINES:
        module = "kubernetes" if line == BASE_LINE else f"kubernetes-{line}"
        assert _required(module, "k8s.io/kubernetes").startswith(f"v{line}.")

"""A Prometheus that scrapes the real node's kubelet the way docs/monitoring.md tells users to,
and a kube-state-metrics as users' clusters run it (``swapwise tune`` reads both).

The scrape jobs and the ClusterRole are read from the doc's `prometheus-kubelet.yaml` and
`prometheus-kubelet-rbac.yaml` blocks, so what users copy is what ran here. Three
substitutions, two because this Prometheus runs outside the cluster (no service-account
files), one because the node is emulated:

- discovery (`kubernetes_sd_configs`) reads a kubeconfig instead of the in-cluster config;
- the scrape authenticates with a client certificate instead of a service-account token;
- `/metrics/resource` is scraped every 60 s with a 60 s timeout: under memory pressure the
  emulated node's kubelet took 38 s to answer it (measured with curl), where a real node
  answers in well under the default 10 s. `/metrics/cadvisor` (served from cAdvisor's cache)
  keeps the documented 15 s, so that ``tune`` has samples within minutes.

Both use one identity, a user bound only to the documented ClusterRole: discovery proves the
role's `nodes` list/watch, and the kubelet (webhook authorization) asks the API server whether
that user may `get` `nodes/metrics` on every scrape. kube-state-metrics runs on loopback with
the admin kubeconfig, its pods' annotations allow-listed as docs/monitoring.md says.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from testkit.docs import load
from tests.e2e.cluster import Component, ControlPlane, free_port, wait_for
from tests.monitoring.prom import Prometheus, queries
from webhook.engine.pod import PROFILE_ANNOTATION

REPO = Path(__file__).resolve().parents[2]

USER = "swapwise-e2e-prometheus"
DOC = "docs/monitoring.md"
SLOW_NODE = "60s"  # /metrics/resource's interval and timeout on the emulated node (the top)
RESOURCE_JOB = "kubelet-resource"
KSM_BUILD = REPO / "tests" / "e2e" / "build-kube-state-metrics.sh"
# The panel over the per-container figures: the kubelet takes those from the runtime's CRI
# stats, and containerd 1.6 (the harness's) reports them as 0, so `limit > 0` leaves nothing.
PER_CONTAINER_PANEL = "Container swap use of its limit (top 10)"


def documented() -> tuple[list[dict[str, Any]], str]:
    """The doc's kubelet scrape jobs and their RBAC manifest, as written."""
    files = load(DOC).files
    jobs = yaml.safe_load(files["prometheus-kubelet.yaml"])["scrape_configs"]
    assert [j["metrics_path"] for j in jobs] == ["/metrics/resource", "/metrics/cadvisor"], jobs
    return jobs, files["prometheus-kubelet-rbac.yaml"]


def ksm_version() -> str:
    gomod = (REPO / "tests" / "e2e" / "gomod" / "kube-state-metrics" / "go.mod").read_text()
    match = re.search(r"^require k8s.io/kube-state-metrics/v2 v(\S+)$", gomod, re.M)
    assert match, "tests/e2e/gomod/kube-state-metrics/go.mod names no version"
    return match[1]


def ksm_binary() -> Path:
    """kube-state-metrics, built first when missing or stale (the script checks its stamp)."""
    default = Path.home() / ".cache/swapwise/kube-state-metrics" / ksm_version() / "bin"
    path = Path(os.environ.get("SWAPWISE_KSM_BIN", default)) / "kube-state-metrics"
    proc = subprocess.run([str(KSM_BUILD)], capture_output=True, text=True, timeout=3600,
                          check=False)
    if proc.returncode != 0 or not path.is_file():
        raise RuntimeError(f"{KSM_BUILD} failed:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    return path


@contextmanager
def kube_state_metrics(cp: ControlPlane, workdir: Path, resources: str = "pods",
                       annotations: str = f"pods=[{PROFILE_ANNOTATION}]",
                       labels: str | None = None) -> Iterator[int]:
    """kube-state-metrics over ``resources``, with the profile annotation allow-listed (and
    ``labels``, an allowlist of node labels, when given); its port."""
    port, telemetry = free_port(), free_port()
    component = Component("kube-state-metrics", [
        str(ksm_binary()), f"--kubeconfig={cp.kubeconfig}", f"--resources={resources}",
        *([f"--metric-labels-allowlist={labels}"] if labels else []),
        f"--metric-annotations-allowlist={annotations}",
        "--host=127.0.0.1", f"--port={port}",
        "--telemetry-host=127.0.0.1", f"--telemetry-port={telemetry}",
    ], workdir / "kube-state-metrics.log")
    component.start()

    def ready() -> bool:
        component.check_alive()
        try:
            # /readyz is on the telemetry port: OK once it has gathered its own metrics.
            with urllib.request.urlopen(f"http://127.0.0.1:{telemetry}/readyz",
                                        timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    try:
        wait_for(ready, 120, what="kube-state-metrics /readyz", on_timeout=component.tail)
        yield port
    finally:
        component.stop()


def kubelet_queries() -> list[tuple[str, str]]:
    """The dashboard's queries over the kubelet's swap metrics (the rest are swapwise's)."""
    return [(title, expr) for title, expr in queries() if "swapwise_" not in expr]


def _kubeconfig(cp: ControlPlane, crt: Path, key: Path, path: Path) -> Path:
    """The admin kubeconfig with the user swapped: same cluster and CA, this certificate."""
    config = json.loads(cp.kubeconfig.read_text())
    config["users"] = [{"name": "admin", "user": {"client-certificate": str(crt),
                                                  "client-key": str(key)}}]
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)
    return path


@contextmanager
def kubelet_prometheus(cp: ControlPlane, workdir: Path) -> Iterator[Prometheus]:
    """Prometheus scraping every node's ``/metrics/resource`` and ``/metrics/cadvisor`` with
    the documented jobs, and a kube-state-metrics."""
    jobs, rbac = documented()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "rbac.yaml").write_text(rbac)
    cp.kubectl("apply", "-f", str(workdir / "rbac.yaml"))
    role = yaml.safe_load(rbac)["metadata"]["name"]
    cp.kubectl("create", "clusterrolebinding", role, f"--clusterrole={role}", f"--user={USER}")
    crt, key = cp.issue_client_cert("prometheus", USER)

    kubeconfig = str(_kubeconfig(cp, crt, key, workdir / "kubeconfig"))
    for job in jobs:
        [discovery] = job["kubernetes_sd_configs"]
        discovery["kubeconfig_file"] = kubeconfig
        del job["authorization"]
        job["tls_config"] |= {"cert_file": str(crt), "key_file": str(key)}
        if job["job_name"] == RESOURCE_JOB:
            job["scrape_interval"] = job["scrape_timeout"] = SLOW_NODE
        else:
            job["scrape_timeout"] = job["scrape_interval"]
    try:
        with (kube_state_metrics(cp, workdir) as ksm_port,
              Prometheus(workdir, [*jobs, {
                  "job_name": "kube-state-metrics", "scrape_interval": "15s",
                  "static_configs": [{"targets": [f"127.0.0.1:{ksm_port}"]}]}],
                  scrape_interval=SLOW_NODE) as prom):
            yield prom
    finally:
        cp.kubectl("delete", "clusterrolebinding", role, "--ignore-not-found")
        cp.kubectl("delete", "-f", str(workdir / "rbac.yaml"), "--ignore-not-found")


def swap_figures(prom: Prometheus, node: str, namespace: str) -> dict[str, Any]:
    """What the kubelet panels show for one node and one namespace, as plain numbers."""

    def values(expr: str) -> list[float]:
        return [float(r["value"][1]) for r in prom.query(expr)]

    [target] = [t for t in prom.api("targets")["activeTargets"]
                if t["labels"].get("job") == RESOURCE_JOB]
    return {
        "target_health": target["health"],
        "target_node": target["labels"].get("node"),
        "node_swap_usage_bytes": values(f'sum(node_swap_usage_bytes{{node="{node}"}})'),
        "pods_reported": len(prom.query(f'pod_swap_usage_bytes{{namespace="{namespace}"}}')),
        "containers_reported": len(prom.query(
            f'container_swap_usage_bytes{{namespace="{namespace}"}}')),
        "pod_swap_usage_bytes_sum": values(
            f'sum(pod_swap_usage_bytes{{namespace="{namespace}"}})'),
        "container_swap_limit_bytes_max": values(
            f'max(container_swap_limit_bytes{{namespace="{namespace}"}})'),
        "container_swap_usage_bytes_max": values(
            f'max(container_swap_usage_bytes{{namespace="{namespace}"}})'),
        "rules_health": sorted({r["health"] for g in prom.api("rules")["groups"]
                                for r in g["rules"]}),
    }

"""A Prometheus that scrapes the real node's kubelet the way docs/monitoring.md tells users to.

The scrape job and the ClusterRole are read from the doc's `prometheus-kubelet.yaml` and
`prometheus-kubelet-rbac.yaml` blocks, so what users copy is what ran here. Three
substitutions, two because this Prometheus runs outside the cluster (no service-account
files), one because the node is emulated:

- discovery (`kubernetes_sd_configs`) reads a kubeconfig instead of the in-cluster config;
- the scrape authenticates with a client certificate instead of a service-account token;
- the scrape timeout is 60 s (and the interval with it): under memory pressure the emulated
  node's kubelet took 38 s to answer `/metrics/resource` (measured with curl), where a real
  node answers in well under the default 10 s.

Both use one identity, a user bound only to the documented ClusterRole: discovery proves the
role's `nodes` list/watch, and the kubelet (webhook authorization) asks the API server whether
that user may `get` `nodes/metrics` on every scrape.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.cluster import ControlPlane
from tests.monitoring.prom import Prometheus, queries
from tests.support.docs import load

USER = "swapwise-e2e-prometheus"
DOC = "docs/monitoring.md"
SLOW_NODE = "60s"  # scrape interval and timeout for the emulated node (see the top)
# The panel over the per-container figures: the kubelet takes those from the runtime's CRI
# stats, and containerd 1.6 (the harness's) reports them as 0, so `limit > 0` leaves nothing.
PER_CONTAINER_PANEL = "Container swap use of its limit (top 10)"


def documented() -> tuple[dict[str, Any], str]:
    """The doc's kubelet scrape job and its RBAC manifest, as written."""
    files = load(DOC).files
    jobs = yaml.safe_load(files["prometheus-kubelet.yaml"])["scrape_configs"]
    assert len(jobs) == 1, jobs
    return jobs[0], files["prometheus-kubelet-rbac.yaml"]


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
    """Prometheus scraping every node's ``/metrics/resource`` with the documented job."""
    job, rbac = documented()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "rbac.yaml").write_text(rbac)
    cp.kubectl("apply", "-f", str(workdir / "rbac.yaml"))
    role = yaml.safe_load(rbac)["metadata"]["name"]
    cp.kubectl("create", "clusterrolebinding", role, f"--clusterrole={role}", f"--user={USER}")
    crt, key = cp.issue_client_cert("prometheus", USER)

    [discovery] = job["kubernetes_sd_configs"]
    discovery["kubeconfig_file"] = str(_kubeconfig(cp, crt, key, workdir / "kubeconfig"))
    del job["authorization"]
    job["tls_config"] |= {"cert_file": str(crt), "key_file": str(key)}
    job["scrape_interval"] = job["scrape_timeout"] = SLOW_NODE
    try:
        with Prometheus(workdir, [job], scrape_interval=SLOW_NODE) as prom:
            yield prom
    finally:
        cp.kubectl("delete", "clusterrolebinding", role, "--ignore-not-found")
        cp.kubectl("delete", "-f", str(workdir / "rbac.yaml"), "--ignore-not-found")


def swap_figures(prom: Prometheus, node: str, namespace: str) -> dict[str, Any]:
    """What the kubelet panels show for one node and one namespace, as plain numbers."""

    def values(expr: str) -> list[float]:
        return [float(r["value"][1]) for r in prom.query(expr)]

    [target] = prom.api("targets")["activeTargets"]
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

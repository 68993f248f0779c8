"""A real Prometheus (built from Go modules) scrapes a running `swapwise serve` and a running
`swapwise label-nodes`, loads the chart's alerting rules, and every dashboard query over
swapwise's metrics returns data.

Traffic that makes each series exist: mutated, unchanged and unknown-profile admission
reviews, a body that is not an AdmissionReview and one over 3 MiB, straight to the server
over TLS; the labeller runs its pressure guard on a fake swap node whose stand-in kubelet
reports memory PSI (tests/e2e/fakekubelet.py). The kubelet's swap metrics need a real
kubelet (tests/node); here the panels on them are only parsed (tests/monitoring/test_rules.py).
"""

from __future__ import annotations

import contextlib
import json
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from tests.e2e.test_labeller import GI, LIMITED, LabellerProcess
from webhook.labeller.pressure import DEFAULT_CLEAR_BELOW, DEFAULT_MARK_ABOVE

from testkit.pods import container, guaranteed, pod, review
from tests.e2e.cluster import ControlPlane, Swapwise, wait_for
from tests.e2e.fakekubelet import fake_kubelets, host_address
from tests.monitoring.prom import RULES, Prometheus, queries

OWN_METRIC = re.compile(r"(?<![a-z_])swapwise_")
pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Monitored:
    prom: Prometheus
    bad_request: Callable[[], int]  # sends a body swapwise refuses; returns the status
    psi_node: bool  # a swap node with a stand-in kubelet: the per-node PSI series exist


PSI_NODE = "monitoring-psi"
PSI_QUERY = "swapwise_labeller_memory_psi_avg10_percent"


def post(url: str, body: bytes, ctx: ssl.SSLContext) -> int:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


@pytest.fixture(scope="module")
def monitored(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Monitored]:
    workdir = tmp_path_factory.mktemp("monitoring")
    cp = control_plane
    cp.create_node(PSI_NODE, memory="16Gi", cpu="8", labels=LIMITED, swap_capacity=8 * GI)
    with contextlib.ExitStack() as stack:
        stack.callback(cp.kubectl, "delete", "node", PSI_NODE, "--wait=false", check=False)
        psi_node = host_address() is not None  # else the per-node PSI panel stays empty
        if psi_node:
            stack.enter_context(fake_kubelets(cp, [PSI_NODE]))[PSI_NODE].answer(12.5)
        labeller = LabellerProcess(cp, "monitoring-0", "swapwise.io/test-monitoring",
                                   "monitoring-labeller",
                                   extra=("--pressure-guard", "--pressure-interval", "1"))
        stack.callback(labeller.stop)
        labeller.start()
        sw = stack.enter_context(Swapwise(workdir / "swapwise"))
        ctx = ssl.create_default_context(cafile=str(sw.cert_dir / "ca.crt"))
        mutated = review(pod(guaranteed()), namespace="team")
        unchanged = review(pod(container(request="256Mi", limit="1Gi"), nodeName="n1"),
                           namespace="team")  # bound, swap-eligible: nothing to do
        for _ in range(3):
            for url, body, status in (
                (f"{sw.url_base}/mutate/default", json.dumps(mutated).encode(), 200),
                (f"{sw.url_base}/mutate/default", json.dumps(unchanged).encode(), 200),
                (f"{sw.url_base}/mutate/gone", json.dumps(mutated).encode(), 200),
                (f"{sw.url_base}/mutate/default", b'{"kind": "Pod"}', 400),
                (f"{sw.url_base}/mutate/default", b"x" * (3 * 1024 * 1024 + 1), 413),
            ):
                assert post(url, body, ctx) == status
        scrape = [
            {"job_name": "swapwise", "scheme": "https",
             "tls_config": {"ca_file": str(sw.cert_dir / "ca.crt")},
             "static_configs": [{"targets": [f"127.0.0.1:{sw.port}"]}]},
            {"job_name": "swapwise-labeller",
             "static_configs": [{"targets": [f"127.0.0.1:{labeller.port}"]}]},
        ]
        with Prometheus(workdir / "prometheus", scrape) as prom:
            yield Monitored(prom, lambda: post(f"{sw.url_base}/mutate/default", b"[]", ctx),
                            psi_node)


def test_both_targets_are_up_and_the_alert_rules_load(monitored: Monitored) -> None:
    def up() -> list[dict[str, Any]] | None:
        targets = monitored.prom.api("targets")["activeTargets"]
        return targets if len(targets) == 2 and all(
            t["health"] == "up" for t in targets) else None

    targets = wait_for(up, 30, what="both targets up")
    assert {t["labels"]["job"] for t in targets} == {"swapwise", "swapwise-labeller"}
    groups = monitored.prom.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == len([line for line in RULES.read_text().splitlines()
                              if line.strip().startswith("- alert:")]) == 9
    assert all(r["type"] == "alerting" and r["health"] == "ok" for r in rules), rules


def test_every_swapwise_dashboard_query_returns_data(monitored: Monitored) -> None:
    # Panels on swapwise's own metrics; the tune panel reads kube-state-metrics and cAdvisor
    # (its label annotation_swapwise_io_profile is not a metric of ours): tests/e2e/test_tune.py.
    ours = [(title, expr) for title, expr in queries() if OWN_METRIC.search(expr)]
    assert len(ours) >= 22
    if not monitored.psi_node:  # no stand-in kubelet on this machine: no per-node series
        ours = [(title, expr) for title, expr in ours if PSI_QUERY not in expr]
    empty = monitored.prom.without_data(ours, 60)
    assert not empty, f"dashboard queries without data: {empty}"
    # The numbers are the traffic sent: 3 of each outcome.
    outcomes = {r["metric"]["outcome"]: float(r["value"][1]) for r in monitored.prom.query(
        "sum by (outcome) (swapwise_admission_requests_total)")}
    assert outcomes == {"mutated": 3, "unchanged": 3, "unknown_profile": 3, "invalid": 3,
                        "too_large": 3}
    [changed] = monitored.prom.query("sum(swapwise_containers_changed_total)")
    assert float(changed["value"][1]) == 3
    [leaders] = monitored.prom.query("sum(swapwise_labeller_is_leader)")
    assert float(leaders["value"][1]) == 1
    # And the admission-error alert's expression sees bad bodies sent while it watches
    # (a counter's first sample gives rate() nothing: what came before is not an increase).
    assert monitored.bad_request() == 400
    expr = ('sum without (profile) (rate(swapwise_admission_requests_total'
            '{outcome=~"error|invalid|too_large"}[5m])) > 0')
    errors = wait_for(lambda: monitored.prom.query(expr) or None, 30, what="error rate above 0")
    assert {r["metric"]["outcome"] for r in errors} == {"invalid"}


def test_the_pressure_panel_shows_the_nodes_psi_and_the_thresholds(monitored: Monitored) -> None:
    """The guard's own figures, as the dashboard queries them: the stand-in kubelet's PSI
    for its node, the default thresholds, no node marked."""
    if not monitored.psi_node:
        pytest.skip("no stand-in kubelet on this machine (no global unicast address)")
    [panel] = [expr for title, expr in queries()
               if title.startswith("Memory pressure on swap nodes") and PSI_QUERY in expr]
    series = wait_for(lambda: {r["metric"]["node"]: float(r["value"][1])
                               for r in monitored.prom.query(panel)} or None,
                      30, what="the PSI panel's series")
    assert series[PSI_NODE] == 12.5
    thresholds = {r["metric"]["bound"]: float(r["value"][1]) for r in monitored.prom.query(
        "max by (bound) (swapwise_labeller_pressure_threshold_percent)")}
    assert thresholds == {"mark": DEFAULT_MARK_ABOVE, "clear": DEFAULT_CLEAR_BELOW}
    [marked] = monitored.prom.query("max(swapwise_labeller_pressure_marked_nodes)")
    assert float(marked["value"][1]) == 0

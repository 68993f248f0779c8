"""A real Prometheus scrapes a running `swapwise serve`, three running `swapwise node-agent`s
and a kube-state-metrics, loads the chart's alerting rules, and every dashboard query over
swapwise's metrics and labels returns data: the figures the test made.

The agents run against the real e2e API server, each on a host of files whose PSI counters
advance at a stall percent the test sets (tests/e2e/agent.py):

- ``monitoring-swap``: disk and zram swap, LimitedSwap declared; its memory is marked and
  cleared, then its CPU is marked and left so;
- ``monitoring-plain``: no swap; its agent's user may read its Node but neither watch nor
  patch it (watch restarts, failed patches);
- ``monitoring-blind``: its kubelet (``--swap-behavior-source kubelet``) and its
  ``/proc/swaps`` cannot be read (unknown verdict, kubelet and kernel read errors);
- ``monitoring-orphan``: labelled a swap node, with no agent.

Prometheus finds the agents the way docs/monitoring.md's plain-Prometheus job does (the
chart's PodMonitor is the same selection): pods in the namespace with the node-agent labels
and a container port named ``metrics``. They stand for the DaemonSet's pods: bound to the
agents' nodes, with status.podIP 127.0.0.1 and the port each agent listens on (no kubelet
runs them here). Substitutions: discovery reads a kubeconfig of a user bound only to the
documented Role (Prometheus runs outside the cluster); the namespace is the test's; the
scrape interval is 1 s. kube-state-metrics runs with the allowlists the doc names.

The kubelet's swap metrics need a real kubelet (tests/node); the panels on them are only
parsed here (tests/monitoring/test_rules.py).
"""

from __future__ import annotations

import contextlib
import json
import re
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from testkit.docs import load
from testkit.pods import container, guaranteed, pod, review
from tests.e2e.agent import AgentProcess, FakeHost
from tests.e2e.cluster import ControlPlane, Swapwise, free_port, wait_for
from tests.monitoring.prom import DASHBOARD, RULES, Prometheus, queries
from tests.node.kubelet_prometheus import kube_state_metrics
from webhook.agent.stall import CPU_DEFAULTS, MEMORY_DEFAULTS
from webhook.engine.nodes import BEHAVIOR_LABEL, KIND_LABEL, SWAP_NODE_LABEL
from webhook.engine.pod import PROFILE_ANNOTATION
from webhook.engine.pressure import CPU_MARK, MEMORY_MARK

# swapwise's own metrics, and the labels its node agents write (kube-state-metrics'
# label_swapwise_io_*); not the tune panel's annotation label (it reads cAdvisor: test_tune.py)
OURS = re.compile(r"(?<![a-z_])swapwise_|\blabel_swapwise_io_")
pytestmark = pytest.mark.e2e

GI = 1 << 30
NAMESPACE = "swapwise-monitoring"
SWAP, PLAIN, BLIND, ORPHAN = ("monitoring-swap", "monitoring-plain", "monitoring-blind",
                              "monitoring-orphan")
AGENT_LABELS = {"app.kubernetes.io/name": "swapwise", "app.kubernetes.io/instance": "monitoring",
                "app.kubernetes.io/component": "node-agent"}
READER = "swapwise-monitoring-reader"  # may get nodes: no watch, no patch
PROMETHEUS_USER = "swapwise-monitoring-prometheus"
DOC = "docs/monitoring.md"
# the swap node: 8 GiB disk + 4 GiB zram on 16 GiB of memory; zram backs nothing by default
DISK, ZRAM, MEMORY = 8 * GI, 4 * GI, 16 * GI
PERMILLE = 1000 * DISK // MEMORY
T = TypeVar("T")


@dataclass
class Monitored:
    cp: ControlPlane
    prom: Prometheus
    bad_request: Callable[[], int]  # sends a body swapwise refuses; returns the status
    agents: dict[str, AgentProcess]
    hosts: dict[str, FakeHost]
    memory_marked_at: float  # a time Prometheus saw the swap node's memory mark


def post(url: str, body: bytes, ctx: ssl.SSLContext) -> int:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def user_kubeconfig(cp: ControlPlane, user: str, path: Path) -> Path:
    """The admin kubeconfig with the user swapped for a client certificate of ``user``."""
    crt, key = cp.issue_client_cert(user, user)
    config = json.loads(cp.kubeconfig.read_text())
    config["users"] = [{"name": "admin", "user": {"client-certificate": str(crt),
                                                  "client-key": str(key)}}]
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)
    return path


def documented_agent_scrape(cp: ControlPlane, workdir: Path) -> dict[str, Any]:
    """The doc's node-agent job, its Role applied and bound to a user of its own."""
    files = load(DOC).files
    [job] = yaml.safe_load(files["prometheus-node-agent.yaml"])["scrape_configs"]
    role = yaml.safe_load(files["prometheus-node-agent-rbac.yaml"])
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == "swapwise-system"
    role["metadata"]["namespace"] = NAMESPACE
    cp.apply(json.dumps(role))
    cp.kubectl("create", "rolebinding", role["metadata"]["name"], "-n", NAMESPACE,
               f"--role={role['metadata']['name']}", f"--user={PROMETHEUS_USER}")
    [discovery] = job["kubernetes_sd_configs"]
    assert discovery["namespaces"] == {"names": ["swapwise-system"]}
    discovery["namespaces"] = {"names": [NAMESPACE]}
    discovery["kubeconfig_file"] = str(user_kubeconfig(cp, PROMETHEUS_USER,
                                                       workdir / "prometheus.kubeconfig"))
    job["scrape_interval"] = "1s"
    return dict(job)


def stand_in_pod(node: str, port: int) -> dict[str, Any]:
    """What the DaemonSet's pod on ``node`` looks like to Prometheus' discovery."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"node-agent-{node}", "namespace": NAMESPACE,
                         "labels": AGENT_LABELS},
            "spec": {"nodeName": node, "containers": [{
                "name": "node-agent", "image": "registry.example/swapwise:e2e",
                "ports": [{"name": "metrics", "containerPort": port}]}]}}


def reshaped_pod(name: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE,
                         "annotations": {PROFILE_ANNOTATION: "default"}},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app"}]}}


def ksm_allowlists() -> tuple[str, str]:
    """docs/monitoring.md's kube-state-metrics allowlists: node labels, pod annotations."""
    text = (Path(__file__).resolve().parents[2] / DOC).read_text()
    labels = re.search(r"--metric-labels-allowlist=(nodes=\[[^\]]*\])", text)
    annotations = re.search(r"--metric-annotations-allowlist=(pods=\[[^\]]*\])", text)
    assert labels and annotations, "docs/monitoring.md names no kube-state-metrics allowlists"
    assert labels[1] == f"nodes=[{SWAP_NODE_LABEL},{KIND_LABEL}]", labels[1]
    return labels[1], annotations[1]


def serves_metrics(agent: AgentProcess) -> bool:
    return agent.get("/metrics")[0] == 200


def _label(labels: dict[str, str], match: re.Match[str]) -> str:
    return labels.get(match[1], "")


def node_label(cp: ControlPlane, node: str, key: str) -> str | None:
    labels: dict[str, str] = cp.get_json("node", node)["metadata"].get("labels", {})
    return labels.get(key)


@pytest.fixture(scope="module")
def monitored(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Monitored]:
    workdir = tmp_path_factory.mktemp("monitoring")
    cp = control_plane
    with contextlib.ExitStack() as stack:
        cp.create_namespace(NAMESPACE)
        stack.callback(cp.kubectl, "delete", "namespace", NAMESPACE, "--wait=false",
                       check=False)
        for name, labels in ((SWAP, {BEHAVIOR_LABEL: "LimitedSwap"}), (PLAIN, {}),
                             (BLIND, {}), (ORPHAN, {SWAP_NODE_LABEL: "true"})):
            cp.create_node(name, memory="16Gi", cpu="8", labels=labels)
            stack.callback(cp.kubectl, "delete", "node", name, "--wait=false", check=False)
        cp.kubectl("create", "clusterrole", READER, "--verb=get", "--resource=nodes")
        stack.callback(cp.kubectl, "delete", "clusterrole", READER, check=False)
        cp.kubectl("create", "clusterrolebinding", READER, f"--clusterrole={READER}",
                   f"--user={READER}")
        stack.callback(cp.kubectl, "delete", "clusterrolebinding", READER, check=False)
        reader = user_kubeconfig(cp, READER, workdir / "reader.kubeconfig")

        hosts = {node: FakeHost(workdir / node) for node in (SWAP, PLAIN, BLIND)}
        for host in hosts.values():
            stack.callback(host.close)
        hosts[SWAP].swaps([("/swapfile", DISK), ("/dev/zram0", ZRAM)])
        (hosts[BLIND].proc / "swaps").unlink()
        agents = {
            SWAP: AgentProcess(cp, SWAP, hosts[SWAP],
                               ("--mark-window", "2", "--clear-window", "4")),
            PLAIN: AgentProcess(cp, PLAIN, hosts[PLAIN], kubeconfig=reader),
            BLIND: AgentProcess(cp, BLIND, hosts[BLIND], (
                "--swap-behavior-source", "kubelet", "--kubelet-address", "127.0.0.1",
                "--kubelet-port", str(free_port()))),
        }
        for node, agent in agents.items():
            stack.callback(agent.stop)
            agent.start(ready=node == SWAP)  # the other two never sync their Node
            wait_for(partial(serves_metrics, agent), 30, what=f"{node}'s agent /metrics",
                     on_timeout=agent.component.tail)
            cp.apply(json.dumps(stand_in_pod(node, agent.port)))
            cp.kubectl("patch", "pod", f"node-agent-{node}", "-n", NAMESPACE,
                       "--subresource=status", "--type=merge", "-p", json.dumps({"status": {
                           "phase": "Running", "podIP": "127.0.0.1",
                           "podIPs": [{"ip": "127.0.0.1"}]}}))
        for name, node in (("reshaped-on-swap", SWAP), ("reshaped-on-plain", PLAIN)):
            cp.apply(json.dumps(reshaped_pod(name, node)))

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
        labels, annotations = ksm_allowlists()
        ksm = stack.enter_context(kube_state_metrics(cp, workdir, "nodes,pods", annotations,
                                                     labels))
        agent_job = documented_agent_scrape(cp, workdir)
        scrape = [
            {"job_name": "swapwise", "scheme": "https",
             "tls_config": {"ca_file": str(sw.cert_dir / "ca.crt")},
             "static_configs": [{"targets": [f"127.0.0.1:{sw.port}"]}]},
            agent_job,
            {"job_name": "kube-state-metrics",
             "static_configs": [{"targets": [f"127.0.0.1:{ksm}"]}]},
        ]
        prom = stack.enter_context(Prometheus(workdir / "prometheus", scrape))

        # The swap node's pressure, while Prometheus watches (it has scraped every agent: a
        # mark before the first scrape would be no increase to it): memory marked, then
        # cleared; CPU marked and left so; memory back at a stall below its threshold.
        watching = ('count(swapwise_node_agent_pressure_transitions_total'
                    '{resource="memory", to="marked"} == 0) == 3')
        wait_for(lambda: prom.query(watching) or None, 60, what="every agent scraped")
        host = hosts[SWAP]
        host.stall("memory", 70)
        wait_for(lambda: node_label(cp, SWAP, MEMORY_MARK.key) == "true", 30,
                 what="the memory mark", on_timeout=agents[SWAP].component.tail)
        marked = (f'swapwise_node_agent_pressure_marked{{node="{SWAP}", resource="memory"}}'
                  " == 1")
        wait_for(lambda: prom.query(marked) or None, 30, what="Prometheus sees the mark")
        memory_marked_at = time.time()
        host.stall("memory", 0)
        wait_for(lambda: node_label(cp, SWAP, MEMORY_MARK.key) is None, 30,
                 what="the memory mark cleared", on_timeout=agents[SWAP].component.tail)
        host.stall("cpu", 90)
        wait_for(lambda: node_label(cp, SWAP, CPU_MARK.key) == "true", 30,
                 what="the CPU mark", on_timeout=agents[SWAP].component.tail)
        host.stall("memory", 30)
        yield Monitored(cp, prom, lambda: post(f"{sw.url_base}/mutate/default", b"[]", ctx),
                        agents, hosts, memory_marked_at)


def settled(get: Callable[[], T], ok: Callable[[T], bool], what: str, timeout: float = 60) -> T:
    """``get()`` once ``ok`` holds of it, polled; the last value when it never does."""
    last: list[T] = []

    def probe() -> tuple[T] | None:
        value = get()
        last[:] = [value]
        return (value,) if ok(value) else None

    return wait_for(probe, timeout, what=what, on_timeout=lambda: f"last: {last}")[0]


def shown(prom: Prometheus, title: str, at: float | None = None) -> dict[str, float]:
    """A panel as Grafana draws it at one instant: legend (labels filled in) -> value."""
    [panel] = [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["title"] == title]
    found: dict[str, float] = {}
    for target in panel["targets"]:
        expr = target["expr"].replace("$__rate_interval", "5m")
        params = {"query": expr} if at is None else {"query": expr, "time": str(at)}
        for r in prom.api("query", **params)["result"]:
            labels: dict[str, str] = r["metric"]
            legend = re.sub(r"\{\{(\w+)\}\}", partial(_label, labels), target["legendFormat"])
            found[legend] = float(r["value"][1])
    return found


def unagented_swap_nodes(monitored: Monitored) -> set[str]:
    """The cluster's nodes labelled swapwise.io/swap-node=true where no agent of this test
    runs: the orphan, and whatever swap nodes other tests of the session made."""
    items = monitored.cp.get_json("nodes", "-l", f"{SWAP_NODE_LABEL}=true")["items"]
    return {n["metadata"]["name"] for n in items} - set(monitored.agents)


def alert_nodes(prom: Prometheus, alert: str, at: float | None = None) -> set[str]:
    """The nodes an alert's expression names now (its `for` aside)."""
    [rule] = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
              if r["alert"] == alert]
    params = {"query": rule["expr"]} if at is None else {"query": rule["expr"], "time": str(at)}
    return {r["metric"]["node"] for r in prom.api("query", **params)["result"]}


def test_targets_are_discovered_up_and_the_alert_rules_load(monitored: Monitored) -> None:
    def up() -> list[dict[str, Any]] | None:
        targets = monitored.prom.api("targets")["activeTargets"]
        return targets if len(targets) == 5 and all(
            t["health"] == "up" for t in targets) else None

    targets = wait_for(up, 60, what="five targets up")
    jobs = sorted(t["labels"]["job"] for t in targets)
    assert jobs == ["kube-state-metrics", "swapwise", *["swapwise-node-agent"] * 3]
    # each agent found by its pod, named by the pod's node
    agents = {t["labels"]["node"]: t["labels"]["instance"] for t in targets
              if t["labels"]["job"] == "swapwise-node-agent"}
    assert agents == {node: f"127.0.0.1:{agent.port}"
                      for node, agent in monitored.agents.items()}
    groups = monitored.prom.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == len([line for line in RULES.read_text().splitlines()
                              if line.strip().startswith("- alert:")]) == 14
    assert all(r["type"] == "alerting" and r["health"] == "ok" for r in rules), rules


def test_every_swapwise_dashboard_query_returns_data(monitored: Monitored) -> None:
    ours = [(title, expr) for title, expr in queries() if OURS.search(expr)]
    assert len(ours) >= 36
    empty = monitored.prom.without_data(ours, 90)
    assert not empty, f"dashboard queries without data: {empty}"
    # The numbers are the traffic sent: 3 of each outcome.
    outcomes = {r["metric"]["outcome"]: float(r["value"][1]) for r in monitored.prom.query(
        "sum by (outcome) (swapwise_admission_requests_total)")}
    assert outcomes == {"mutated": 3, "unchanged": 3, "unknown_profile": 3, "invalid": 3,
                        "too_large": 3}
    [changed] = monitored.prom.query("sum(swapwise_containers_changed_total)")
    assert float(changed["value"][1]) == 3
    # And the admission-error alert's expression sees bad bodies sent while it watches
    # (a counter's first sample gives rate() nothing: what came before is not an increase).
    assert monitored.bad_request() == 400
    expr = ('sum without (profile) (rate(swapwise_admission_requests_total'
            '{outcome=~"error|invalid|too_large"}[5m])) > 0')
    errors = wait_for(lambda: monitored.prom.query(expr) or None, 30, what="error rate above 0")
    assert {r["metric"]["outcome"] for r in errors} == {"invalid"}


def test_the_node_agent_panels_show_the_nodes_figures(monitored: Monitored) -> None:
    prom = monitored.prom
    assert shown(prom, "Swap nodes") == {"swap nodes": 1, "with backing swap": 1, "unknown": 1}
    assert shown(prom, "Node agents") == {"agents": 3, "woken by PSI triggers": 0}
    # what the nodes carry: the agent's swap node, disk and zram on it; the orphan, labelled
    # by hand, has no kind, nor have the session's other fake swap nodes (tests/e2e/conftest.py)
    others = len(unagented_swap_nodes(monitored)) - 1
    assert settled(lambda: shown(prom, "Swap nodes by swap kind"), bool,
                   "swap nodes by kind") == {"mixed": 1, "": 1 + others}
    assert shown(prom, "Swap by kind") == {
        "disk, all nodes": DISK, "zram, all nodes": ZRAM,
        "disk, swap nodes": DISK, "zram, swap nodes": ZRAM}
    assert shown(prom, "Backing swap per mille of memory (swap nodes)") == {
        "min": PERMILLE, "median": PERMILLE, "max": PERMILLE}
    assert node_label(monitored.cp, SWAP, "swapwise.io/swap-permille") == str(PERMILLE)
    # the memory mark came and went, the CPU mark came and stays
    marks = settled(lambda: shown(prom, "Nodes marked under pressure"),
                    lambda s: s.get("cpu marked (1h)", 0) >= 1, "the CPU mark's increase")
    assert marks["memory marked"] == 0 and marks["cpu marked"] == 1, marks
    assert marks["memory marked (1h)"] >= 1 and marks["memory cleared (1h)"] >= 1, marks
    assert marks["cpu cleared (1h)"] == 0, marks
    at_mark = shown(prom, "Nodes marked under pressure", monitored.memory_marked_at)
    assert at_mark["memory marked"] == 1 and at_mark["cpu marked"] == 0, at_mark


def test_the_stall_panels_show_the_stall_set_on_the_node(monitored: Monitored) -> None:
    """The agent's own figure over its mark window, the pods' avg10 and the thresholds; the
    other nodes are calm."""
    def near(title: str, percent: float) -> dict[str, float]:
        return settled(lambda: shown(monitored.prom, title),
                       lambda s: abs(s.get(SWAP, -100) - percent) <= 5,
                       f"{title} at {percent} % on {SWAP}")

    memory = near("Memory stall by node (PSI some, top 10)", 30)
    cpu = near("CPU stall by node (PSI some, top 10)", 90)
    for panel, percent, defaults in ((memory, 30, MEMORY_DEFAULTS), (cpu, 90, CPU_DEFAULTS)):
        assert panel[f"{SWAP} pods"] == percent
        assert panel["mark threshold"] == defaults.mark_above
        assert panel["clear threshold"] == defaults.clear_below
        assert panel[PLAIN] == panel[BLIND] == panel[f"{PLAIN} pods"] == 0, panel


def test_the_writes_and_errors_are_the_failing_agents(monitored: Monitored) -> None:
    prom = monitored.prom

    def by_node(expr: str) -> dict[str, float]:
        return {r["metric"]["node"]: float(r["value"][1]) for r in prom.query(expr)}

    # the swap node's agent wrote its node; the plain node's could not (403), nor watch it
    patches = by_node('sum by (node) (swapwise_node_agent_patches_total{result="ok"})')
    assert patches[SWAP] >= 3 and patches[PLAIN] == 0, patches  # labels, marks, clear
    assert by_node('sum by (node) (swapwise_node_agent_patches_total{result="error"}) > 0') \
        .keys() == {PLAIN}
    assert by_node("swapwise_node_agent_watch_restarts_total > 0").keys() == {PLAIN}
    assert by_node("swapwise_node_agent_kubelet_config_errors_total > 0").keys() == {BLIND}
    assert by_node("swapwise_node_agent_kernel_read_errors_total > 0").keys() == {BLIND}
    assert by_node("swapwise_node_agent_swap_node") == {SWAP: 1, PLAIN: 0, BLIND: -1}
    errors = settled(lambda: shown(prom, "Node agent errors"), lambda s: min(
        s.get(k, 0) for k in ("node patch error", "watch restarts", "kernel read errors")) > 0,
        "the error rates above 0")
    assert errors["node patch conflict"] == 0, errors
    writes = shown(prom, "Node writes by result")
    assert writes.keys() == {"ok", "conflict", "error", "Node changes seen"}, writes
    assert writes["Node changes seen"] > 0, writes


@pytest.mark.parametrize(("alert", "nodes"), [
    ("SwapwiseNodeCpuPressure", {SWAP}),
    ("SwapwiseNodeMemoryPressure", set()),
    ("SwapwiseNodeAgentPatchErrors", {PLAIN}),
    ("SwapwiseNodeAgentWatchFailing", {PLAIN}),
    ("SwapwiseNodeAgentKernelReadErrors", {BLIND}),
    ("SwapwiseNodeAgentSwapUnknown", {BLIND}),
    ("SwapwiseSwapNodeWithoutAgent", {ORPHAN}),
])
def test_each_node_alert_names_the_node_it_is_for(
        monitored: Monitored, alert: str, nodes: set[str]) -> None:
    """Each alert's expression on the real series (its `for` aside: minutes)."""
    if alert == "SwapwiseSwapNodeWithoutAgent":  # and the session's other fake swap nodes
        nodes = unagented_swap_nodes(monitored)
    settled(lambda: alert_nodes(monitored.prom, alert), lambda n: n == nodes,
            f"{alert} naming {sorted(nodes)}")
    if alert == "SwapwiseNodeMemoryPressure":  # while the mark was on, it named the node
        assert alert_nodes(monitored.prom, alert, monitored.memory_marked_at) == {SWAP}


def test_reshaped_pods_on_nodes_without_the_agents_swap_label(monitored: Monitored) -> None:
    """The label the agent wrote, as kube-state-metrics exports it with the documented
    allowlist: the pod on the plain node is flagged, the one on the swap node is not."""
    [rule] = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
              if r["alert"] == "SwapwiseReshapedPodOnNodeWithoutSwap"]

    def flagged() -> set[tuple[str, str, str]]:
        return {(r["metric"]["namespace"], r["metric"]["pod"], r["metric"]["node"])
                for r in monitored.prom.query(rule["expr"])}

    def ours(found: set[tuple[str, str, str]]) -> set[tuple[str, str]]:
        """This test's pods (other tests of the session leave reshaped pods of their own on
        their fake nodes, which the alert rightly flags too)."""
        return {(pod, node) for namespace, pod, node in found if namespace == NAMESPACE}

    found = settled(flagged, lambda f: ours(f) == {("reshaped-on-plain", PLAIN)},
                    "the reshaped pod off swap")
    assert shown(monitored.prom, "Reshaped pods on nodes without swap") == {"pods": len(found)}

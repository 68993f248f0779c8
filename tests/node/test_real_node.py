"""The promise, on a real kubelet: reshaped pods get swap, ~3x the pods run without OOM, and
the node agent keeps the node's labels and pressure marks true from the node's own kernel.

One node (2 GiB RAM, 4 GiB swap, LimitedSwap), one control plane, swapwise installed by the
chart with its node agent running in-cluster on the node (tests/node/conftest.py). The
scenarios run in this file's order on that node; each removes its pods before the next.
Every figure goes to build/node-e2e/results.json (BENCHMARKS.md, "Density on a real node",
explains them). The statistical, minutes-long scenarios (hot ``tune``, the unbacked control,
the wake-up matrix, gVisor) are benchmarks: ``make node-bench`` (tests/node/bench/).
"""

from __future__ import annotations

import json
import math
import ssl
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.e2e.cluster import SWAP_LABEL, ControlPlane
from tests.e2e.install import NAMESPACE, RELEASE, Installation
from tests.node.conftest import AGENT_MARKS, MARKS_WITH_CPU, THRASHERS, Agent
from tests.node.kubelet_prometheus import (
    PER_CONTAINER_PANEL,
    kubelet_prometheus,
    kubelet_queries,
    swap_figures,
)
from tests.node.node import PressureLog, PressureSample, RealNode, stall_share
from tests.node.scenarios import (
    DENSITY_SANDBOX,
    HOLD_SECONDS,
    LIMIT_BYTES,
    PAGE,
    SWAP_NODE_ANNOTATION,
    Run,
    audit,
    container_id,
    create_namespace,
    delete_namespace,
    evicted_through_the_api,
    free_memory,
    kubelet_rejections,
    kubelet_swap_metrics,
    node_shape,
    oom_killed,
    permille_label,
    pods,
    recommended_swap_ratio,
    rejected_at_kubelet_restart,
    required_need,
    restarted,
    running,
    sandbox_pod,
    small_pod,
    states,
    swap_used,
    tuned,
    unschedulable_message,
)
from tests.node.wakeup import most_in_swap_first, wait_idle_in_swap, wake_round
from webhook.agent.stall import MEMORY_DEFAULTS, Thresholds
from webhook.base.quantity import parse_bytes
from webhook.engine.backing import PERMILLE_LABEL, container_need, node_permille
from webhook.engine.nodes import FACTS_ANNOTATION, KIND_LABEL, NodeFacts
from webhook.engine.pressure import CPU_MARK, MEMORY_MARK, Mark

pytestmark = pytest.mark.node

# How late the agent may act after the kernel's own figures say it should: one patch
# through the API server (seconds on this emulated node) after its decision. A marked node
# is read every second, so a clear is decided within a second; an unmarked node is read every
# 10 s and woken by the kernel's trigger, which estimates the window's stall itself and may
# let a share just over the threshold pass: a mark may wait for the next read, so it has the
# mark window on top (what the node-agent issue asks: "within the trigger window + 5 s").
AGENT_SLACK_S = 5.0
MARK_BOUND_S = MEMORY_DEFAULTS.mark_window + AGENT_SLACK_S
WAKE_PORTS = 21000  # the density pods' GET /wake ports on the node: 21000 + i


def wake_ports(run: Run) -> list[int]:
    """The /wake ports of a run's placed pods."""
    return [run.wake_port(p) for p in run.placed_pods()]


def labels(node: RealNode) -> dict[str, str]:
    found: dict[str, str] = node.node()["metadata"].get("labels", {})
    return found


def annotations(node: RealNode) -> dict[str, str]:
    found: dict[str, str] = node.node()["metadata"].get("annotations", {})
    return found


# --------------------------------------------------------------------------- the agent


def agent_usage(node: RealNode, agent: Agent) -> tuple[int, float]:
    """The agent container's RSS (bytes) and CPU used so far (core-seconds), as the
    kubelet's Summary has them."""
    pod = agent.pod()
    assert pod is not None
    summary = json.loads(node.kubelet_get("/stats/summary"))
    for entry in summary.get("pods", []):
        if entry["podRef"]["name"] == pod["metadata"]["name"]:
            container = entry["containers"][0]
            return (int(container["memory"]["rssBytes"]),
                    container["cpu"]["usageCoreNanoSeconds"] / 1e9)
    raise AssertionError(f"no Summary entry for {pod['metadata']['name']}")


def test_agent_labels_the_limitedswap_node(
    node: RealNode, agent: Agent, results: dict[str, Any]
) -> None:
    """The agent, in-cluster from the image, learns the kubelet's swapBehavior from its own
    /configz (nodes/configz, no proxy) and the swap from /proc/swaps; it labels the node and
    writes the per-mille of its disk swap; idle, it is small."""
    results["kubelet_version"] = node.node()["status"]["nodeInfo"]["kubeletVersion"]
    configz = json.loads(node.kubelet_get("/configz"))["kubeletconfig"]
    assert configz["memorySwap"]["swapBehavior"] == "LimitedSwap"
    shape = node_shape(node)
    expected = node_permille(shape["swap"], shape["memory"])  # the swap disk is the only swap
    node.wait_for(lambda: labels(node).get(SWAP_LABEL) == "true"
                  and permille_label(node) == expected, 180,
                  what=f"the agent to label {node.name} with {PERMILLE_LABEL}={expected}",
                  detail=lambda: json.dumps(labels(node)))
    note = annotations(node)[SWAP_NODE_ANNOTATION]
    assert note.startswith("true: kubelet swapBehavior LimitedSwap"), note
    facts = NodeFacts.of(node.node())
    assert facts is not None and facts.behavior_source == "kubelet", facts
    assert facts.disk_bytes == shape["swap"] and facts.zram_bytes == 0, facts
    assert labels(node).get(KIND_LABEL) == "disk"
    results["labeller.limitedswap_labelled"] = True
    results["agent.permille"] = expected
    results["agent.facts"] = json.loads(annotations(node)[FACTS_ANNOTATION])
    # Idle cost: RSS, and CPU over a minute with nothing happening.
    rss, cpu_before = agent_usage(node, agent)
    since = time.monotonic()
    node.wait_for(lambda: time.monotonic() - since >= 60, 120, interval=10,
                  what="a minute of the idle agent")
    rss_after, cpu_after = agent_usage(node, agent)
    idle = (cpu_after - cpu_before) / (time.monotonic() - since) * 1000
    results["agent.rss_bytes"] = max(rss, rss_after)
    results["agent.idle_cpu_millicores"] = round(idle, 2)
    started = agent.records("node agent started")
    results["agent.psi_mode"] = started[-1][1].get("psi") if started else None


def token_for(cp: ControlPlane, agent: Agent) -> str:
    """A token of the agent's ServiceAccount bound to its pod, as the kubelet projects it
    (so the API server puts the pod's node in it)."""
    pod = agent.pod()
    assert pod is not None
    proc = cp.kubectl("create", "token", pod["spec"]["serviceAccountName"], "-n", NAMESPACE,
                      "--bound-object-kind", "Pod", "--bound-object-name",
                      pod["metadata"]["name"], "--bound-object-uid", pod["metadata"]["uid"])
    return proc.stdout.strip()


def patch_node(cp: ControlPlane, token: str, name: str, body: dict[str, Any]) -> tuple[int, str]:
    context = ssl.create_default_context(cafile=str(cp.pki / "ca.crt"))
    request = urllib.request.Request(
        f"{cp.server}/api/v1/nodes/{name}", method="PATCH", data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}",
                 "Content-Type": "application/merge-patch+json"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()


def test_agent_may_write_only_its_own_node_and_keys(
    node: RealNode, agent: Agent, results: dict[str, Any]
) -> None:
    """With the agent's own node-bound token: another Node, or a key that is not
    swapwise's, is refused by the chart's admission policy; its own keys pass."""
    cp = node.cp
    token = token_for(cp, agent)
    other = "not-this-node"
    cp.create_node(other, memory="4Gi", cpu="2")
    try:
        own = {"metadata": {"annotations": {"swapwise.io/privilege-check": "ok"}}}
        other_node = patch_node(cp, token, other, own)
        foreign = patch_node(cp, token, node.name,
                             {"metadata": {"labels": {"example.com/not-swapwise": "x"}}})
        allowed = patch_node(cp, token, node.name, own)
        patch_node(cp, token, node.name,
                   {"metadata": {"annotations": {"swapwise.io/privilege-check": None}}})
    finally:
        cp.kubectl("delete", "node", other, "--wait=false", check=False)
    results["agent.denied_other_node"] = other_node[0] == 403
    results["agent.denied_foreign_key"] = foreign[0] == 403
    results["agent.allowed_own_key"] = allowed[0] == 200
    assert other_node[0] == 403, other_node
    assert foreign[0] == 403, foreign
    assert allowed[0] == 200, allowed
    assert "labels" not in node.node()["metadata"] or \
        "example.com/not-swapwise" not in labels(node)


# --------------------------------------------------------------------------- swap


def test_reshaped_pod_gets_the_kubelets_swap_share(
    node: RealNode, swapwise: Installation, agent: Agent, results: dict[str, Any]
) -> None:
    """memory.swap.max of a reshaped container is exactly the kubelet's formula, and the
    same pod in a namespace that did not opt in gets none."""
    cp = node.cp
    shape = node_shape(node)
    results["node_memory_bytes"] = shape["memory"]
    results["node_swap_bytes"] = shape["swap"]
    assert shape["swap"] > 0
    create_namespace(cp, "granted", "sandbox")
    create_namespace(cp, "not-opted-in", None)
    try:
        for ns in ("granted", "not-opted-in"):
            cp.apply(json.dumps(sandbox_pod("one", ns, cold_mib=8)))

        def both_running() -> list[dict[str, Any]] | None:
            got = [cp.get_json("pod", "one", "-n", ns) for ns in ("granted", "not-opted-in")]
            return got if all(running(p) for p in got) else None

        reshaped, plain = node.wait_for(both_running, 600, what="both pods Running")
        request = parse_bytes(reshaped["spec"]["containers"][0]["resources"]["requests"][
            "memory"])
        assert request < LIMIT_BYTES
        assert reshaped["status"]["qosClass"] == "Burstable"
        assert plain["status"]["qosClass"] == "Guaranteed"
        # The kubelet's LimitedSwap share, with the node's machine capacity (not
        # allocatable), which the kernel stores rounded down to a whole page.
        expected = int(request / shape["memory"] * shape["swap"]) // PAGE * PAGE
        seen: dict[str, Any] = {}

        def cgroups() -> tuple[dict[str, Any], dict[str, Any]] | None:
            status = node.fresh_status()
            a = node.container_cgroup(status, reshaped["metadata"]["uid"],
                                      container_id(reshaped))
            b = node.container_cgroup(status, plain["metadata"]["uid"], container_id(plain))
            seen["granted"], seen["refused"] = a, b
            if a and b and a["memory.swap.max"].isdigit() and b["memory.swap.max"].isdigit():
                return a, b
            return None

        try:
            granted, refused = node.wait_for(cgroups, 180, what="both containers' swap limits")
        except TimeoutError as exc:
            raise AssertionError(f"swap limits never set: {seen}") from exc
        results["swap_max_reshaped_bytes"] = int(granted["memory.swap.max"])
        results["swap_max_expected_bytes"] = expected
        results["swap_max_not_opted_in_bytes"] = int(refused["memory.swap.max"])
        assert int(granted["memory.swap.max"]) == expected
        assert int(refused["memory.swap.max"]) == 0
    finally:  # the next scenarios need the node empty
        for ns in ("granted", "not-opted-in"):
            delete_namespace(cp, node, ns)


def test_density_triples_without_oom_kills(
    node: RealNode, swapwise: Installation, agent: Agent, pressure_log: PressureLog,
    density_plan: dict[str, Any], results: dict[str, Any],
) -> None:
    """The same sandboxes, without and with swapwise (swapRatio 2): three times the pods,
    every one running for two minutes, no OOM kill, every container backed."""
    free = free_memory(node)
    target = density_plan["sandbox"]["containers"][0]["after"]["request"]
    expected_without = free // LIMIT_BYTES
    expected_with = free // target
    count = expected_with + 2  # two more than fit: the scheduler's limit shows
    assert count * 50 <= node_shape(node)["cpu_milli"], "CPU would bind before memory"
    results["plan.predicted_fit.with"] = density_plan["sandbox"]["swapRatio"]["fits"]
    results["plan.per_node.with"] = density_plan["sandbox"]["after"]["perNode"]
    results["plan.per_node.without"] = density_plan["sandbox"]["before"]["perNode"]

    without_from = time.monotonic()
    with Run(node, "density-without", None, count, DENSITY_SANDBOX,
             listen_from=WAKE_PORTS) as without:
        results["density.without.placed"] = without.placed
        assert without.placed == expected_without
        try:
            without.wait_all_working(900)
        finally:
            results["density.without.max_some_avg10"] = pressure_log.max_some(without_from)
            results["density.without.started_s"] = round(time.monotonic() - without_from, 1)
            results["density.without.timeline"] = without.timeline()
        results["density.hot_ops_per_s.without"] = without.median_hot_ops()
        results["density.without.oom_kills"] = without.counts()["oom_kills"]
        # The 1x baseline of the wake-up round: the same sandboxes, not reshaped, in RAM.
        baseline = wake_round(node, wake_ports(without), pressure_log, alone=2,
                              everyone=False)

    # A Prometheus configured as docs/monitoring.md says scrapes the kubelet meanwhile.
    start_from = time.monotonic()
    with (Run(node, "density-with", "sandbox", count, DENSITY_SANDBOX,
              listen_from=WAKE_PORTS) as with_,
          kubelet_prometheus(node.cp, node.workdir / "prometheus") as prom):
        results["density.with.placed"] = with_.placed
        assert with_.placed == expected_with
        assert with_.placed >= math.ceil(2.9 * without.placed)
        with_.wait_all_working(1800)
        working_from = time.monotonic()
        results["density.with.started_s"] = round(working_from - start_from, 1)
        results["density.with.timeline"] = with_.timeline()
        # Backed: each pod needs what its affinity says, the node's label covers it, and the
        # kubelet's swap limit in the cgroup holds everything above each request.
        pod = with_.placed_pods()[0]
        resources = pod["spec"]["containers"][0]["resources"]
        need = container_need(parse_bytes(resources["requests"]["memory"]),
                              parse_bytes(resources["limits"]["memory"]))
        assert {required_need(p) for p in with_.placed_pods()} == {need}
        margins = with_.backing_margins()
        results["backing.node_permille"] = permille_label(node)
        results["backing.need_permille"] = need
        results["backing.placed"] = with_.placed
        results["backing.min_swap_max_minus_excess_bytes"] = min(margins.values())
        worst = with_.observe(HOLD_SECONDS)
        results["backing.oom_kills"] = worst["oom_kills"]
        # The start-up is a burst (every pod allocating at once, its cold pages going to
        # swap): the agent may mark the node for it, which keeps new reshaped pods off while
        # it lasts. Once every pod works, their hot sets fit their requests: the node is calm
        # and carries no mark by the end of the hold.
        results["pressure.startup.marked"] = pressure_log.marked_between(start_from,
                                                                         working_from)
        results["pressure.startup.max_some_avg10"] = pressure_log.max_some(start_from,
                                                                           working_from)
        calm = pressure_log.since(working_from)
        results["pressure.calm.max_some_avg10"] = pressure_log.max_some(working_from)
        results["pressure.calm.samples"] = len(calm)
        results["pressure.calm.marked_at_end"] = any(
            mark.key in labels(node) for mark in (MEMORY_MARK, CPU_MARK))
        results["density.with.running_at_end"] = with_.counts()["running"]
        results["density.with.oom_kills"] = worst["oom_kills"]
        results["density.with.evictions"] = worst["evictions"]
        results["density.with.swap_used_bytes"] = swap_used(node)
        results["density.with.containers_swap_current_bytes"] = with_.swap_current()
        results["density.hot_ops_per_s.with"] = with_.median_hot_ops()
        metrics = kubelet_swap_metrics(node, with_.namespace)
        for key, value in metrics.items():
            results[f"density.with.kubelet.{key}"] = value
        panels = dict(kubelet_queries())
        per_container = panels.pop(PER_CONTAINER_PANEL)
        panels_without_data = prom.without_data(list(panels.items()), 300)
        per_container_series = prom.query(per_container)
        scraped = swap_figures(prom, node.name, with_.namespace)
        for key, value in scraped.items():
            results[f"density.with.prometheus.{key}"] = value
        # tune, on the calm pods (hot sets within the requests) since they all worked.
        calm_tune = tuned(node, prom, working_from, "sandbox", 600, "calm")
        results["tune.calm.recommendation"] = calm_tune["action"]
        results["tune.calm.swap_ratio"] = recommended_swap_ratio(calm_tune)
        results["tune.calm.evidence"] = calm_tune["evidence"]
        # Wake-up: once every sandbox has cold pages in swap (its cgroup says so), wake two
        # one at a time and a quarter of the others at once (tests/node/wakeup.py; the whole
        # matrix is make node-bench's).
        placed = with_.placed_pods()
        uids = [p["metadata"]["uid"] for p in placed]
        out = wait_idle_in_swap(node, uids, 120)
        ports = most_in_swap_first(uids, [with_.wake_port(p) for p in placed], out)
        woken = wake_round(node, ports, pressure_log, alone=2, everyone=False)
        woken["pods_with_pages_in_swap"] = sum(v > 0 for v in out.values())
        woken["swapped_out_bytes"] = sum(out.values())
        woken["baseline_p99_ms"] = baseline["p99_ms"]
        woken["baseline"] = baseline
        for key, value in woken.items():
            results[f"wakeup.{key}"] = value
    assert worst["running"] == with_.placed, worst
    assert worst["oom_kills"] == 0, worst
    assert woken["answered"] == woken["asked"] == 2 + max(1, with_.placed // 4), woken
    assert baseline["answered"] == baseline["asked"], baseline
    assert results["backing.node_permille"] >= need, results
    assert results["pressure.calm.samples"] > 0, results
    assert results["pressure.calm.marked_at_end"] is False, pressure_log.describe(start_from)
    assert len(margins) == with_.placed and min(margins.values()) >= 0, margins
    assert worst["evictions"] == 0, worst
    assert worst["restarts"] == 0, worst
    assert results["density.with.swap_used_bytes"] > 0
    assert results["density.with.containers_swap_current_bytes"] > 0
    assert metrics["node_swap_usage_bytes"] > 0
    assert metrics["containers_reported"] == with_.placed
    assert results["plan.predicted_fit.with"] is True
    assert calm_tune["action"] in ("keep", "raise"), calm_tune
    assert calm_tune["evidence"]["pods"] == with_.placed, calm_tune
    # The dashboard's panels over the kubelet's swap metrics show this node and these pods:
    # the node's and each pod's swap in use. The per-container figures come from the runtime's
    # CRI stats, which containerd 1.6 reports as 0: their use-of-limit panel is empty for
    # that reason alone (a runtime that reports them makes this fail: then require it too).
    assert scraped["target_health"] == "up" and scraped["target_node"] == node.name, scraped
    assert scraped["node_swap_usage_bytes"] and scraped["node_swap_usage_bytes"][0] > 0, scraped
    assert scraped["pod_swap_usage_bytes_sum"] and scraped["pod_swap_usage_bytes_sum"][0] > 0
    assert scraped["pods_reported"] == scraped["containers_reported"] == with_.placed, scraped
    assert scraped["container_swap_limit_bytes_max"] == [0.0], scraped
    assert scraped["container_swap_usage_bytes_max"] == [0.0], scraped
    assert not panels_without_data, panels_without_data
    assert per_container_series == [], per_container_series
    assert scraped["rules_health"] == ["ok"], scraped


def test_unbacked_pods_are_refused_the_node(
    node: RealNode, swapwise: Installation, agent: Agent,
    density_plan: dict[str, Any], results: dict[str, Any],
) -> None:
    """Swap backing: requestRatio 0.1 with backing on (the default). The node's swap share
    cannot hold what each pod keeps above its request, so the scheduler places none of
    them, and plan said so; nothing runs, so nothing is OOM-killed."""
    predicted = density_plan["aggressive"]["backing"]
    results["backing.refused.plan_backed"] = predicted["backed"]
    assert predicted["applies"] and predicted["backed"] is False, predicted
    count = free_memory(node) // density_plan["sandbox"]["containers"][0]["after"]["request"]
    with Run(node, "backing-refused", "aggressive", count) as run:
        results["backing.refused.placed"] = run.placed
        refused = [unschedulable_message(p) for p in pods(run.cp, run.namespace)]
        results["backing.refused.pending"] = sum(m is not None for m in refused)
        results["backing.refused.oom_kills"] = run.counts()["oom_kills"]
    assert run.placed == 0 and run.refused == count, (run.placed, run.refused)
    assert all(m and "node affinity" in m for m in refused), refused
    assert results["backing.refused.oom_kills"] == 0


# --------------------------------------------------------------------------- pressure


def kernel_crossing(samples: list[PressureSample], counter: str, window: float,
                    above: bool, threshold: float, not_before: float = 0.0
                    ) -> PressureSample | None:
    """The first sample, from guest epoch ``not_before`` on, at which the kernel's own
    counter says what the agent must act on: the stall share over the trailing ``window``
    at or above ``threshold`` (``above``), or under it."""
    for i, sample in enumerate(samples):
        if sample.epoch is None or sample.epoch < not_before:
            continue
        share = stall_share(samples, i, window, counter)
        if share is not None and (share >= threshold if above else share < threshold):
            return sample
    return None


def thresholds(mark: Mark) -> Thresholds:
    """The agent's thresholds for ``mark`` in this suite (tests/node/conftest.py)."""
    marks = AGENT_MARKS[mark.resource]
    return Thresholds(marks["markAbove"], marks["clearBelow"], MEMORY_DEFAULTS.mark_window,
                      MEMORY_DEFAULTS.clear_window)


class Pressure:
    """One pressure scenario: what the kernel said and when the agent acted, both on the
    guest's clock (psi.log and the agent's log)."""

    def __init__(self, node: RealNode, agent: Agent, log: PressureLog, mark: Mark,
                 counter: str) -> None:
        self.node, self.agent, self.log = node, agent, log
        self.mark, self.counter = mark, counter
        self.thresholds = thresholds(mark)
        self.start = time.monotonic()
        self.marked_epoch: float | None = None

    def marked(self) -> bool:
        return self.mark.key in labels(self.node)

    def wait_unmarked(self, timeout: float) -> None:
        """A scenario starts on an unmarked node (an earlier one may have left pressure),
        judged by an agent that has sampled a whole mark window (it may just have been
        rolled out, and the rollout itself loads the node's CPU)."""
        self.node.wait_for(lambda: self.agent.running_for() >= self.thresholds.mark_window + 5,
                           300, interval=2, what="the agent to have sampled a mark window")
        self.wait_cleared(timeout)
        self.start = time.monotonic()

    def wait_marked(self, timeout: float) -> None:
        self.node.wait_for(self.marked, timeout, interval=2,
                           what=f"the agent to mark {self.mark.key}",
                           detail=lambda: self.log.describe(self.start))

    def wait_cleared(self, timeout: float) -> None:
        self.node.wait_for(lambda: not self.marked(), timeout, interval=2,
                           what=f"the agent to clear {self.mark.key}",
                           detail=lambda: self.log.describe(self.start))

    def patches(self, lines: list[tuple[float, dict[str, Any]]]) -> dict[str, list[float]]:
        """When (guest epoch) the agent's patches of this mark went through, by change
        ("marked", "cleared"), oldest first, from its log ``lines``."""
        found: dict[str, list[float]] = {"marked": [], "cleared": []}
        for at, record in lines:
            change = record.get(self.mark.resource)
            if record["msg"] == "node patched" and change in found:
                found[change].append(at)
        return found

    def read_past(self, epoch: float) -> list[PressureSample]:
        """psi.log's samples of this scenario, once the log has been read past ``epoch``
        (guest clock): it is read every few seconds, so the newest may not be in yet."""
        def samples() -> list[PressureSample]:
            return [s for s in self.log.since(self.start - 2 * self.thresholds.clear_window)
                    if s.epoch is not None]
        self.node.wait_for(lambda: any((s.epoch or 0.0) >= epoch for s in samples()), 120,
                           interval=2, what="psi.log to be read past the agent's patch")
        return samples()

    def latency(self, change: str, results: dict[str, Any], key: str) -> float:
        """Seconds from the kernel's own figures meeting the agent's condition to the
        agent's patch (the kernel side computed from psi.log's counters, independently of
        the agent's code); recorded with the window and the evidence (one read of the
        agent's log, one of psi.log)."""
        t = self.thresholds
        decision = f"{self.mark.resource} pressure {change}"
        lines = self.agent.records("node patched", "node agent started", "node patch failed",
                                   decision)
        patches = self.patches(lines)
        assert patches[change], f"no 'node patched' line with {self.mark.resource}={change}"
        at = patches[change][-1]
        samples = self.read_past(at)
        if change == "marked":
            # The agent's own clock: from when it had a whole window of its own samples
            # (it may have been rolled out just before) and the mark was last off.
            started = [e for e, r in lines if r["msg"] == "node agent started"][-1]
            cleared = [e for e in patches["cleared"] if e <= at]
            since = max([started + t.mark_window, *cleared])
            crossing = kernel_crossing(samples, self.counter, t.mark_window, True,
                                       t.mark_above, since)
            window = t.mark_window
            self.marked_epoch = at
        else:
            assert self.marked_epoch is not None
            # The agent keeps a mark at least a clear window, then clears on the kernel's
            # share over that window.
            crossing = kernel_crossing(samples, self.counter, t.clear_window, False,
                                       t.clear_below, self.marked_epoch + t.clear_window)
            window = t.clear_window
        assert crossing is not None and crossing.epoch is not None, self.log.describe(
            self.start)
        took = round(at - crossing.epoch, 1)
        results[f"{key}_after_kernel_s"] = took
        results[f"{key}_window_s"] = window
        results[f"{key}_evidence"] = self.evidence(lines, decision, samples, window,
                                                   crossing.epoch, at)
        return took

    def evidence(self, lines: list[tuple[float, dict[str, Any]]], decision: str,
                 samples: list[PressureSample], window: float, crossing: float,
                 patched: float) -> dict[str, Any]:
        """What a late mark or clear is read from: when the agent decided (its ``decision``
        lines: on what share, by its trigger or its sample) against when its patch went
        through, the patch failures between, and the kernel's share over ``window`` from the
        crossing on."""
        decided = [(at, r) for at, r in lines
                   if r["msg"] == decision and crossing - 60 <= at <= patched]
        failed = [round(at - crossing, 1) for at, r in lines
                  if r["msg"] == "node patch failed" and crossing <= at <= patched]
        shares = [f"{(s.epoch or 0.0) - crossing:.0f}s:{share:.0f}"
                  for i, s in enumerate(samples)
                  if s.epoch is not None and crossing - 5 <= s.epoch <= patched + 1
                  and (share := stall_share(samples, i, window, self.counter)) is not None]
        return {
            "decided_after_kernel_s": [round(at - crossing, 1) for at, _ in decided],
            "decided_on": [{"share": r.get("share_percent"), "trigger": r.get("trigger")}
                           for _, r in decided],
            "patch_failures_after_kernel_s": failed,
            "kernel_share_percent": " ".join(shares[:90]),
        }


def test_memory_thrash_is_marked_and_cleared(
    node: RealNode, swapwise: Installation, agent: Agent, pressure_log: PressureLog,
    results: dict[str, Any],
) -> None:
    """Pods thrash (each one's hot set above its memory limit, the rest in swap, touched
    without pause): the kernel's memory PSI rises and the agent marks the node within its
    mark window + 5 s of the kernel's share over that window meeting the threshold; a new
    reshaped pod stays Pending while a pod of a namespace that did not opt in is placed;
    nothing is evicted. The pods deleted, the mark goes within 5 s of the kernel's share
    over the clear window falling below its threshold, and the pending pod is placed."""
    cp = node.cp
    thrash, late, plain = "pressure-thrash", "pressure-late", "pressure-plain"
    create_namespace(cp, thrash, None)
    create_namespace(cp, late, "sandbox")
    create_namespace(cp, plain, None)
    # Burstable with swap: limit 64Mi, request 32Mi, swap share 64 MiB (swap = 2 x RAM), so
    # 96 MiB always has a third in swap and every pass pages it back in; never OOM-killed.
    # THRASHERS of them (conftest.py: AGENT_MARKS says why).
    thrashers = []
    for i in range(THRASHERS):
        pod = sandbox_pod(f"thrash-{i}", thrash, cold_mib=0, hot_mib=96, tick="1ms",
                          cpu_limit=False)
        pod["spec"]["containers"][0]["resources"] = {
            "requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}
        thrashers.append(pod)
    scenario = Pressure(node, agent, pressure_log, MEMORY_MARK, "memory_total")
    try:
        scenario.wait_unmarked(600)
        cp.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": thrashers}))
        scenario.wait_marked(600)
        results["pressure.thrash.marked_after_kernel_s"] = scenario.latency(
            "marked", results, "agent.memory.mark")
        note = annotations(node)[MEMORY_MARK.key]
        assert note.startswith("marked: memory some"), note
        results["pressure.thrash.annotation"] = note
        cp.apply(json.dumps(sandbox_pod("late", late, cold_mib=8, hot_mib=8)))
        cp.apply(json.dumps(small_pod("plain", plain)))
        message = node.wait_for(
            lambda: unschedulable_message(cp.get_json("pod", "late", "-n", late)), 180,
            what="the new reshaped pod to be refused the marked node")
        results["pressure.thrash.new_pod_pending"] = "node affinity" in message
        placed = node.wait_for(
            lambda: cp.get_json("pod", "plain", "-n", plain)["spec"].get("nodeName"), 180,
            what="the plain pod to be placed on the marked node")
        results["pressure.thrash.other_pod_scheduled"] = placed == node.name
        results["pressure.thrash.max_some_avg10"] = pressure_log.max_some(scenario.start)
        results["pressure.thrash.evicted_by_swapwise"] = sum(
            evicted_through_the_api(p) for ns in (thrash, plain) for p in pods(cp, ns))
        cp.kubectl("delete", "pods", "--all", "-n", thrash, "--grace-period=1", "--wait=false")
        scenario.wait_cleared(600)
        results["pressure.recovery.cleared_after_kernel_s"] = scenario.latency(
            "cleared", results, "agent.memory.clear")
        late_node = node.wait_for(
            lambda: cp.get_json("pod", "late", "-n", late)["spec"].get("nodeName"), 300,
            what="the pending reshaped pod to be placed once the mark is gone")
        results["pressure.recovery.pending_pod_scheduled"] = late_node == node.name
        results["pressure.thrash.samples"] = pressure_log.describe(scenario.start)
    finally:
        for namespace in (thrash, late, plain):
            delete_namespace(cp, node, namespace)
    results["agent.mark_after_kernel_s"] = results["agent.memory.mark_after_kernel_s"]
    results["agent.clear_after_kernel_s"] = results["agent.memory.clear_after_kernel_s"]
    assert results["agent.memory.mark_after_kernel_s"] <= MARK_BOUND_S, \
        results["agent.memory.mark_evidence"]
    assert results["agent.memory.clear_after_kernel_s"] <= AGENT_SLACK_S, \
        results["agent.memory.clear_evidence"]
    assert results["pressure.thrash.new_pod_pending"], message
    assert results["pressure.thrash.other_pod_scheduled"], placed
    assert results["pressure.thrash.evicted_by_swapwise"] == 0
    assert results["pressure.recovery.pending_pod_scheduled"]


def with_cpu(swapwise: Installation, agent: Agent, node: RealNode,
             marks: dict[str, Any]) -> None:
    """The chart upgraded with these pressure marks, and the agent rolled out with them."""
    swapwise.upgrade(nodeAgent={"pressureMarks": marks})
    node.cp.kubectl("rollout", "status", f"daemonset/{RELEASE}-node-agent", "-n", NAMESPACE,
                    "--timeout=600s", timeout=630)
    node.wait_for(agent.ready, 600, what="the rolled node agent ready")


def spin_pod(name: str, namespace: str, threads: int) -> dict[str, Any]:
    """CPU hogs: ``threads`` busy loops, a little memory, no CPU limit."""
    pod = small_pod(name, namespace)
    container = pod["spec"]["containers"][0]
    container["image"] = "localhost/swapwise/workload:v1"
    container["args"] = ["spin", "-threads", str(threads)]
    container["resources"] = {"requests": {"cpu": "10m", "memory": "16Mi"},
                              "limits": {"memory": "16Mi"}}
    return pod


def test_cpu_contention_is_marked_and_keeps_new_reshaped_pods_off(
    node: RealNode, swapwise: Installation, agent: Agent, pressure_log: PressureLog,
    results: dict[str, Any],
) -> None:
    """CPU hogs on the swap node, memory calm: the agent marks swapwise.io/cpu-pressure; a
    new reshaped pod stays Pending while a pod that is not reshaped is placed."""
    cp = node.cp
    hogs, late, plain = "cpu-hogs", "cpu-late", "cpu-plain"
    for namespace, profile in ((hogs, None), (late, "sandbox"), (plain, None)):
        create_namespace(cp, namespace, profile)
    # The CPU mark on (the suite keeps it off elsewhere: conftest.py), the agent rolled.
    with_cpu(swapwise, agent, node, MARKS_WITH_CPU)
    scenario = Pressure(node, agent, pressure_log, CPU_MARK, "cpu_total")
    try:
        scenario.wait_unmarked(600)
        # Nine busy threads on two CPUs: some task always waits (~92 % "some" here).
        cp.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
            spin_pod(f"spin-{i}", hogs, 3) for i in range(3)]}))
        scenario.wait_marked(600)
        results["agent.cpu.marked"] = True
        scenario.latency("marked", results, "agent.cpu.mark")
        results["agent.cpu.memory_marked"] = MEMORY_MARK.key in labels(node)
        cp.apply(json.dumps(sandbox_pod("late", late, cold_mib=8, hot_mib=8)))
        cp.apply(json.dumps(small_pod("plain", plain)))
        message = node.wait_for(
            lambda: unschedulable_message(cp.get_json("pod", "late", "-n", late)), 180,
            what="the new reshaped pod to be refused the CPU-marked node")
        results["cpu.new_pod_pending"] = "node affinity" in message
        placed = node.wait_for(
            lambda: cp.get_json("pod", "plain", "-n", plain)["spec"].get("nodeName"), 180,
            what="the plain pod to be placed on the CPU-marked node")
        results["cpu.other_pod_scheduled"] = placed == node.name
        cp.kubectl("delete", "pods", "--all", "-n", hogs, "--grace-period=1", "--wait=false")
        scenario.wait_cleared(600)
        scenario.latency("cleared", results, "agent.cpu.clear")
        late_node = node.wait_for(
            lambda: cp.get_json("pod", "late", "-n", late)["spec"].get("nodeName"), 300,
            what="the pending reshaped pod to be placed once the CPU mark is gone")
        results["cpu.pending_pod_scheduled"] = late_node == node.name
    finally:
        for namespace in (hogs, late, plain):
            delete_namespace(cp, node, namespace)
        with_cpu(swapwise, agent, node, AGENT_MARKS)
    for key in ("new_pod_pending", "other_pod_scheduled"):
        results[f"agent.cpu.{key}"] = results[f"cpu.{key}"]
    assert results["cpu.new_pod_pending"], message
    assert results["cpu.other_pod_scheduled"], placed
    assert results["cpu.pending_pod_scheduled"]
    assert results["agent.cpu.mark_after_kernel_s"] <= MARK_BOUND_S, \
        results["agent.cpu.mark_evidence"]


# --------------------------------------------------------------------------- swap changes


def test_zram_only_backs_no_pod(
    node: RealNode, swapwise: Installation, agent: Agent, results: dict[str, Any]
) -> None:
    """The guest's swap moved to a zram device of the same size: zram's pages live in RAM,
    so the agent counts none of it as backing (its default): the node stays a swap node of
    kind zram with per-mille 0, and a reshaped pod that needs backing stays Pending. The
    disk back, the per-mille comes back."""
    cp = node.cp
    before = permille_label(node)
    namespace = "zram-backing"
    create_namespace(cp, namespace, "sandbox")
    try:
        zram_bytes = node.move_swap_to_zram(2048)
        node.wait_for(lambda: labels(node).get(KIND_LABEL) == "zram"
                      and permille_label(node) == 0, 120,
                      what="the agent to see zram as the only swap",
                      detail=lambda: json.dumps(labels(node)))
        results["zram.permille"] = permille_label(node)
        results["zram.swap_bytes"] = zram_bytes
        results["zram.swap_node"] = labels(node).get(SWAP_LABEL) == "true"
        facts = NodeFacts.of(node.node())
        assert facts is not None and facts.zram_bytes > 0 and facts.backing_bytes == 0, facts
        cp.apply(json.dumps(sandbox_pod("needs-backing", namespace, cold_mib=8)))
        message = node.wait_for(
            lambda: unschedulable_message(cp.get_json("pod", "needs-backing", "-n",
                                                      namespace)), 180,
            what="the reshaped pod to be refused the zram-only node")
        results["zram.reshaped_pod_pending"] = "node affinity" in message
    finally:
        node.move_swap_to_disk()
        delete_namespace(cp, node, namespace)
    node.wait_for(lambda: labels(node).get(KIND_LABEL) == "disk"
                  and permille_label(node) == before, 120,
                  what="the agent to see the swap disk again")
    assert results["zram.permille"] == 0
    assert results["zram.swap_node"] is True
    assert results["zram.reshaped_pod_pending"], message


def test_a_node_whose_swap_shrinks_backs_no_new_pod(
    node: RealNode, swapwise: Installation, agent: Agent, results: dict[str, Any],
) -> None:
    """The node changes under running pods: its swap moves from the 4 GiB disk to a 1 GiB
    file and the kubelet restarts. The agent lowers the per-mille within a minute; a new
    pod of the same profile stays Pending; the pods already there keep running, and
    ``swapwise audit`` names them as no longer backed; or, where the kubelet re-admitted
    them after the label changed, the kubelet refused them (NodeAffinity): never an OOM kill
    or a restart."""
    cp = node.cp
    namespace = "backing-shrunk"
    create_namespace(cp, namespace, "sandbox")
    try:
        for i in range(2):
            cp.apply(json.dumps(sandbox_pod(f"before-{i}", namespace, cold_mib=8)))
        node.wait_for(lambda: all(running(p) for p in pods(cp, namespace))
                      and len(pods(cp, namespace)) == 2, 600, what="two pods Running")
        before = permille_label(node)
        assert before is not None
        moved_bytes = node.move_swap_to_file(1024)
        moved = time.monotonic()
        expected = node_permille(moved_bytes, node_shape(node)["memory"])
        node.wait_for(lambda: permille_label(node) == expected, 300,
                      what=f"{PERMILLE_LABEL} to follow the smaller swap ({expected})")
        results["backing.shrunk.label_updated_after_s"] = round(time.monotonic() - moved, 1)
        results["backing.shrunk.node_permille"] = expected
        assert expected < before
        node.restart_kubelet("LimitedSwap")
        node.wait_for(lambda: node_shape(node)["swap"] < 1100 * 1024**2, 300,
                      what="the kubelet to report the smaller swap")
        cp.apply(json.dumps(sandbox_pod("after", namespace, cold_mib=8)))
        message = node.wait_for(
            lambda: unschedulable_message(cp.get_json("pod", "after", "-n", namespace)), 180,
            what="the new pod to be refused the node")
        results["backing.shrunk.new_pod_pending"] = "node affinity" in message
        assert "node affinity" in message, message

        # The pods already there: running as before, unless the restarted kubelet re-admitted
        # them after the agent had lowered the per-mille: then the kubelet refused them (its
        # NodeAffinity Event; docs/nodes.md). A refused pod passes through states that are
        # neither (a CI run read one Running with no container status), so the pods are read
        # before and after the audit, each must have settled and the two reads must agree.
        def before_pods() -> list[dict[str, Any]]:
            return [p for p in pods(cp, namespace) if p["metadata"]["name"].startswith("before")]

        def settled(pod: dict[str, Any], rejections: set[str]) -> bool:
            if pod["status"].get("phase") in ("Failed", "Succeeded"):
                return True
            return running(pod) and pod["metadata"].get("uid") not in rejections

        def consistent() -> tuple[list[dict[str, Any]], dict[str, Any], set[str]] | None:
            old = before_pods()
            report = audit(cp)
            again = before_pods()
            rejections = kubelet_rejections(cp, namespace)
            same = [rejected_at_kubelet_restart(p, rejections) for p in old] == \
                [rejected_at_kubelet_restart(p, rejections) for p in again]
            if same and len(again) == len(old) and all(settled(p, rejections) for p in again):
                return again, report, rejections
            return None

        old, report, rejections = node.wait_for(
            consistent, 300, interval=5,
            what="the pods to settle (running, or refused and finished) across an audit",
            detail=lambda: states(before_pods()))
        rejected = [p for p in old if rejected_at_kubelet_restart(p, rejections)]
        kept = [p for p in old if not rejected_at_kubelet_restart(p, rejections)]
        results["backing.shrunk.kept_running"] = len(kept)
        results["backing.shrunk.rejected_at_kubelet_restart"] = len(rejected)
        results["backing.shrunk.rejected_phases"] = sorted(
            p["status"].get("phase", "") for p in rejected)
        assert len(old) == 2 and all(running(p) for p in kept), states(old)
        assert not any(oom_killed(p) or restarted(p) for p in rejected), states(old)
        assert not any(restarted(p) for p in kept), states(old)
        findings = [f for f in report["findings"] if f["check"] == "reshaped-pod-not-backed"]
        results["backing.shrunk.audit_not_backed"] = len(findings)
        assert sorted(f["object"] for f in findings) == sorted(
            f"Pod/{p['metadata']['name']}" for p in kept), findings
        assert all(f["details"]["nodePermille"] == expected for f in findings), findings
    finally:
        delete_namespace(cp, node, namespace)
    assert results["backing.shrunk.label_updated_after_s"] <= 60, results


def test_agent_removes_the_labels_from_a_noswap_kubelet(
    node: RealNode, agent: Agent, results: dict[str, Any]
) -> None:
    """The same node, still with swap, kubelet back on NoSwap: the agent reads it from the
    kubelet's /configz and takes both labels off, with the reason on the node."""
    node.restart_kubelet("NoSwap")
    assert node.node()["status"]["nodeInfo"]["swap"]["capacity"] > 0

    def unlabelled() -> str | None:
        note = annotations(node).get(SWAP_NODE_ANNOTATION, "")
        found = labels(node)
        if SWAP_LABEL not in found and PERMILLE_LABEL not in found and note.startswith(
                "false:"):
            return str(note)
        return None

    reason = node.wait_for(unlabelled, 300, what="the agent to unlabel the NoSwap node")
    assert "NoSwap" in reason
    results["labeller.noswap_labelled"] = SWAP_LABEL in labels(node)
    results["labeller.noswap_reason"] = reason

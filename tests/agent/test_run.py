"""webhook/agent/run.py: the watcher never spins against a hostile API server (issue 46), and
the agent marks and clears its node from the kernel's figures, writing only on change.

- The watcher runs in its thread against a loopback API server, in real time, with short
  backoff settings; a test counts the requests the server saw (an upper bound: a loaded
  machine only makes fewer) and reads the delays from the watcher's own log lines.
- The agent's main loop is stepped on a synthetic clock (``Agent.step(now)``) over a host of
  kernel files whose PSI counters the test sets exactly, against the same loopback API
  server: marks and clears land on exact seconds.
- ``swapwise node-agent`` runs as a process and gets a real SIGTERM.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.hostfiles import HostFiles as Host
from tests.agent.support import (
    GIB,
    FakeApiServer,
    Handler,
    PatchRule,
    Request,
    Tls,
    free_port,
    node,
    serving,
    wait_until,
)
from webhook.agent.agent_metrics import AgentMetrics
from webhook.agent.kernel import HostPaths
from webhook.agent.nodeapi import NodeApi
from webhook.agent.run import Agent, AgentOptions, NodeWatcher, backoff
from webhook.engine.backing import PERMILLE_LABEL
from webhook.engine.nodes import BEHAVIOR_LABEL, KIND_LABEL, SWAP_NODE_LABEL
from webhook.engine.pressure import CPU_MARK, MEMORY_MARK

WATCHER_LOG = "swapwise.node-agent"


def sample(metrics: AgentMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(f"swapwise_node_agent_{name}", labels)


# -- Backoff


def test_backoff_doubles_with_jitter_up_to_the_longest_and_resets_on_progress() -> None:
    retries = backoff(AgentOptions(node="n", backoff=(0.2, 2.0)))
    delays = [retries.failed("x", "y") for _ in range(8)]
    for delay, nominal in zip(delays, [0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0, 2.0], strict=True):
        assert 0.8 * nominal <= delay <= 1.2 * nominal
    retries.progressed()
    assert 0.16 <= retries.failed("x", "y") <= 0.24


def test_backoff_never_overflows() -> None:
    retries = backoff(AgentOptions(node="n"))
    for _ in range(2000):
        delay = retries.failed("x", "y")
    assert 240 <= delay <= 360


# -- the watcher against hostile servers


def run_watcher(api: NodeApi, seconds: float, **options: Any) -> NodeWatcher:
    """The watcher in its thread for ``seconds`` of real time, then stopped."""
    settings: dict[str, Any] = {"backoff": (0.2, 2.0), "watch_seconds": (60, 60), **options}
    stop = threading.Event()
    watcher = NodeWatcher(api, AgentOptions(node="node-a", **settings), stop, lambda: None,
                          AgentMetrics())
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    stop.wait(seconds)
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the watcher did not stop"
    return watcher


def retry_delays(caplog: pytest.LogCaptureFixture) -> list[float]:
    return [r.__dict__["retry_in_s"] for r in caplog.records
            if r.name == WATCHER_LOG and "retry_in_s" in r.__dict__]


def assert_backed_off(delays: list[float], requests: int) -> None:
    """Few requests, and each retry waited longer than the one before, up to the longest
    (issue 46's bad case: 2,802 requests in 10 s)."""
    assert requests <= 12, f"{requests} requests in 5 s: the watcher spins"
    assert len(delays) >= 3, delays
    for before, after in itertools.pairwise(delays):
        assert after > before or after >= 1.6, delays  # grows, up to 2.0 (+-20 %)


def closes_at_once(h: Handler, request: Request) -> None:
    if request.query.get("watch") == "true":
        h.start_stream()
        h.end_stream()
    else:
        h.send_json(200, node(version="5"))


def test_a_watch_answered_200_and_closed_at_once_backs_off(
        tls: Tls, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, WATCHER_LOG)
    with serving(tls, closes_at_once) as server:
        watcher = run_watcher(NodeApi(server.config()), 5)
        watches = server.requests(watch=True)
        gets = server.requests(watch=False)
    assert len(gets) == 1  # the node was read once; only the watch is retried
    assert watcher.node == node(version="5")
    assert all(r.query["resourceVersion"] == "5" for r in watches)
    assert_backed_off(retry_delays(caplog), len(watches))
    gaps = [b.at - a.at for a, b in itertools.pairwise(watches)]
    assert max(gaps) >= 1.2, gaps  # the server saw the delays too
    assert "node watch ended at once" in caplog.text
    assert sample(watcher.metrics, "watch_restarts_total") == len(retry_delays(caplog))


@pytest.mark.parametrize("how", ["status", "error-event"])
def test_410_gone_loops_back_off_though_each_get_succeeds(
        tls: Tls, caplog: pytest.LogCaptureFixture, how: str) -> None:
    """Too old a resourceVersion: the watcher reads the node afresh (a GET that works) and
    watches again, which fails again. The GET is no progress: the delay keeps growing."""
    gone = {"kind": "Status", "code": 410, "reason": "Expired",
            "message": "too old resource version: 5 (4000)"}

    def app(h: Handler, request: Request) -> None:
        if request.query.get("watch") != "true":
            h.send_json(200, node(version="5"))
        elif how == "status":
            h.send_json(410, gone)
        else:  # what kube-apiserver sends: 200, then an ERROR event
            h.start_stream()
            h.event("ERROR", gone)
            h.end_stream()

    caplog.set_level(logging.WARNING, WATCHER_LOG)
    with serving(tls, app) as server:
        run_watcher(NodeApi(server.config()), 5)
        watches = server.requests(watch=True)
        gets = server.requests(watch=False)
    assert len(gets) == len(watches) or len(gets) == len(watches) + 1  # afresh each time
    assert_backed_off(retry_delays(caplog), len(watches) + len(gets))
    errors = [r.__dict__.get("error", "") for r in caplog.records if r.name == WATCHER_LOG]
    assert errors and all("HTTP 410: too old resource version" in e for e in errors), errors


@pytest.mark.parametrize("stream", [b"garbage\n", b'{"type": "ADDED"}\n'])
def test_a_garbage_watch_backs_off(tls: Tls, caplog: pytest.LogCaptureFixture,
                                   stream: bytes) -> None:
    def app(h: Handler, request: Request) -> None:
        if request.query.get("watch") == "true":
            h.start_stream()
            h.chunk(stream)
            h.end_stream()
        else:
            h.send_json(200, node(version="5"))

    caplog.set_level(logging.WARNING, WATCHER_LOG)
    with serving(tls, app) as server:
        run_watcher(NodeApi(server.config()), 5)
        watches = server.requests(watch=True)
    assert_backed_off(retry_delays(caplog), len(watches))


def test_an_unreadable_node_backs_off(tls: Tls, caplog: pytest.LogCaptureFixture) -> None:
    def app(h: Handler, request: Request) -> None:
        h.send_status(403, 'nodes "node-a" is forbidden', "Forbidden")

    caplog.set_level(logging.WARNING, WATCHER_LOG)
    with serving(tls, app) as server:
        watcher = run_watcher(NodeApi(server.config()), 5)
        requests = server.requests()
    assert watcher.node is None
    assert all(r.query.get("watch") is None for r in requests)  # no watch without a node
    assert_backed_off(retry_delays(caplog), len(requests))


def test_a_watch_that_repeats_one_bookmark_and_closes_does_not_spin(tls: Tls) -> None:
    # 3 s, not 5: spinning, it makes a thousand requests a second
    def app(h: Handler, request: Request) -> None:
        if request.query.get("watch") == "true":
            h.start_stream()
            h.event("BOOKMARK", {"kind": "Node", "metadata": {"resourceVersion": "5"}})
            h.end_stream()
        else:
            h.send_json(200, node(version="5"))

    with serving(tls, app) as server:
        run_watcher(NodeApi(server.config()), 3)
        watches = server.requests(watch=True)
    assert len(watches) <= 12, f"{len(watches)} watch requests in 3 s: the watcher spins"


def test_the_watch_keeps_the_latest_node_and_resumes_where_it_was(tls: Tls) -> None:
    changes: list[int] = []
    with FakeApiServer(tls, node(version="5")) as api_server:
        stop = threading.Event()
        watcher = NodeWatcher(NodeApi(api_server.server.config()),
                              AgentOptions(node="node-a", backoff=(0.2, 2.0),
                                           watch_seconds=(2, 2)),
                              stop, lambda: changes.append(1), AgentMetrics())
        thread = threading.Thread(target=watcher.run, daemon=True)
        thread.start()
        try:
            wait_until(lambda: watcher.node is not None, "the first read")
            api_server.update(lambda obj: obj["metadata"]["labels"].update(a="1"))
            wait_until(lambda: (watcher.node or {}).get("metadata", {}).get(
                "labels", {}).get("a") == "1", "the change, by the watch")
            # the watch ends (timeoutSeconds 2) and is resumed from what it last saw
            wait_until(lambda: len(api_server.server.requests(watch=True)) >= 2,
                       "a second watch")
            api_server.update(lambda obj: obj["metadata"]["labels"].update(a="2"))
            wait_until(lambda: (watcher.node or {}).get("metadata", {}).get(
                "labels", {}).get("a") == "2", "the change, by the resumed watch")
        finally:
            stop.set()
            thread.join(timeout=30)
        watches = api_server.server.requests(watch=True)
        gets = api_server.server.requests(watch=False)
    assert len(gets) == 1
    assert watches[0].query["resourceVersion"] == "5"
    assert watches[1].query["resourceVersion"] == "6"
    assert watches[0].query["timeoutSeconds"] == "2"
    assert len(changes) >= 3


def test_a_deleted_node_is_read_afresh(tls: Tls) -> None:
    served = {"watches": 0}

    def app(h: Handler, request: Request) -> None:
        if request.query.get("watch") == "true":
            served["watches"] += 1
            h.start_stream()
            if served["watches"] == 1:
                h.event("DELETED", node(version="9"))
            h.end_stream()
        else:
            h.send_json(200, node(version=str(10 + len(server.requests(watch=False)))))

    with serving(tls, app) as server:
        run_watcher(NodeApi(server.config()), 3)
        watches = server.requests(watch=True)
    assert watches[0].query["resourceVersion"] == "11"
    assert watches[1].query["resourceVersion"] == "12"  # read again, not resumed from 9


# -- the agent on a synthetic clock


NAME = "node-a"
DECLARED = {BEHAVIOR_LABEL: "LimitedSwap"}
FOREIGN_TAINT = {"key": "dedicated", "value": "db", "effect": "NoSchedule"}
T0 = 1000


@pytest.fixture
def host(tmp_path: Path) -> Host:
    host = Host(tmp_path / "host")
    host.swaps([("/swapfile", 2 * GIB)])
    return host


@contextlib.contextmanager
def agent_on(api_server: FakeApiServer, host: Host, **options: Any) -> Iterator[Agent]:
    settings: dict[str, Any] = {"backoff": (1.0, 300.0), **options}
    paths = HostPaths(host.proc, host.sys, host.cgroup)
    agent = Agent(AgentOptions(node=NAME, **settings),
                  NodeApi(api_server.server.config(), timeout=10), paths)
    agent.watcher.set(agent.api.get(NAME))  # what the watcher's first read does
    try:
        yield agent
    finally:
        os.close(agent.waker.read_fd)
        os.close(agent.waker.write_fd)


def step(agent: Agent, host: Host, at: int, memory: float = 0.0, cpu: float = 0.0) -> None:
    """One second of the node: ``memory`` and ``cpu`` seconds of stall, then a sample."""
    host.add_stall("memory", memory)
    host.add_stall("cpu", cpu)
    agent.step(float(at), set())


def labels(api_server: FakeApiServer) -> dict[str, str]:
    return dict(api_server.current()["metadata"]["labels"])


def annotations(api_server: FakeApiServer) -> dict[str, str]:
    return dict(api_server.current()["metadata"]["annotations"])


def test_the_agent_labels_a_swap_node_once(tls: Tls, host: Host) -> None:
    with FakeApiServer(tls, node(NAME, labels=DECLARED)) as api_server, \
            agent_on(api_server, host) as agent:
        for at in range(T0, T0 + 30):
            step(agent, host, at)
        assert len(api_server.patches) == 1
        assert labels(api_server) == {**DECLARED, SWAP_NODE_LABEL: "true",
                                      PERMILLE_LABEL: "250", KIND_LABEL: "disk"}
        assert agent.synced
        # the swap grows: one more patch, with the new figures
        host.swaps([("/swapfile", 2 * GIB), ("/dev/zram0", 4 * GIB)])
        for at in range(T0 + 30, T0 + 60):
            step(agent, host, at)
        assert len(api_server.patches) == 2
        assert labels(api_server)[KIND_LABEL] == "mixed"
        assert labels(api_server)[PERMILLE_LABEL] == "250"  # zram backs nothing by default
        assert sample(agent.metrics, "patches_total", result="ok") == 2


def test_memory_pressure_marks_at_its_window_and_clears_after_its_clear_window(
        tls: Tls, host: Host) -> None:
    with FakeApiServer(tls, node(NAME, labels=DECLARED)) as api_server, \
            agent_on(api_server, host) as agent:
        step(agent, host, T0)
        assert len(api_server.patches) == 1  # the swap labels
        host.psi("memory", host.totals["memory"], avg10=55.5)  # what kubepods says
        for at in range(T0 + 1, T0 + 10):
            step(agent, host, at, memory=0.7)
            assert MEMORY_MARK.key not in labels(api_server), at
        step(agent, host, T0 + 10, memory=0.7)  # the 10 s window is covered: 70 %
        assert labels(api_server)[MEMORY_MARK.key] == "true"
        assert annotations(api_server)[MEMORY_MARK.key] == (
            "marked: memory some 70.0 % of the last 10 s, kubepods 55.5 % (marks at 60 %; "
            "kernel PSI, swapwise node-agent)")
        assert len(api_server.patches) == 2
        assert api_server.patches[1] == {"metadata": {
            "labels": {MEMORY_MARK.key: "true"},
            "annotations": {MEMORY_MARK.key: annotations(api_server)[MEMORY_MARK.key]}}}
        # calm from now: held for the clear window (60 s), no write meanwhile
        for at in range(T0 + 11, T0 + 70):
            step(agent, host, at)
        assert labels(api_server)[MEMORY_MARK.key] == "true"
        assert len(api_server.patches) == 2
        step(agent, host, T0 + 70)
        assert MEMORY_MARK.key not in labels(api_server)
        assert annotations(api_server)[MEMORY_MARK.key].startswith(
            "cleared: memory some 0.0 % of the last 60 s")
        assert len(api_server.patches) == 3
        assert CPU_MARK.key not in labels(api_server)
        for resource, to, count in (("memory", "marked", 1), ("memory", "cleared", 1),
                                    ("cpu", "marked", 0)):
            assert (sample(agent.metrics, "pressure_transitions_total", resource=resource,
                           to=to) or 0) == count


def test_pressure_between_the_thresholds_writes_nothing(tls: Tls, host: Host) -> None:
    with FakeApiServer(tls, node(NAME, labels=DECLARED)) as api_server, \
            agent_on(api_server, host) as agent:
        for at in range(T0, T0 + 300):
            step(agent, host, at, memory=0.5, cpu=0.7)  # 50 % < 60, 70 % < 80
        assert len(api_server.patches) == 1


def test_cpu_pressure_as_a_taint_keeps_other_taints(tls: Tls, host: Host) -> None:
    start = node(NAME, labels=DECLARED, taints=[FOREIGN_TAINT])
    with FakeApiServer(tls, start) as api_server, \
            agent_on(api_server, host, mark_with="taint") as agent:
        for at in range(T0, T0 + 11):
            step(agent, host, at, cpu=0.9)
        obj = api_server.current()
        assert obj["spec"]["taints"] == [FOREIGN_TAINT, CPU_MARK.taint]
        assert CPU_MARK.key not in obj["metadata"]["labels"]
        assert obj["metadata"]["annotations"][CPU_MARK.key].startswith(
            "marked: cpu some 90.0 % of the last 10 s")
        taint_patches = [p for p in api_server.patches if "spec" in p]
        assert len(taint_patches) == 1
        assert taint_patches[0]["metadata"]["resourceVersion"] == "2"  # as read: checked
        for at in range(T0 + 11, T0 + 71):
            step(agent, host, at)
        assert api_server.current()["spec"]["taints"] == [FOREIGN_TAINT]


def test_a_taint_patch_that_conflicts_is_decided_again_on_a_fresh_read(
        tls: Tls, host: Host) -> None:
    start = node(NAME, labels=DECLARED, taints=[FOREIGN_TAINT])
    admin_taint = {"key": "maintenance", "value": "today", "effect": "NoSchedule"}
    with FakeApiServer(tls, start) as api_server, \
            agent_on(api_server, host, mark_with="taint") as agent:
        for at in range(T0, T0 + 11):
            step(agent, host, at, cpu=0.9)
        assert api_server.current()["spec"]["taints"] == [FOREIGN_TAINT, CPU_MARK.taint]
        # an admin taints the node; the agent's copy is stale (no watch runs here)
        api_server.update(lambda obj: obj["spec"]["taints"].append(admin_taint))
        for at in range(T0 + 11, T0 + 71):
            step(agent, host, at)
        assert sample(agent.metrics, "patches_total", result="conflict") == 1
        for at in (T0 + 71, T0 + 72):  # after the first delay (1 s +-20 %), on the fresh copy
            step(agent, host, at)
        assert api_server.current()["spec"]["taints"] == [FOREIGN_TAINT, admin_taint]


def test_a_resource_left_out_is_never_marked_and_its_mark_goes(tls: Tls, host: Host) -> None:
    """``--no-cpu-marks``: the CPU mark a node carries is removed, and CPU stall, however
    high, marks nothing; memory is marked as before."""
    start = node(NAME, labels={**DECLARED, CPU_MARK.key: "true"})
    with FakeApiServer(tls, start) as api_server, \
            agent_on(api_server, host, resources=("memory",)) as agent:
        for at in range(T0, T0 + 15):
            step(agent, host, at, cpu=1.0)
        assert CPU_MARK.key not in labels(api_server)
        assert annotations(api_server)[CPU_MARK.key] == "cleared: cpu pressure marks off"
        for at in range(T0 + 15, T0 + 30):
            step(agent, host, at, memory=0.9, cpu=1.0)
        assert labels(api_server)[MEMORY_MARK.key] == "true"
        assert CPU_MARK.key not in labels(api_server)


def test_a_restarted_agent_keeps_the_mark_until_it_has_seen_a_clear_window(
        tls: Tls, host: Host) -> None:
    start = node(NAME, labels={**DECLARED, MEMORY_MARK.key: "true"},
                 annotations={MEMORY_MARK.key: "marked: by the agent before it restarted"})
    with FakeApiServer(tls, start) as api_server, agent_on(api_server, host) as agent:
        for at in range(T0, T0 + 60):
            step(agent, host, at)
            assert labels(api_server)[MEMORY_MARK.key] == "true", at
        assert annotations(api_server)[MEMORY_MARK.key] == \
            "marked: by the agent before it restarted"
        step(agent, host, T0 + 60)
        assert MEMORY_MARK.key not in labels(api_server)
        assert annotations(api_server)[MEMORY_MARK.key].startswith("cleared:")


def test_an_unreadable_psi_file_leaves_its_mark_alone(tls: Tls, host: Host) -> None:
    start = node(NAME, labels={**DECLARED, CPU_MARK.key: "true"})
    (host.proc / "pressure" / "cpu").unlink()
    with FakeApiServer(tls, start) as api_server, agent_on(api_server, host) as agent:
        for at in range(T0, T0 + 120):
            host.add_stall("memory", 0)
            agent.step(float(at), set())
        assert labels(api_server)[CPU_MARK.key] == "true"
        assert CPU_MARK.key not in annotations(api_server)
        assert sample(agent.metrics, "kernel_read_errors_total") == 120
        assert len(api_server.patches) == 1


def test_pressure_marks_off_removes_them(tls: Tls, host: Host) -> None:
    start = node(NAME, labels={**DECLARED, MEMORY_MARK.key: "true"},
                 taints=[CPU_MARK.taint, FOREIGN_TAINT])
    with FakeApiServer(tls, start) as api_server, \
            agent_on(api_server, host, pressure=False) as agent:
        for at in range(T0, T0 + 20):
            step(agent, host, at, memory=1.0, cpu=1.0)
        obj = api_server.current()
        assert MEMORY_MARK.key not in obj["metadata"]["labels"]
        assert obj["spec"]["taints"] == [FOREIGN_TAINT]
        assert obj["metadata"]["annotations"][MEMORY_MARK.key] == "cleared: pressure marks off"
        assert len(api_server.patches) == 1
        agent.clear_marks()  # nothing left to clear
        assert len(api_server.patches) == 1


def test_failed_patches_back_off_and_reset_after_one_works(tls: Tls, host: Host) -> None:
    with FakeApiServer(tls, node(NAME, labels=DECLARED)) as api_server, \
            agent_on(api_server, host) as agent:
        api_server.patch_rule = PatchRule(500, "etcd is sad")
        for at in range(T0, T0 + 200):
            step(agent, host, at)
        tried = api_server.server.requests("PATCH")
        # delays 1, 2, 4, 8, 16, 32, 64 s (+-20 %): 8 tries in 200 s, not 200
        assert 6 <= len(tried) <= 9, [r.at for r in tried]
        assert sample(agent.metrics, "patches_total", result="error") == len(tried)
        api_server.patch_rule = PatchRule()
        for at in range(T0 + 200, T0 + 400):
            step(agent, host, at)
        assert labels(api_server)[SWAP_NODE_LABEL] == "true"
        assert agent.patch_backoff.failures == 0


def test_patches_that_always_conflict_back_off(tls: Tls, host: Host) -> None:
    with FakeApiServer(tls, node(NAME, labels=DECLARED)) as api_server, \
            agent_on(api_server, host) as agent:
        api_server.patch_rule = PatchRule(409, "the object has been modified")
        for at in range(T0, T0 + 120):
            step(agent, host, at)
        tried = api_server.server.requests("PATCH")
    assert len(tried) <= 12, f"{len(tried)} patches in 120 s of conflicts"


def test_clear_marks_takes_the_marks_off_and_leaves_the_swap_labels(tls: Tls,
                                                                      host: Host) -> None:
    with FakeApiServer(tls, node(NAME, labels=DECLARED, taints=[FOREIGN_TAINT])) as api_server, \
            agent_on(api_server, host, mark_with="taint") as agent:
        for at in range(T0, T0 + 11):
            step(agent, host, at, memory=0.9, cpu=0.9)
        obj = api_server.current()
        assert obj["spec"]["taints"] == [FOREIGN_TAINT, MEMORY_MARK.taint, CPU_MARK.taint]
        agent.clear_marks()
        obj = api_server.current()
    assert obj["spec"]["taints"] == [FOREIGN_TAINT]
    for mark in (MEMORY_MARK, CPU_MARK):
        assert obj["metadata"]["annotations"][mark.key] == "cleared: swapwise node-agent stopped"
    assert obj["metadata"]["labels"][SWAP_NODE_LABEL] == "true"


def test_clear_marks_survives_a_conflict(tls: Tls, host: Host) -> None:
    admin_taint = {"key": "maintenance", "value": "today", "effect": "NoSchedule"}
    with FakeApiServer(tls, node(NAME, labels=DECLARED)) as api_server, \
            agent_on(api_server, host, mark_with="taint") as agent:
        for at in range(T0, T0 + 11):
            step(agent, host, at, memory=0.9)
        assert api_server.current()["spec"]["taints"] == [MEMORY_MARK.taint]
        api_server.update(lambda obj: obj["spec"]["taints"].append(admin_taint))
        agent.clear_marks()
        taints = api_server.current()["spec"]["taints"]
    assert taints == [admin_taint]


# -- the process: SIGTERM


def kubeconfig_for(server_url: str, tls: Tls, path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {
            "server": server_url,
            "certificate-authority-data": base64.b64encode(tls.ca.read_bytes()).decode()}}],
        "users": [{"name": "u", "user": {"token": "agent"}}],
    }))
    return path


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=3) as answer:
            return int(answer.status)
    except OSError:
        return 0


def swapwise() -> list[str]:
    script = Path(sys.executable).parent / "swapwise"
    return [str(script)] if script.exists() else [sys.executable, "-m", "webhook.cli"]


def test_sigterm_clears_the_marks_before_the_agent_exits(tls: Tls, host: Host,
                                                        tmp_path: Path) -> None:
    start = node(NAME, labels={**DECLARED, MEMORY_MARK.key: "true"},
                 annotations={MEMORY_MARK.key: "marked: earlier"})
    port = free_port()
    with FakeApiServer(tls, start) as api_server:
        config = kubeconfig_for(api_server.server.url, tls, tmp_path / "kubeconfig")
        log = (tmp_path / "agent.log").open("wb")
        process = subprocess.Popen(
            [*swapwise(), "node-agent", "--node-name", NAME, "--kubeconfig", str(config),
             "--host-proc", str(host.proc), "--host-sys", str(host.sys),
             "--host-cgroup", str(host.cgroup), "--metrics-host", "127.0.0.1",
             "--metrics-port", str(port)], stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: process.poll() is not None or http_status(
                f"http://127.0.0.1:{port}/readyz") == 200, "the agent ready", timeout=60)
            assert process.poll() is None, (tmp_path / "agent.log").read_text()
            assert labels(api_server)[SWAP_NODE_LABEL] == "true"
            assert labels(api_server)[MEMORY_MARK.key] == "true"  # held: calm for < 60 s
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
        obj = api_server.current()
        text = (tmp_path / "agent.log").read_text()
    assert MEMORY_MARK.key not in obj["metadata"]["labels"], text
    assert obj["metadata"]["annotations"][MEMORY_MARK.key] == \
        "cleared: swapwise node-agent stopped"
    assert obj["metadata"]["labels"][SWAP_NODE_LABEL] == "true"  # facts stay
    assert "pressure marks cleared on shutdown" in text
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert any(entry.get("msg") == "node agent started" for entry in lines)


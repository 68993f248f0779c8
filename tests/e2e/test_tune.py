"""``swapwise tune`` against a real Prometheus (3.16, built from Go modules) holding an hour of
kube-state-metrics and cAdvisor series, backfilled with ``promtool tsdb create-blocks-from
openmetrics`` (testkit/tune_history.py says what the pods did). Every query runs in
Prometheus' own engine: the window, the restart, the NaN, the joins on the pod's labels.

The same command against the real node's kubelet and a real kube-state-metrics is
tests/node/test_real_node.py's (``make node-e2e``).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit import tune_history
from tests.e2e.cluster import swapwise_executable
from tests.monitoring.prom import Prometheus, ensure, queries

pytestmark = pytest.mark.e2e

POLICY = {
    "apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
    "profiles": {"calm": {"swapRatio": 2}, "hot": {"requestRatio": 0.25}, "thin": {}},
    "namespaces": {"ci-heavy": {"requestRatio": 0.75}},
}


def backfilled(workdir: Path, history: str) -> Path:
    """A TSDB holding ``history`` (OpenMetrics text), where Prometheus looks for it."""
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / "history.om"
    source.write_text(history)
    subprocess.run([str(ensure("promtool")), "tsdb", "create-blocks-from", "openmetrics",
                    str(source), str(workdir / "data")], check=True, capture_output=True,
                   timeout=120)
    return workdir


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    # The hour ends a minute ago: the query's window (now - 1h) sees all but its first minute.
    workdir = backfilled(tmp_path_factory.mktemp("tune-prometheus"),
                         tune_history.openmetrics(int(time.time()) - 60))
    with Prometheus(workdir, []) as prom:
        yield prom


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tune-policy") / "policy.yaml"
    path.write_text(yaml.safe_dump(POLICY))
    return path


def tune(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([swapwise_executable(), "tune", "--prometheus", url, "--window",
                           "1h", "--step", "1m", *args], capture_output=True, text=True,
                          timeout=120)


def report(url: str, policy_file: Path) -> dict[str, dict[str, Any]]:
    proc = tune(url, "--policy", str(policy_file), "-o", "json")
    assert proc.returncode == 0, proc.stderr
    return {r["profile"]: r for r in json.loads(proc.stdout)["recommendations"]}


def test_each_profile_gets_its_verdict_from_what_its_pods_did(
    prometheus: Prometheus, policy_file: Path,
) -> None:
    found = report(prometheus.url, policy_file)
    assert {name: r["action"] for name, r in found.items()} == {
        "calm": "raise", "hot": "lower", "thin": "insufficient-data"}
    calm, hot = found["calm"], found["hot"]
    # The evidence is what the pods did (tune_history), as Prometheus' engine computed it.
    assert calm["evidence"]["pods"] == 4 and calm["evidence"]["in_overridden_namespaces"] == 1
    assert hot["evidence"]["pods"] == 4 and found["thin"]["evidence"]["pods"] == 1
    assert calm["evidence"]["stall_share_p95"] == pytest.approx(0.005, abs=0.002)
    # hot-0 restarted halfway: its counter began again at 0, its share is still 30 %.
    assert hot["evidence"]["stall_share_p50"] == pytest.approx(0.30, abs=0.02)
    assert hot["evidence"]["stall_share_p95"] == pytest.approx(0.30, abs=0.02)
    shares = [tune_history.above_request_share(p) for p in tune_history.pods()
              if p.profile == "hot"]
    assert hot["evidence"]["above_request_share"] == pytest.approx(
        sum(shares) / len(shares), abs=0.05)
    pods = {p.name: p for p in tune_history.pods()}
    highest = max(p.working_set[1] * tune_history.MI / p.request
                  for p in pods.values() if p.profile == "calm" and p.namespace == "calm-a")
    assert calm["evidence"]["working_set_over_request_max"] == pytest.approx(highest, rel=0.02)
    assert calm["evidence"]["swap_max_bytes"] == 100 * tune_history.MI  # the NaN left out
    assert calm["evidence"]["observed_request_ratio"] == pytest.approx(1 / 3, abs=0.001)
    # The directions: a raise asks less of each pod, a lower more.
    assert calm["recommended"]["requestRatio"] < calm["requestRatio"]
    assert hot["recommended"]["requestRatio"] > hot["requestRatio"]


def test_the_yaml_is_a_policy_change_in_each_profiles_own_knob(
    prometheus: Prometheus, policy_file: Path,
) -> None:
    proc = tune(prometheus.url, "--policy", str(policy_file), "-o", "yaml")
    assert proc.returncode == 0, proc.stderr
    patch = yaml.safe_load(proc.stdout)
    assert set(patch["profiles"]["calm"]) == {"swapRatio"}
    assert set(patch["profiles"]["hot"]) == {"requestRatio"}
    assert "thin" not in patch["profiles"]
    assert "# thin: insufficient-data" in proc.stdout


def test_an_empty_prometheus_names_every_missing_source(tmp_path: Path) -> None:
    with Prometheus(tmp_path, []) as empty:
        proc = tune(empty.url)
    assert proc.returncode == 1
    for metric in ("kube_pod_container_resource_requests", "kube_pod_annotations",
                   "container_memory_working_set_bytes",
                   "container_pressure_memory_waiting_seconds_total"):
        assert f"  {metric}: " in proc.stderr, proc.stderr


def test_kube_state_metrics_without_the_allowlist_is_named(tmp_path: Path) -> None:
    """kube-state-metrics exports ``kube_pod_annotations`` without annotation labels unless
    they are allow-listed: the one thing to fix is said, alone."""
    history = tune_history.openmetrics(int(time.time()) - 60)
    lines = [line.split("{")[0] + "{" + ",".join(
        part for part in line.split("{", 1)[1].split("}")[0].split(",")
        if not part.startswith(tune_history.PROFILE_LABEL)) + "}" + line.split("}", 1)[1]
        if line.startswith("kube_pod_annotations{") else line
        for line in history.splitlines()]
    with Prometheus(backfilled(tmp_path, "\n".join(lines) + "\n"), []) as prom:
        proc = tune(prom.url)
    assert proc.returncode == 1
    assert "kube_pod_annotations: " in proc.stderr and "allowlist" in proc.stderr
    assert "container_memory_working_set_bytes" not in proc.stderr, proc.stderr


def test_the_dashboards_tune_panel_shows_each_profiles_hot_memory(prometheus: Prometheus) -> None:
    """The dashboard's panel reads the same two sources as ``tune``: per profile, the 95th
    percentile of working set over request, and of the share of time spent waiting."""
    targets = [expr for title, expr in queries() if title.endswith("(swapwise tune)")]
    assert len(targets) == 2
    # At the history's last sample, as a dashboard would show it while the pods run.
    [last] = prometheus.query("max(timestamp(kube_pod_annotations))")
    over_request, waiting = (
        {r["metric"]["annotation_swapwise_io_profile"]: float(r["value"][1])
         for r in prometheus.api("query", query=expr, time=last["value"][1])["result"]}
        for expr in targets)
    pods = [p for p in tune_history.pods() if p.profile]
    assert set(over_request) == set(waiting) == {p.profile for p in pods}
    # Each pod's working set moves within its range; the panel's now is one of its samples.
    for profile in ("calm", "hot"):
        ranges = [(p.working_set[0] * tune_history.MI / p.request,
                   p.working_set[1] * tune_history.MI / p.request)
                  for p in pods if p.profile == profile and p.namespace != "ci-heavy"]
        low, high = min(r[0] for r in ranges), max(r[1] for r in ranges)
        assert low - 0.01 <= over_request[profile] <= high + 0.01, (profile, over_request)
    assert over_request["hot"] > 1 > over_request["calm"]
    assert waiting["hot"] == pytest.approx(0.30, abs=0.02)
    assert waiting["calm"] == pytest.approx(0.005, abs=0.002)

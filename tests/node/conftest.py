"""Fixtures of the real-node suite: one control plane, one swap node, swapwise and its node
agent.

Why one of each per session: the guest is emulated, so booting it costs minutes; the
scenarios run in order on the same node (test_real_node.py) and clean up after themselves.

The suite must run inside a network namespace of its own (``make node-e2e`` starts it under
``unshare --net``): etcd, kube-apiserver, swapwise and QEMU then reach nothing outside it.
Run from a plain ``pytest`` it is skipped with that reason, unless SWAPWISE_NODE_E2E=1 (set
by ``make node-e2e``) turns the skip into a failure, so CI can never skip it silently.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.progress import uncaptured
from tests.e2e.cluster import BASE_LINE, ControlPlane, ensure_binaries
from tests.e2e.install import NAMESPACE, Installation
from tests.node.incluster import IMAGE_ARCHIVE, ImageFacts
from tests.node.node import Artifacts, GVisor, PressureLog, RealNode, network_to_guest
from tests.node.scenarios import PROFILES, RESULTS, node_shape, plan
from webhook.engine.pressure import MARKS

REQUIRED = os.environ.get("SWAPWISE_NODE_E2E") == "1"
# The gVisor scenario (bench/test_gvisor.py) is opt-in: building runsc costs about 5 minutes
# cold and one sandbox takes minutes to start under emulation (BENCHMARKS.md).
GVISOR = os.environ.get("SWAPWISE_NODE_GVISOR") == "1"


def _not_possible(reason: str) -> None:
    if REQUIRED:
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def _isolated_network() -> bool:
    """Loopback is the only interface: whatever runs here cannot reach another machine.

    (Comparing /proc/self/ns/net with PID 1's is not possible on machines that hide PID 1.)
    """
    with open("/proc/self/net/dev") as f:  # per network namespace (unlike /sys/class/net)
        names = [line.split(":", 1)[0].strip() for line in f if ":" in line]
    return names == ["lo"]


@pytest.fixture(scope="session")
def private_network() -> None:
    """Only loopback at first; then the tap to the guest and the route to its pods."""
    if not _isolated_network():
        _not_possible("the real-node tests run inside a network namespace of their own: "
                      "run them with `make node-e2e` (unshare --net)")
    network_to_guest()


@pytest.fixture(scope="session")
def artifacts(pytestconfig: pytest.Config, private_network: None) -> Artifacts:
    """Build (or find cached) the kubelet, kernel, root disk and images."""
    with uncaptured(pytestconfig):
        built = Artifacts.build()  # a failed build raises: a failure, never a skip
    if not shutil.which("qemu-system-x86_64"):
        _not_possible("qemu-system-x86_64 is not installed and build-node.sh could not install "
                      "it (apt-get install qemu-system-x86)")
    return built


@pytest.fixture(scope="session")
def control_plane(pytestconfig: pytest.Config, private_network: None) -> Iterator[ControlPlane]:
    with uncaptured(pytestconfig):
        # The real node's kubelet is built from the 1.34 line (build-node.sh): its control
        # plane stays there whatever SWAPWISE_K8S_VERSION selects for tests/e2e.
        binaries = ensure_binaries(BASE_LINE)
    # Every address it listens on is in this namespace: loopback and the guest's tap.
    with ControlPlane(binaries, bind_address="0.0.0.0") as cp:
        yield cp


@pytest.fixture(scope="session")
def node(pytestconfig: pytest.Config, control_plane: ControlPlane, artifacts: Artifacts
         ) -> Iterator[RealNode]:
    """The swap node: 2 GiB of RAM, 4 GiB of swap (swap = 2 x RAM), 2 vCPUs, LimitedSwap;
    its containerd imports the swapwise image of ``make image`` at boot, and installs gVisor
    when SWAPWISE_NODE_GVISOR=1."""
    if not IMAGE_ARCHIVE.is_file():
        pytest.fail(f"{IMAGE_ARCHIVE} is missing: `make node` builds it (hack/build-image.sh "
                    "--local-base), before the tests enter their network namespace",
                    pytrace=False)
    gvisor = None
    if GVISOR:
        with uncaptured(pytestconfig):
            gvisor = GVisor.build()
    with RealNode(control_plane, artifacts, images=(IMAGE_ARCHIVE,), gvisor=gvisor) as real:
        yield real


@pytest.fixture(scope="session")
def swapwise(control_plane: ControlPlane, node: RealNode) -> Iterator[Installation]:
    """swapwise installed by the chart: the webhook in webhook.url mode, serving on loopback,
    and the node agent in-cluster on the node, from the image the node imported at boot."""
    workdir = control_plane.workdir / "swapwise"
    workdir.mkdir()
    repository, tag = ImageFacts.read(IMAGE_ARCHIVE).name.rsplit(":", 1)
    install = Installation(control_plane, workdir, PROFILES, {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "nodeAgent": dict(AGENT_VALUES)})
    install.upgrade()
    install.start_server()
    try:
        yield install
    finally:
        install.stop_server()


# The node agent runs in-cluster from the image, as the chart installs it, for the whole
# session: it reads the guest's kernel and its kubelet's /configz (called directly, with the
# chart's nodes/configz), and writes the node's labels and pressure marks. Two settings are
# the emulated node's, not a user's (measured on it, 2026-12-07): its CPU "some" runs at 50-99 %
# whenever the suite has pods starting (the vCPUs are emulated on the host's two cores), so
# the CPU mark, which would keep reshaped pods off at random, is on only in its own scenario
# (MARKS_WITH_CPU); and the node's memory "some" under a thrash grows with the number of
# thrashing pods (the emulated CPU is slow next to the swap device), and with the machine:
# six of them held 45-50 % on one machine, 26-35 % on another (a cold run), and a CI run
# saw the memory mark come a minute after the share first touched 25 %. Ten hold 60-67 %
# (measured 2026-12-07 beside six: 45-50 %), so the memory mark is set at 25 % (clear below
# 5 %), with a wide margin either way.
THRASHERS = 10
AGENT_MARKS: dict[str, Any] = {
    "memory": {"markAbove": 25, "clearBelow": 5},
    "cpu": {"enabled": False, "markAbove": 80, "clearBelow": 40},
}
MARKS_WITH_CPU: dict[str, Any] = {**AGENT_MARKS, "cpu": {**AGENT_MARKS["cpu"], "enabled": True}}
AGENT_VALUES: dict[str, Any] = {
    "enabled": True,
    "swapBehaviorSource": "kubelet",
    # The guest's kubelet serves a self-signed certificate, as kubeadm's do by default.
    "kubelet": {"insecureTLS": True},
    "pressureMarks": AGENT_MARKS,
    "logLevel": "debug",
}
AGENT_SELECTOR = "app.kubernetes.io/component=node-agent"


class Agent:
    """The node agent's pod on the real node, and what it logged."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.cp = cp
        self.namespace = namespace

    def pod(self) -> dict[str, Any] | None:
        items = self.cp.get_json("pods", "-n", self.namespace, "-l", AGENT_SELECTOR)["items"]
        running = [p for p in items if p["status"].get("phase") == "Running"
                   and not p["metadata"].get("deletionTimestamp")]
        return running[0] if running else None

    def log(self) -> str:
        pod = self.pod()
        if pod is None:
            return ""
        proc = self.cp.kubectl("logs", "-n", self.namespace, pod["metadata"]["name"],
                               check=False, timeout=120)
        return proc.stdout

    def records(self, *msgs: str) -> list[tuple[float, dict[str, Any]]]:
        """The agent's log lines with any of the messages ``msgs``, oldest first, from one
        read of its log: (epoch seconds on the guest's clock, record). The guest's psi.log
        is stamped with the same clock."""
        found = []
        for line in self.log().splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                record = json.loads(line)
                if record["msg"] in msgs:
                    stamp = dt.datetime.fromisoformat(record["ts"].replace("Z", "+00:00"))
                    found.append((stamp.timestamp(), record))
        return found

    def ready(self) -> bool:
        """Its pod Running, every container ready (the first sync done: /readyz)."""
        pod = self.pod()
        return bool(pod) and all(c.get("ready") for c in pod["status"].get(
            "containerStatuses") or [{}])

    def running_for(self) -> float:
        """Seconds its container has been running (0 when it is not)."""
        pod = self.pod()
        statuses = (pod or {}).get("status", {}).get("containerStatuses") or [{}]
        started = statuses[0].get("state", {}).get("running", {}).get("startedAt")
        if not started:
            return 0.0
        stamp = dt.datetime.fromisoformat(started.replace("Z", "+00:00"))
        return time.time() - stamp.timestamp()

    def last(self, msg: str) -> tuple[float, dict[str, Any]] | None:
        found = self.records(msg)
        return found[-1] if found else None


@pytest.fixture(scope="session")
def agent(swapwise: Installation, node: RealNode) -> Agent:
    """The chart's node agent, Running on the node and done with its first sync."""
    running = Agent(swapwise.cp, NAMESPACE)
    node.wait_for(running.ready, 600, what="the node agent's pod Running and ready",
                  detail=lambda: swapwise.cp.kubectl("get", "pods", "-A", "-o", "wide",
                                                     check=False).stdout)
    return running


@pytest.fixture(scope="session")
def pressure_log(node: RealNode, agent: Agent) -> Iterator[PressureLog]:
    """The guest's PSI and the agent's marks, sampled all session long."""
    with PressureLog(node, [mark.key for mark in MARKS]) as log:
        yield log
    keep(node.share / "psi.log")


def keep(path: Path) -> None:
    """A log the run's figures come from, next to results.json (build/ outlives the run)."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        shutil.copyfile(path, RESULTS.parent / path.name)


@pytest.fixture(scope="session")
def density_plan(node: RealNode) -> dict[str, Any]:
    """What ``swapwise plan`` predicts for the sandbox on this node, per profile."""
    shape = node_shape(node)
    return {profile: plan(shape, profile, node.workdir) for profile in PROFILES}


@pytest.fixture(scope="session")
def results() -> Iterator[dict[str, Any]]:
    """The figures of the run; written to build/node-e2e/results.json at the end."""
    data: dict[str, Any] = {}
    yield data
    nested: dict[str, Any] = {}
    for key, value in data.items():  # "density.with.placed" -> {"density": {"with": ...}}
        *parents, leaf = key.split(".")
        level = nested
        for part in parents:
            level = level.setdefault(part, {})
        level[leaf] = value
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(nested, indent=1, sort_keys=True) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    """On a failure, attach the guest's and the cluster's log tails to the report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        real = getattr(item, "funcargs", {}).get("node")
        if isinstance(real, RealNode):
            report.sections.append(("real node logs", real.logs()))
            report.sections.append(("control plane logs", real.cp.logs(20)))
        agent_ = getattr(item, "funcargs", {}).get("agent")
        if isinstance(agent_, Agent):
            report.sections.append(("node agent log", "\n".join(agent_.log().splitlines()[-40:])))

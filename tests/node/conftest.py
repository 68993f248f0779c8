"""Fixtures of the real-node suite: one control plane, one swap node, swapwise, the labeller.

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
import urllib.error
import urllib.request
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import (
    BASE_LINE,
    Component,
    ControlPlane,
    ensure_binaries,
    free_port,
    swapwise_executable,
    wait_for,
)
from tests.e2e.install import Installation
from tests.node.incluster import IMAGE_ARCHIVE
from tests.node.node import Artifacts, GVisor, PressureLog, RealNode, network_to_guest
from tests.support.progress import uncaptured
from webhook.engine.pressure import PRESSURE_LABEL

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "build" / "node-e2e" / "results.json"
REQUIRED = os.environ.get("SWAPWISE_NODE_E2E") == "1"
# The gVisor scenario (test_node_gvisor.py) is opt-in: building runsc costs about 5 minutes cold
# and one sandbox takes minutes to start under emulation (BENCHMARKS.md).
GVISOR = os.environ.get("SWAPWISE_NODE_GVISOR") == "1"

# The profiles of the scenarios: swapRatio 2 matches the node (swap = 2 x RAM); the
# aggressive ones ask for a tenth of the limit, far past what the node's swap can hold:
# with swap backing (the default) the scheduler refuses them the node, without it they
# land and overcommit it (the control).
# Backing is said explicitly: the chart turns it off where the profile does not decide and the
# chart runs no labeller (here label-nodes runs beside it, fixture `labeller`).
BACKED = {"placement": {"swapBacking": "required"}}
PROFILES: dict[str, Any] = {
    "sandbox": {"swapRatio": 2, **BACKED},
    # "tuned" starts as "sandbox" does; the tune scenario replaces its ratio by what `swapwise
    # tune` recommends, as a user would, and runs the same pods again.
    "tuned": {"swapRatio": 2, **BACKED},
    "aggressive": {"requestRatio": 0.1, **BACKED},
    "unbacked": {"requestRatio": 0.1, "placement": {"swapBacking": "off"}},
}


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
def swapwise(control_plane: ControlPlane) -> Iterator[Installation]:
    """swapwise installed by the chart (webhook.url mode), serving on loopback."""
    workdir = control_plane.workdir / "swapwise"
    workdir.mkdir()
    install = Installation(control_plane, workdir, PROFILES)
    install.upgrade()
    install.start_server()
    try:
        yield install
    finally:
        install.stop_server()


# The pressure guard of the scenarios' label-nodes: the default thresholds (mark at 60 %,
# clear below 10 %) and mark window (60 s), a clear window shorter than the default's 120 s
# (so the suite waits less), read every 5 s. The calm density run's start-up has stayed at or
# above 60 % for up to 31 s (a 30 s window marked it nearly); the thrash stays near 100 % for
# minutes (docs/nodes.md).
GUARD = {"interval": 5, "mark_above": 60, "mark_after": 60, "clear_below": 10, "clear_after": 60}
# How far the guard's view may trail the guest kernel's: it reads the kubelet's Summary, whose
# node PSI is cadvisor's (refreshed every 10-15 s), every 5 s, and a read of a thrashing
# node's kubelet has taken tens of seconds; the test looks at the label every 5 s.
GUARD_LAG = 60.0


class Labeller:
    """``swapwise label-nodes`` reading each kubelet's configuration (``kubelet`` source),
    with the pressure guard on (``GUARD``)."""

    def __init__(self, cp: ControlPlane) -> None:
        self.port = free_port()
        argv = [swapwise_executable(), "label-nodes", "--kubeconfig", str(cp.kubeconfig),
                "--swap-behavior-source", "kubelet", "--resync", "10",
                "--lease-namespace", "default", "--metrics-host", "127.0.0.1",
                "--metrics-port", str(self.port), "--pressure-guard",
                # The emulated kubelet under memory pressure answers in tens of seconds
                # (tests/node/kubelet_prometheus.py): a read may take that long.
                "--kubelet-timeout", "60",
                # Every PSI answer logged (its sample, how long it took), so the recovery's
                # latency can be split into the kubelet's lag and the guard's own.
                "--log-level", "debug"]
        for name, value in GUARD.items():
            argv += [f"--pressure-{name.replace('_', '-')}", str(value)]
        self.component = Component("label-nodes", argv, cp.workdir / "label-nodes.log")

    def records(self, msg: str) -> list[tuple[float, dict[str, Any]]]:
        """label-nodes' log lines with message ``msg``: (host monotonic time, record)."""
        offset = time.time() - time.monotonic()
        found = []
        for line in self.component.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                record = json.loads(line)
                if record["msg"] == msg:
                    found.append((dt.datetime.fromisoformat(record["ts"]).timestamp() - offset,
                                  record))
        return found

    def logged(self, msg: str, before: float) -> float | None:
        """When (host monotonic) label-nodes last logged ``msg``, at or before ``before``."""
        return max((at for at, _ in self.records(msg) if at <= before), default=None)

    def answered_since(self, end: float, predicate: Any) -> list[float]:
        """When the guard got each of the kubelet's PSI answers, up to ``end``, in the latest
        unbroken run of answers that meet ``predicate`` (on the answer's some avg10): the
        evidence the guard had, as the kubelet gave it. Empty when the last answer does not
        meet it."""
        answers = [(at, float(r["some_avg10"])) for at, r in self.records("memory PSI read")
                   if at <= end + 1.0]  # the log's clock is read in milliseconds
        run: list[float] = []
        for at, some in reversed(answers):
            if not predicate(some):
                break
            run.insert(0, at)
        return run

    def slowest_answer(self, start: float, end: float) -> float:
        """The longest a PSI answer took, in seconds, between ``start`` and ``end``."""
        return max((float(r["took_s"]) for at, r in self.records("memory PSI read")
                    if start <= at <= end + 1.0), default=0.0)

    def readable_again(self, before: float) -> float | None:
        """When the guard last got a memory PSI read again after failed ones, before
        ``before``: a thrashing kubelet's reads time out, and the guard can act only on an
        answer (webhook/labeller/pressure.py)."""
        return self.logged("memory PSI readable again", before)

    def acted(self, msg: str, seen: float) -> float:
        """When the guard set or cleared the mark a test saw at ``seen``: its log line's
        time. A test sees the label only when it looks, and it may look late (the recovery
        looks after the thrash's namespace is deleted, which took 90 s in a cold run)."""
        at = self.logged(msg, seen + 1.0)  # the log's clock is read in milliseconds
        return min(at, seen) if at is not None else seen

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=3) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read().decode()


@pytest.fixture(scope="session")
def labeller(control_plane: ControlPlane, node: RealNode) -> Iterator[Labeller]:
    proc = Labeller(control_plane)
    proc.component.start()
    try:

        def ready() -> bool:
            proc.component.check_alive()
            return proc.get("/readyz")[0] == 200

        wait_for(ready, 60, what="label-nodes /readyz", on_timeout=proc.component.tail)
        yield proc
    finally:
        proc.component.stop()
        keep(proc.component.log_path)


@pytest.fixture(scope="session")
def pressure_log(node: RealNode, labeller: Labeller) -> Iterator[PressureLog]:
    """The guest's memory PSI and the guard's mark, sampled all session long."""
    with PressureLog(node, PRESSURE_LABEL) as log:
        yield log
    keep(node.share / "psi.log")


def keep(path: Path) -> None:
    """A log the run's figures come from, next to results.json (build/ outlives the run)."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        shutil.copyfile(path, RESULTS.parent / path.name)


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
        labeller_ = getattr(item, "funcargs", {}).get("labeller")
        if isinstance(labeller_, Labeller):
            report.sections.append(("label-nodes log", labeller_.component.tail(40)))

"""``swapwise node-agent`` beside the e2e control plane, on a host of files the test writes.

The agent reads its node's kernel through ``--host-proc``, ``--host-sys`` and
``--host-cgroup``; here those are a directory (:class:`FakeHost`) whose ``/proc/swaps`` and
PSI files the test sets, so every agent decision runs against a real API server, its real
watch and merge patches, with the kernel's figures chosen. The agent runs with the admin
kubeconfig here: the chart's admission policy, which limits its own ServiceAccount, is proven
with a node-bound token (tests/e2e/test_node_agent_privilege.py, tests/node). What the
kernel itself does (PSI crossing, the kubelet's swap) is proven on the real node.
"""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from testkit.hostfiles import HostFiles
from tests.e2e.cluster import Component, ControlPlane, free_port, swapwise_executable, wait_for


class FakeHost(HostFiles):
    """The host's kernel files (testkit/hostfiles.py) with the PSI counters advancing at the
    stall percent :meth:`stall` sets, written every 0.2 s, as a kernel's would."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, kubepods="kubepods")
        self._percent = {"memory": 0.0, "cpu": 0.0}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last = time.monotonic()
        self._thread = threading.Thread(target=self._advance, daemon=True)
        self._thread.start()

    def stall(self, resource: str, percent: float) -> None:
        """From now on, ``percent`` of each second stalled (avg10 shows it too)."""
        with self._lock:
            self._percent[resource] = percent

    def _advance(self) -> None:
        while not self._stop.wait(0.2):
            now = time.monotonic()
            with self._lock:
                for resource, percent in self._percent.items():
                    self.psi(resource, self.totals[resource] + int(
                        (now - self._last) * 1e6 * percent / 100), avg10=percent)
                self._last = now

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class AgentProcess:
    """``swapwise node-agent`` for ``node`` on ``host``, with the control plane's admin
    kubeconfig (or ``kubeconfig``)."""

    def __init__(self, cp: ControlPlane, node: str, host: FakeHost,
                 extra: Sequence[str] = (), kubeconfig: Path | None = None) -> None:
        self.port = free_port()
        argv = [swapwise_executable(), "node-agent", "--node-name", node,
                "--kubeconfig", str(kubeconfig or cp.kubeconfig),
                "--host-proc", str(host.proc), "--host-sys", str(host.sys),
                "--host-cgroup", str(host.cgroup), "--metrics-host", "127.0.0.1",
                "--metrics-port", str(self.port), *extra]
        self.component = Component(f"node-agent-{node}", argv,
                                   cp.workdir / f"node-agent-{node}.log")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=3) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read().decode()
        except OSError as e:
            return 0, str(e)

    def start(self, ready: bool = True) -> None:
        self.component.start()
        if ready:
            def up() -> bool:
                self.component.check_alive()
                return self.get("/readyz")[0] == 200

            wait_for(up, 60, what="node-agent /readyz", on_timeout=self.component.tail)

    def stop(self) -> None:
        self.component.stop()


@contextlib.contextmanager
def running_agent(cp: ControlPlane, node: str, root: Path, extra: Sequence[str] = (),
                  kubeconfig: Path | None = None) -> Iterator[tuple[AgentProcess, FakeHost]]:
    host = FakeHost(root)
    agent = AgentProcess(cp, node, host, extra, kubeconfig)
    try:
        agent.start()
        yield agent, host
    finally:
        agent.stop()
        host.close()

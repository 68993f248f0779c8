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
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.e2e.cluster import Component, ControlPlane, free_port, swapwise_executable, wait_for

KIB = 1024


class FakeHost:
    """A host's kernel files under ``root``: ``proc/swaps``, ``proc/pressure/{memory,cpu}``,
    ``cgroup/kubepods/{memory,cpu}.pressure`` and zswap's parameter; PSI counters advance at
    the stall percent :meth:`stall` sets, written whole (rename) every 0.2 s."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc = root / "proc"
        self.sys = root / "sys"
        self.cgroup = root / "cgroup"
        for d in (self.proc / "pressure", self.sys / "module" / "zswap" / "parameters",
                  self.cgroup / "kubepods"):
            d.mkdir(parents=True, exist_ok=True)
        self._percent = {"memory": 0.0, "cpu": 0.0}
        self._total = {"memory": 0.0, "cpu": 0.0}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last = time.monotonic()
        self.swaps([])
        self.zswap(False)
        self._write_psi()
        self._thread = threading.Thread(target=self._advance, daemon=True)
        self._thread.start()

    @staticmethod
    def _put(path: Path, text: str) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    def swaps(self, devices: Sequence[tuple[str, int]]) -> None:
        """``(path, bytes)`` per device; ``/dev/zramN`` paths are zram."""
        lines = ["Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority"]
        for index, (path, size) in enumerate(devices):
            kind = "partition" if path.startswith("/dev/") else "file"
            lines.append(f"{path}\t{kind}\t{size // KIB}\t0\t{-2 - index}")
        self._put(self.proc / "swaps", "\n".join(lines) + "\n")

    def zswap(self, on: bool) -> None:
        self._put(self.sys / "module" / "zswap" / "parameters" / "enabled",
                  "Y\n" if on else "N\n")

    def stall(self, resource: str, percent: float) -> None:
        with self._lock:
            self._percent[resource] = percent

    def _write_psi(self) -> None:
        for resource in ("memory", "cpu"):
            total = int(self._total[resource])
            avg = self._percent[resource]
            text = (f"some avg10={avg:.2f} avg60={avg:.2f} avg300={avg:.2f} total={total}\n"
                    f"full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
            self._put(self.proc / "pressure" / resource, text)
            self._put(self.cgroup / "kubepods" / f"{resource}.pressure", text)

    def _advance(self) -> None:
        while not self._stop.wait(0.2):
            now = time.monotonic()
            with self._lock:
                for resource, percent in self._percent.items():
                    self._total[resource] += (now - self._last) * 1e6 * percent / 100
                self._last = now
                self._write_psi()

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

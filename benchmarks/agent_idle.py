"""The node agent's own cost on a calm node, natively (no emulated CPU):

    python -m benchmarks.agent_idle [--window 300]

``swapwise node-agent`` runs as a process on this machine against the e2e control plane
(tests/e2e/cluster.py), for one Node of its own, as the chart runs it in every pod but with
a kubeconfig: the swap behaviour declared on the Node, the pressure marks on for memory and
CPU. Its ``/proc`` is a directory holding a ``swaps`` with one 4 GiB partition (this machine
has none, and an agent without swap judges nothing) and the machine's own ``pressure``
files; the kernel's PSI, ``/proc/swaps`` every 10 s and the Node watch are what it works
on. Once its first patch is through, its CPU (utime + stime from ``/proc``) and RSS are read
over ``--window`` seconds, with the patches it made meanwhile (a mark that came and went
under this machine's own load costs its patches: run it on a quiet machine).

Where the kernel lets the agent create PSI triggers (this VM's did, 2026-12-07, as the
emulated real node's does), a calm agent reads PSI every 10 s and the kernel wakes it;
where it may not, it reads PSI once a second and costs more. The output's first column says
which ran.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine, report
from benchmarks.cpu import cpu_seconds
from benchmarks.memory import rss_kib
from tests.e2e.cluster import ControlPlane, bin_dir, ensure_binaries, free_port

NODE = "agent-idle-node"
SWAPS = ("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
         "/dev/vdb                                partition\t4194300\t\t0\t\t-2\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=300.0,
                        help="seconds of calm measured (default 300)")
    args = parser.parse_args()
    print(machine(), flush=True)
    with (ControlPlane(ensure_binaries(), apiserver=bin_dir() / "kube-apiserver") as cp,
          tempfile.TemporaryDirectory(prefix="swapwise-agent-idle-") as scratch):
        cp.create_node(NODE, "2Gi", "2", labels={"swapwise.io/swap-behavior": "LimitedSwap"},
                       swap_capacity=4 << 30)
        proc = Path(scratch) / "proc"
        proc.mkdir()
        (proc / "swaps").write_text(SWAPS)
        (proc / "pressure").symlink_to("/proc/pressure")
        log = Path(scratch) / "agent.log"
        with open(log, "w") as out:
            agent = subprocess.Popen(
                [str(Path(sys.executable).parent / "swapwise"), "node-agent", "--node-name", NODE,
                 "--kubeconfig", str(cp.kubeconfig), "--swap-behavior-source", "declared",
                 "--host-proc", str(proc), "--host-cgroup", scratch,
                 "--metrics-host", "127.0.0.1", "--metrics-port", str(free_port())],
                stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while '"node patched"' not in log.read_text():
                if agent.poll() is not None or time.monotonic() > deadline:
                    print(log.read_text()[-2000:], file=sys.stderr)
                    return 1
                time.sleep(0.5)
            started = next(json.loads(line) for line in log.read_text().splitlines()
                           if '"node agent started"' in line)
            time.sleep(30)  # past its start-up: imports done, the first reads made
            before, at = cpu_seconds(agent.pid), time.monotonic()
            patched_before = log.read_text().count('"node patched"')
            peak = rss_kib(agent.pid)
            while time.monotonic() - at < args.window:
                time.sleep(5)
                peak = max(peak, rss_kib(agent.pid))
            used = cpu_seconds(agent.pid) - before
            elapsed = time.monotonic() - at
            patches = log.read_text().count('"node patched"') - patched_before
        finally:
            agent.terminate()
            agent.wait(30)
    millicores = used / elapsed * 1000
    report("The node agent, calm, natively", [[
        started.get("psi", "?"), f"{elapsed:.0f}", f"{millicores:.2f}",
        f"{peak / 1024:.1f}", str(patches)]],
        ["PSI read", "window s", "CPU mCPU", "peak RSS MiB", "patches in the window"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

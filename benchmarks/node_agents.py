"""The node side at 5,000 nodes: what one agent per node costs kube-apiserver, against the
central pressure guard it replaced, in the same run.

    python -m benchmarks.node_agents [--nodes 5000] [--window 300] [--scale 10]
                                     [--guard-rev 9a72a00] [--skip-guard]

One e2e control plane (tests/e2e/cluster.py) with ``--nodes`` Node objects, then two phases
on it, each measured over ``--window`` seconds of steady state:

1. **Agents.** A child process runs ``--nodes`` of the agent's own Node watchers
   (webhook/agent/run.py ``NodeWatcher`` with ``NodeApi``: the code every agent runs),
   one thread each, started at random moments over one resync period (nodes do not boot
   at once). Their periods are the agent's defaults divided by ``--scale`` (watches of
   180-360 s and a fresh read every 360 s at 10): the request rate of a steady state is one
   over those periods, so the figures are measured at ``--scale`` times the real rate and
   divided back; the watches' own cost (the server's bookmark events, open connections) is
   not scaled and is counted in full.
2. **The guard it replaced.** ``swapwise label-nodes --pressure-guard`` from ``--guard-rev``
   (``git archive``: the last revision that had it), reading each swap node's Summary
   through the API server's node proxy every 10 s, 8 at a time; every Node's kubelet is a
   stand-in HTTPS server on this machine's address (the proxy refuses loopback).

After both, the floor: the same control plane and Nodes with no client, over the same
window. Reported per phase: requests per second at kube-apiserver (its own
``apiserver_request_total``, the benchmark's scrapes left out), per 1,000 nodes, and
kube-apiserver's and etcd's CPU (millicores, from /proc). Issue 42's targets: at most 1
request/s per 1,000 nodes for the agents, and at least 20x less API-server CPU than the guard.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import resource
import signal
import ssl
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from benchmarks.common import machine, report
from benchmarks.cpu import cpu_seconds
from tests.e2e.cluster import ControlPlane, bin_dir, ensure_binaries, free_port
from webhook.agent.agent_metrics import AgentMetrics
from webhook.agent.nodeapi import ApiConfig, NodeApi
from webhook.agent.run import AgentOptions, NodeWatcher

REPO = Path(__file__).resolve().parents[1]
GI = 1 << 30


def host_address() -> str | None:
    """An IPv4 address of this machine that the API server's node proxy accepts (global
    unicast: it refuses loopback, link-local and the like), or None."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show", "scope", "global"],
                         capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            return fields[fields.index("inet") + 1].split("/")[0]
    return None


def requests_total(cp: ControlPlane) -> float:
    """kube-apiserver's apiserver_request_total, summed over every label set (a watch is
    counted when it ends; the benchmark's own two scrapes a window are in it, negligible)."""
    text = cp.kubectl("get", "--raw", "/metrics").stdout
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("apiserver_request_total{"))


def node_body(name: str, address: str, port: int) -> dict[str, Any]:
    """A swap node as the agents and the guard both judge it: LimitedSwap declared, 32Gi of
    swap on 16Gi, its kubelet at ``address:port``."""
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "swapwise.io/swap-behavior": "LimitedSwap",
            "swapwise.io/swap-node": "true", "swapwise.io/swap-permille": "2000"}},
        "status": {
            "capacity": {"cpu": "8", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"},
            "addresses": [{"type": "InternalIP", "address": address}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                         "kubeletVersion": "v1.34.4", "kubeProxyVersion": "",
                         "containerRuntimeVersion": "fake://0", "kernelVersion": "6.0.0",
                         "osImage": "bench", "bootID": "", "machineID": "", "systemUUID": "",
                         "swap": {"capacity": 32 * GI}},
        },
    }


def create_nodes(cp: ControlPlane, count: int, address: str, port: int) -> list[str]:
    api = NodeApi(ApiConfig.from_kubeconfig(cp.kubeconfig))
    names = [f"bench-node-{i:05d}" for i in range(count)]

    def create(name: str) -> None:
        api.call("POST", "/api/v1/nodes", json.dumps(node_body(name, address, port)).encode(),
                  "application/json")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, names))
    return names


class StandInKubelets:
    """Every Node's kubelet: one HTTPS server answering any ``/stats/summary`` with a calm
    node's CPU-and-memory Summary (what the guard reads), counting the reads."""

    def __init__(self, cp: ControlPlane, address: str) -> None:
        cert, key = cp.issue_serving_cert("kubelets", "kubelets", address)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.reads = 0
        lock = threading.Lock()
        body = json.dumps({"node": {
            "nodeName": "n", "startTime": "2026-01-01T00:00:00Z",
            "cpu": {"time": "2026-01-01T00:00:01Z", "usageNanoCores": 1000},
            "memory": {"time": "2026-01-01T00:00:01Z", "workingSetBytes": 2 * GI, "psi": {
                "full": {"total": 1, "avg10": 0.0, "avg60": 0.0, "avg300": 0.0},
                "some": {"total": 1, "avg10": 0.5, "avg60": 0.5, "avg300": 0.5}}}},
            "pods": []}).encode()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with lock:
                    outer.reads += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer((address, 0), Handler)
        self.server.daemon_threads = True
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def simulate_agents(kubeconfig: Path, names: list[str], scale: float) -> None:
    """The child process: one agent's Node watcher per name, started over one resync
    period, until killed."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    threading.stack_size(256 * 1024)
    config = ApiConfig.from_kubeconfig(kubeconfig)
    options = AgentOptions(node="", watch_seconds=(int(1800 / scale), int(3600 / scale)),
                           resync=3600 / scale)
    metrics = AgentMetrics()
    stop = threading.Event()
    period = options.resync
    for name in names:
        watcher = NodeWatcher(NodeApi(config), AgentOptions(
            node=name, watch_seconds=options.watch_seconds, resync=options.resync),
            stop, lambda: None, metrics)

        def run(watcher: NodeWatcher = watcher) -> None:
            if not stop.wait(random.uniform(0, period)):
                watcher.run()

        threading.Thread(target=run, daemon=True).start()
    print(f"agents: {len(names)} started over {period:.0f} s", flush=True)
    signal.sigwait({signal.SIGTERM})


@contextmanager
def child(argv: list[str], log: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env, cwd=cwd)
        try:
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def measure(cp: ControlPlane, pids: dict[str, int], window: float) -> dict[str, float]:
    before = requests_total(cp)
    cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    start = time.monotonic()
    time.sleep(window)
    elapsed = time.monotonic() - start
    after = requests_total(cp)
    out = {"requests_per_s": (after - before) / elapsed}
    for name, pid in pids.items():
        out[f"{name}_millicores"] = (cpu_seconds(pid) - cpu_before[name]) / elapsed * 1000
    return out


def old_tree(rev: str) -> Path:
    """The ``webhook`` package of ``rev``, unpacked into a directory of its own."""
    target = Path(tempfile.mkdtemp(prefix=f"swapwise-{rev}-"))
    archive = subprocess.run(["git", "archive", rev, "webhook"], check=True,
                             capture_output=True, cwd=REPO).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--window", type=float, default=300.0)
    parser.add_argument("--scale", type=float, default=10.0,
                        help="the agents' periods are divided by this (default 10)")
    parser.add_argument("--guard-rev", default="9a72a00",
                        help="the revision whose label-nodes --pressure-guard is compared")
    parser.add_argument("--skip-guard", action="store_true")
    parser.add_argument("--simulate", help=argparse.SUPPRESS)  # the child: a names file
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.simulate:
        simulate_agents(Path(args.kubeconfig), json.loads(Path(args.simulate).read_text()),
                        args.scale)
        return
    address = host_address()
    if address is None:
        sys.exit("no global unicast address on this machine: the API server's node proxy "
                 "refuses loopback, so the guard's stand-in kubelets cannot be reached")
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))  # the API server inherits it
    print(machine(), flush=True)
    binaries = ensure_binaries()
    rows: list[list[str]] = []
    figures: dict[str, dict[str, float]] = {}
    with ControlPlane(binaries, apiserver=bin_dir() / "kube-apiserver",
                      apiserver_args=["--max-requests-inflight=1000"]) as cp:
        pids = {c.name: c.proc.pid for c in cp.components  # type: ignore[union-attr]
                if c.name in ("kube-apiserver", "etcd")}
        pids = {"apiserver" if k == "kube-apiserver" else k: v for k, v in pids.items()}
        kubelets = StandInKubelets(cp, address)
        started = time.monotonic()
        names = create_nodes(cp, args.nodes, address, kubelets.port)
        print(f"{len(names)} nodes created in {time.monotonic() - started:.0f} s", flush=True)
        names_file = cp.workdir / "names.json"
        names_file.write_text(json.dumps(names))
        ramp = 3600 / args.scale
        with child([sys.executable, "-m", "benchmarks.node_agents", "--simulate",
                    str(names_file), "--kubeconfig", str(cp.kubeconfig), "--scale",
                    str(args.scale)], cp.workdir / "agents.log") as agents:
            print(f"agents ramping up over {ramp:.0f} s", flush=True)
            time.sleep(ramp)
            pids_agents = {**pids, "agents": agents.pid}
            got = measure(cp, pids_agents, args.window)
            got["requests_per_s_real"] = got["requests_per_s"] / args.scale
            figures["agents"] = got
        if not args.skip_guard:
            tree = old_tree(args.guard_rev)
            env = {**os.environ, "PYTHONPATH": str(tree)}
            argv = [sys.executable, "-c", "import sys; from webhook.cli import main; "
                    "sys.exit(main())", "label-nodes", "--kubeconfig", str(cp.kubeconfig),
                    "--lease-namespace", "default", "--metrics-port", str(free_port()),
                    "--metrics-host", "127.0.0.1", "--pressure-guard"]
            # run from the old tree: ``-c`` puts the working directory first on sys.path,
            # and this checkout's webhook/ would shadow the old one
            with child(argv, cp.workdir / "guard.log", env, cwd=tree) as guard:
                time.sleep(60)  # its first pass labels and reads every node
                reads = kubelets.reads
                got = measure(cp, {**pids, "guard": guard.pid}, args.window)
                got["kubelet_reads_per_s"] = (kubelets.reads - reads) / args.window
                got["requests_per_s_real"] = got["requests_per_s"]
                figures["guard"] = got
        # The floor, last: the same control plane and Nodes with no client at all, once its
        # controllers have settled (right after 5,000 Nodes are created they are busy for
        # minutes, and a floor measured then was above the agents' phase).
        figures["idle"] = measure(cp, pids, args.window)
        figures["idle"]["requests_per_s_real"] = figures["idle"]["requests_per_s"]
    for phase, got in figures.items():
        rows.append([phase, f"{got['requests_per_s_real']:.2f}",
                     f"{got['requests_per_s_real'] / args.nodes * 1000:.3f}",
                     f"{got['apiserver_millicores']:.0f}", f"{got['etcd_millicores']:.0f}"])
    report(f"{args.nodes} nodes, {args.window:.0f} s of steady state each", rows,
           ["phase", "requests/s", "per 1,000 nodes", "apiserver mCPU", "etcd mCPU"])
    if "guard" in figures:
        ratio = figures["guard"]["apiserver_millicores"] / max(
            figures["agents"]["apiserver_millicores"], 1e-9)
        print(f"kube-apiserver CPU, guard / agents: {ratio:.1f}x")
        idle = figures["idle"]["apiserver_millicores"]
        above = figures["agents"]["apiserver_millicores"] - idle
        print(f"idle floor {idle:.0f} mCPU; the agents' phase {above:.0f} above it, the "
              f"guard's {figures['guard']['apiserver_millicores'] - idle:.0f} (the agents ran "
              f"at {args.scale:g}x their real request rate)")
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()

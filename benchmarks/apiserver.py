"""Behind a real kube-apiserver: what swapwise costs on the path it is really called on.

    python -m benchmarks.apiserver [--creators 16,64] [--pods 1000] [--rounds 3]
                                   [--compare DIR ...] [--noisy] [--syscalls] [--k8s 1.34]
    python -m benchmarks.apiserver --latency [--pods 300] [--k8s 1.37]

**The headline** (default): the e2e control plane (tests/e2e/cluster.py: etcd,
kube-apiserver, scheduler, controller-manager built by tests/e2e/build-control-plane.sh)
calls ``swapwise serve`` (its policy and certificate mounted as the chart mounts them:
ConfigMap/Secret volumes with the kubelet's ``..data`` symlink, testkit/server_proc.py)
and the floor webhook (benchmarks/floor.py: uvicorn + uvloop, no-op) for a namespace each,
``failurePolicy: Fail`` and ``timeoutSeconds: 10``, so every create is exactly one call,
``POST /mutate/sandbox?timeout=10s``. In each namespace N concurrent creators (threads,
one keep-alive connection each) create the 4-container pod (with a scheduling gate:
stored, never scheduled), a burst of ``--pods``; the bursts of all servers run at the same
time (``--apart``: one after the other), round after round, the pods deleted after each,
so every server sees the same moments of a shared machine. Per burst and server:

- server CPU per admission: the time every thread of the process ran during the burst
  (/proc/<pid>/task/*/schedstat) ÷ admissions; the ratio swapwise ÷ floor is taken per
  round, behind the same API server, over the same seconds;
- TLS handshakes per admission: new client connections to the server's port during the
  burst (every connection seen in /proc/net/tcp, including TIME_WAIT, which outlives the
  burst), and the most open at once;
- context switches per admission (/proc/<pid>/task/*/status, voluntary and not);
- create latency at the client (p50, p99), and the API server's CPU per create.

``--compare DIR`` adds another source tree's server (``git archive <rev> webhook | tar -x
-C DIR``) in a namespace of its own, in the same rounds. ``--noisy`` writes a file next to
each swapwise policy (in the mounted directory) every 20 ms during its bursts.
``--syscalls`` adds one burst per server under ``strace -c -f`` (not counted in the CPU
figures: tracing slows everything) and prints futex calls and syscalls per admission.

``--latency``: the earlier benchmark, one client creating pods one at a time, alternating
between namespaces with no webhook, the floor, swapwise (full patch, 5-op patch, no patch)
and the admission policies ``swapwise render admission-policy`` makes; on 1.34 they need
the v1beta1 API behind its feature gate.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import http.client
import itertools
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from statistics import median
from typing import Any

import httpx

from benchmarks.common import machine, percentile, report
from benchmarks.cpu import Floor, sched_seconds, start_tree
from benchmarks.https import BASELINE_ENV
from testkit.payloads import POLICY_YAML, pod
from testkit.server_proc import ServerProcess
from tests.e2e.cluster import (
    BINARIES,
    DEFAULT_LINE,
    ControlPlane,
    Swapwise,
    bin_dir,
    free_port,
    missing_binaries,
    register_webhook,
    wait_for_mutation,
    webhook_configuration,
)
from webhook.policy import Policy, parse_policy
from webhook.render.admission_policy import render_admission_policies

HOLD = {"name": "swapwise.io/bench-hold"}  # a scheduling gate: stored, never scheduled


def bench_pod() -> dict[str, Any]:
    """payloads.pod(4) as a user submits it: what the API server adds is left out (the
    token volume and its mounts, the service account, managedFields, status)."""
    template = pod(4, owned=False)
    template["metadata"] = {"generateName": "bench-",
                            "labels": template["metadata"]["labels"]}
    template.pop("status")
    spec = template["spec"]
    for key in ("volumes", "serviceAccount", "serviceAccountName"):
        spec.pop(key, None)
    for container in [*spec["containers"], *spec.get("initContainers", [])]:
        container.pop("volumeMounts", None)
    return template


# --- the headline: server CPU per admission behind the API server ----------------------


@dataclasses.dataclass
class Target:
    """A webhook server the API server calls for one namespace."""

    name: str
    pid: int
    port: int
    namespace: str
    ca: bytes  # the CA that signed its serving certificate
    policy_dir: Path | None = None  # swapwise: the mounted policy directory
    server: ServerProcess | None = None


def client_ports(port: int) -> tuple[set[str], int]:
    """Client endpoints of every TCP connection to ``port`` on loopback (any state but
    LISTEN, TIME_WAIT included), and how many of them are ESTABLISHED."""
    wanted = f":{port:04X}"
    seen: set[str] = set()
    established = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, state = fields[1], fields[2], fields[3]
        if state == "0A":
            continue
        if local.endswith(wanted):  # the server's side: the client is the remote end
            seen.add(remote)
            established += state == "01"
        elif remote.endswith(wanted):
            seen.add(local)
    return seen, established


class Connections:
    """New connections to a port while it runs (polled; TIME_WAIT keeps closed ones
    visible for 60 s), and the most established at once."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.before, _ = client_ports(port)
        self.seen: set[str] = set()
        self.most = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self.stop.is_set():
            seen, established = client_ports(self.port)
            self.seen |= seen
            self.most = max(self.most, established)
            self.stop.wait(0.1)

    def __enter__(self) -> Connections:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.seen |= client_ports(self.port)[0]

    @property
    def new(self) -> int:
        return len(self.seen - self.before)


def on_cpu(pid: int) -> float:
    """Seconds every live thread of ``pid`` has run (schedstat: nanoseconds, where
    /proc/<pid>/stat counts 10 ms ticks). The servers' threads live as long as they do."""
    return sched_seconds(pid)[0]


def context_switches(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


class Api:
    """Creates and deletes pods through the API server with the admin certificate."""

    def __init__(self, cp: ControlPlane) -> None:
        self.host, port = cp.server.removeprefix("https://").split(":")
        self.port = int(port)
        self.context = ssl.create_default_context(cafile=str(cp.pki / "ca.crt"))
        self.context.load_cert_chain(cp.pki / "admin.crt", cp.pki / "admin.key")
        body = bench_pod()
        body["spec"]["schedulingGates"] = [HOLD]
        self.body = json.dumps(body).encode()

    def connection(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.context,
                                           timeout=60)

    def burst(self, namespace: str, total: int, creators: int) -> tuple[list[float], float]:
        """``total`` creates from ``creators`` threads: latencies (ms) and wall seconds."""
        counter = itertools.count()
        latencies: list[float] = []
        errors: list[str] = []
        path = f"/api/v1/namespaces/{namespace}/pods"
        headers = {"Content-Type": "application/json", "Accept": "application/json"}

        def creator() -> None:
            conn = self.connection()
            try:
                while next(counter) < total and not errors:
                    started = time.perf_counter()
                    conn.request("POST", path, self.body, headers)
                    reply = conn.getresponse()
                    content = reply.read()
                    latencies.append((time.perf_counter() - started) * 1000)
                    if reply.status != 201:
                        errors.append(f"{reply.status} {content[:300]!r}")
            finally:
                conn.close()

        threads = [threading.Thread(target=creator) for _ in range(creators)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise SystemExit(f"pod create in {namespace}: {errors[0]}")
        return latencies, time.perf_counter() - started

    def delete_all(self, namespace: str) -> None:
        conn = self.connection()
        try:
            conn.request("DELETE", f"/api/v1/namespaces/{namespace}/pods")
            reply = conn.getresponse()
            reply.read()
            if reply.status != 200:
                raise SystemExit(f"deleting pods in {namespace}: {reply.status}")
        finally:
            conn.close()

    def mutated(self, namespace: str) -> bool:
        conn = self.connection()
        try:
            conn.request("GET", f"/api/v1/namespaces/{namespace}/pods?limit=1")
            items = json.loads(conn.getresponse().read())["items"]
        finally:
            conn.close()
        return bool(items) and "swapwise.io/profile" in (
            items[0]["metadata"].get("annotations") or {})


def register(cp: ControlPlane, target: Target) -> None:
    """One webhook for ``target``'s namespace only, as the chart's entry but by URL."""
    config = webhook_configuration(f"https://127.0.0.1:{target.port}", target.ca, ["sandbox"],
                                   failure_policy="Fail", name=target.namespace,
                                   timeout_seconds=10)
    config["webhooks"][0]["name"] = f"{target.namespace}.swapwise.io"
    config["webhooks"][0]["namespaceSelector"] = {"matchLabels": {
        "kubernetes.io/metadata.name": target.namespace}}
    cp.apply(json.dumps(config))


@contextmanager
def noise(directory: Path | None, on: bool) -> Iterator[None]:
    """A file written next to the policy every 20 ms (a log file, another tool's state)."""
    stop = threading.Event()

    def write() -> None:
        assert directory is not None
        path = directory / "other.log"
        count = 0
        while not stop.wait(0.02):
            count += 1
            with path.open("a") as f:
                f.write(f"line {count}\n")

    thread = threading.Thread(target=write, daemon=True)
    if on and directory is not None:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()


@contextmanager
def straced(pid: int, out: Path) -> Iterator[None]:
    """``strace -c -f`` attached to every thread of ``pid`` while the block runs."""
    tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", str(out)],
                              stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached
    try:
        yield
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(30)


def strace_counts(out: Path) -> dict[str, int]:
    """Calls per syscall from ``strace -c`` output (and "total")."""
    counts: dict[str, int] = {}
    for line in out.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0][0].isdigit() and fields[3].isdigit():
            name = fields[-1]
            counts[name] = int(fields[3])
    return counts


@dataclasses.dataclass
class Burst:
    cpu_us: float  # server CPU per admission
    handshakes: float  # new connections per admission
    most_open: int
    switches: float  # context switches per admission
    latencies: list[float]
    rate: float  # creates per second
    apiserver_us: float  # kube-apiserver CPU per create


def run_burst(api: Api, target: Target, pods: int, creators: int, apiserver_pid: int,
              noisy: bool) -> Burst:
    with noise(target.policy_dir, noisy):
        cpu, switched, api_cpu = (on_cpu(target.pid), context_switches(target.pid),
                                  on_cpu(apiserver_pid))
        with Connections(target.port) as connections:
            latencies, seconds = api.burst(target.namespace, pods, creators)
        cpu, switched, api_cpu = (on_cpu(target.pid) - cpu,
                                  context_switches(target.pid) - switched,
                                  on_cpu(apiserver_pid) - api_cpu)
    if target.server is not None:
        assert api.mutated(target.namespace), f"{target.name} did not mutate"
    api.delete_all(target.namespace)
    return Burst(cpu / pods * 1e6, connections.new / pods, connections.most, switched / pods,
                 sorted(latencies), pods / seconds, api_cpu / pods * 1e6)


def together(api: Api, targets: list[Target], pods: int, creators: int, apiserver_pid: int,
             noisy: bool) -> list[Burst]:
    """One burst per target, all at the same time (each with its own ``creators``): every
    server runs through the same moments of a busy machine, so the ratios between them
    move far less than between bursts run one after the other."""
    bursts: list[Burst | None] = [None] * len(targets)
    failures: list[str] = []

    def run(index: int) -> None:
        try:
            bursts[index] = run_burst(api, targets[index], pods, creators, apiserver_pid,
                                      noisy)
        except BaseException as exc:  # SystemExit too: a thread would swallow it
            failures.append(f"{targets[index].name}: {exc!r}")

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(targets))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures or None in bursts:
        raise SystemExit(f"bursts failed: {failures}")
    return [burst for burst in bursts if burst is not None]


def headline(args: argparse.Namespace) -> None:
    binaries = bin_dir(DEFAULT_LINE)
    apiserver = bin_dir(args.k8s) / "kube-apiserver"
    work = Path(tempfile.mkdtemp(prefix="swapwise-bench-api-"))
    trees = {"swapwise": os.environ.get(BASELINE_ENV)}
    for source in args.compare:
        trees[f"swapwise from {source}"] = source
    servers: dict[str, ServerProcess] = {}
    floor: Floor | None = None
    print(machine(), flush=True)
    try:
        for name, source in trees.items():
            servers[name] = start_tree(source, args.server_args)
        first = next(iter(servers.values()))
        floor = Floor(first.tls.root)
        targets = [Target(name, server.process.pid, server.port,  # type: ignore[union-attr]
                          f"bench-{index}", server.ca_file().read_bytes(),
                          server.policy.root if server.policy else None, server)
                   for index, (name, server) in enumerate(servers.items())]
        targets.append(Target("floor", floor.process.pid, floor.port, "bench-floor",
                              first.ca_file().read_bytes()))
        with ControlPlane(binaries, apiserver=apiserver) as cp:
            api_pid = next(c.proc.pid for c in cp.components  # type: ignore[union-attr]
                           if c.name == "kube-apiserver")
            for target in targets:
                cp.create_namespace(target.namespace)
                register(cp, target)
            api = Api(cp)
            for target in targets:  # until each webhook is called (informers), then warm
                deadline = time.monotonic() + 60
                while True:
                    api.burst(target.namespace, 20, 4)
                    called = target.server is None or api.mutated(target.namespace)
                    api.delete_all(target.namespace)
                    if called or time.monotonic() > deadline:
                        break
                    time.sleep(0.5)
                run_burst(api, target, min(args.pods, 300), 16, api_pid, False)
            results: dict[tuple[int, str], list[Burst]] = {}
            for creators in args.creators:
                for round_ in range(args.rounds):
                    order = targets[round_ % len(targets):] + targets[:round_ % len(targets)]
                    if args.apart:
                        bursts = [run_burst(api, target, args.pods, creators, api_pid,
                                            args.noisy) for target in order]
                    else:
                        bursts = together(api, order, args.pods, creators, api_pid,
                                          args.noisy)
                    for target, burst in zip(order, bursts, strict=True):
                        results.setdefault((creators, target.name), []).append(burst)
                        print(f"   {creators} creators, {target.name}: {burst.cpu_us:.0f} µs "
                              f"CPU/admission, {burst.handshakes:.3f} handshakes/admission "
                              f"(most open {burst.most_open}), {burst.switches:.2f} "
                              f"switches/admission, p99 {percentile(burst.latencies, 99):.1f}"
                              f" ms, {burst.rate:.0f}/s, API server {burst.apiserver_us:.0f}"
                              f" µs/create, load {os.getloadavg()[0]:.2f}", flush=True)
            syscalls: dict[str, dict[str, int]] = {}
            if args.syscalls:
                for target in targets:
                    out = work / f"strace-{target.namespace}.txt"
                    with straced(target.pid, out):
                        run_burst(api, target, args.pods, args.creators[0], api_pid,
                                  args.noisy)
                    syscalls[target.name] = strace_counts(out)
    finally:
        if floor is not None:
            floor.stop()
        for server in servers.values():
            server.stop()
    print(machine())
    print(f"{args.pods} pods per burst, {args.rounds} rounds"
          + (", a file written next to the policy every 20 ms" if args.noisy else ""))
    for creators in args.creators:
        rows = []
        floor_runs = results[(creators, "floor")]
        for target in targets:
            runs = results[(creators, target.name)]
            cpu = [b.cpu_us for b in runs]
            ratios = [b.cpu_us / f.cpu_us for b, f in zip(runs, floor_runs, strict=True)]
            latencies = sorted(v for b in runs for v in b.latencies)
            rows.append([
                target.name, f"{median(cpu):.0f} ({min(cpu):.0f}-{max(cpu):.0f})",
                f"**{median(ratios):.2f}** ({min(ratios):.2f}-{max(ratios):.2f})",
                f"{median(b.handshakes for b in runs):.3f}",
                str(max(b.most_open for b in runs)),
                f"{median(b.switches for b in runs):.2f}",
                f"{percentile(latencies, 50):.1f}", f"{percentile(latencies, 99):.1f}",
                f"{median(b.rate for b in runs):.0f}",
                # With the bursts together, the API server's CPU is every namespace's.
                f"{median(b.apiserver_us for b in runs):.0f}" if args.apart else "-"])
        first = results[(creators, targets[0].name)]
        for target in targets[1:-1]:  # another tree's swapwise against this one, per round
            ratios = [a.cpu_us / b.cpu_us
                      for a, b in zip(first, results[(creators, target.name)], strict=True)]
            rows.append([f"{targets[0].name} ÷ {target.name}",
                         f"{median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
                         "", "", "", "", "", "", "", ""])
        report(f"{creators} concurrent creators behind kube-apiserver {args.k8s}", rows,
               ["server", "µs CPU/admission (range)", "÷ floor (range)",
                "handshakes/admission", "most open", "switches/admission", "p50 ms",
                "p99 ms", "creates/s", "API server µs/create"])
    if syscalls:
        rows = []
        for name, counts in syscalls.items():
            rows.append([name, f"{counts.get('futex', 0) / args.pods:.2f}",
                         f"{counts.get('total', 0) / args.pods:.1f}"])
        report(f"syscalls per admission under strace -c -f ({args.creators[0]} creators)",
               rows, ["server", "futex", "all syscalls"])


# --- --latency: one client, every mode ---------------------------------------------------


WEBHOOK_NS, LEAN_NS, NOOP_NS, FLOOR_NS, PLAIN_NS = (
    "bench-swapwise", "bench-lean", "bench-noop", "bench-floor", "bench-plain")
POLICY_NS, POLICY_ONLY_NS = "bench-policy", "bench-policy-nowarn"
MUTATED = (WEBHOOK_NS, LEAN_NS, POLICY_NS, POLICY_ONLY_NS)
# "noop": the webhook is called, decides to leave the pod alone (its podSelector never
# matches) and answers without a patch, which separates the call from the patch.
# "lean": requests only (no resizePolicy, no placement), a 5-op patch instead of 10.
POLICY = POLICY_YAML + b"""\
  lean:
    swapRatio: 2
    resizePolicy: keep
    placement: {mode: none}
  noop:
    podSelector:
      matchLabels: {never: match}
"""
LABELS = {WEBHOOK_NS: "swapwise, patch", LEAN_NS: "swapwise, lean patch",
          NOOP_NS: "swapwise, no patch",
          FLOOR_NS: "minimal webhook (floor)", PLAIN_NS: "no webhook",
          POLICY_NS: "admission policies (mutate + warn)",
          POLICY_ONLY_NS: "admission policy (mutate only)"}


def create(client: httpx.Client, namespace: str, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    reply = client.post(f"/api/v1/namespaces/{namespace}/pods", json=body)
    elapsed = time.perf_counter() - started
    if reply.status_code != 201:
        raise SystemExit(f"pod create in {namespace}: {reply.status_code} {reply.text[:300]}")
    annotations = reply.json()["metadata"].get("annotations") or {}
    if (namespace in MUTATED) != ("swapwise.io/profile" in annotations):
        raise SystemExit(f"unexpected mutation state in {namespace}: {annotations}")
    return elapsed * 1000


def webhook_seconds(client: httpx.Client) -> dict[str, tuple[float, float]]:
    """Per webhook: (sum, count) of the API server's own timing of its calls."""
    found: dict[str, tuple[float, float]] = {}
    prefix = "apiserver_admission_webhook_admission_duration_seconds_"
    for line in client.get("/metrics").text.splitlines():
        if not line.startswith(prefix) or 'type="admit"' not in line:
            continue
        name, _, value = line.rpartition(" ")
        hook = name.split('name="', 1)[1].split('"', 1)[0]
        total, count = found.get(hook, (0.0, 0.0))
        if name.startswith(prefix + "sum"):
            found[hook] = (total + float(value), count)
        elif name.startswith(prefix + "count"):
            found[hook] = (total, count + float(value))
    return found


def established(port: int) -> int:
    """TCP connections open to ``port`` (the API server reuses them: expect a few)."""
    return client_ports(port)[1]


def admission_policies(cp: ControlPlane, api_version: str) -> None:
    """The sandbox profile as rendered admission policies, under two profile names: one
    with the Warn policy, one without it (its binding left out)."""
    sandbox = parse_policy(POLICY.decode()).profiles["sandbox"]
    for name, namespace, warn in (("apsandbox", POLICY_NS, True),
                                  ("apnowarn", POLICY_ONLY_NS, False)):
        profile = dataclasses.replace(sandbox, name=name)
        objects = render_admission_policies(Policy(profiles={name: profile}), api_version)
        if not warn:
            objects = [o for o in objects if o["kind"] != "ValidatingAdmissionPolicyBinding"]
        cp.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
        cp.create_namespace(namespace, {"swapwise.io/profile": name})
        wait_for_mutation(cp, namespace)


def latency(args: argparse.Namespace) -> None:
    # Only kube-apiserver comes from --k8s: it is what admits pods (as in the e2e test).
    binaries = bin_dir(DEFAULT_LINE)
    apiserver = bin_dir(args.k8s) / "kube-apiserver"
    api_version = "v1beta1" if args.k8s in ("1.34", "1.35") else "v1"
    gates = [] if api_version == "v1" else [
        "--feature-gates=MutatingAdmissionPolicy=true",
        "--runtime-config=admissionregistration.k8s.io/v1beta1=true"]
    work = Path(tempfile.mkdtemp(prefix="swapwise-bench-api-"))
    policy = work / "policy.yaml"
    policy.write_bytes(POLICY)
    with ControlPlane(binaries, apiserver_args=gates, apiserver=apiserver) as cp, \
            Swapwise(work / "swapwise", policy) as webhook:
        admission_policies(cp, api_version)
        cp.create_namespace(WEBHOOK_NS, {"swapwise.io/profile": "sandbox"})
        cp.create_namespace(LEAN_NS, {"swapwise.io/profile": "lean"})
        cp.create_namespace(NOOP_NS, {"swapwise.io/profile": "noop"})
        cp.create_namespace(FLOOR_NS, {"swapwise.io/profile": "floor"})
        cp.create_namespace(PLAIN_NS)
        register_webhook(cp, webhook.url_base, webhook.ca_bundle, ["sandbox", "lean", "noop"])
        floor_port = free_port()
        floor = subprocess.Popen([sys.executable, "-m", "benchmarks.floor", "--port",
                                  str(floor_port), "--cert-dir", str(webhook.cert_dir)])
        register_webhook(cp, f"https://127.0.0.1:{floor_port}", webhook.ca_bundle, ["floor"],
                         name="floor")
        wait_for_mutation(cp, WEBHOOK_NS)
        pki = cp.pki
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(pki / "admin.crt", pki / "admin.key")
        client = httpx.Client(base_url=cp.server, verify=context, timeout=30)
        body = bench_pod()
        samples: dict[str, list[float]] = {ns: [] for ns in LABELS}
        with client:
            for _ in range(20):  # warm both paths (connections, caches, informers)
                for namespace in samples:
                    create(client, namespace, copy.deepcopy(body))
            before = webhook_seconds(client)
            for _ in range(args.pods):
                for namespace in samples:
                    samples[namespace].append(create(client, namespace, copy.deepcopy(body)))
            after = webhook_seconds(client)
        floor.terminate()
        floor.wait()
        connections = established(webhook.port)
        in_app = sorted(
            entry["duration_ms"] for entry in map(json.loads, (
                line for line in (work / "swapwise" / "swapwise.log").read_text().splitlines()
                if '"msg": "admission"' in line)))
    rows = []
    for namespace, values in samples.items():
        values.sort()
        rows.append([
            LABELS[namespace],
            str(len(values)), f"{percentile(values, 50):.2f}", f"{percentile(values, 90):.2f}",
            f"{percentile(values, 99):.2f}",
        ])
    without = percentile(samples[PLAIN_NS], 50)
    overhead = percentile(samples[WEBHOOK_NS], 50) - without
    call_only = percentile(samples[NOOP_NS], 50) - without
    any_webhook = percentile(samples[FLOOR_NS], 50) - without
    print(machine())
    report("Pod create through kube-apiserver (ms)", rows,
           ["namespace", "pods", "p50", "p90", "p99"])
    print(f"\nswapwise overhead per pod (difference of medians): {overhead:.2f} ms; "
          f"without a patch: {call_only:.2f} ms; a minimal webhook: {any_webhook:.2f} ms")
    medians = {ns: percentile(values, 50) for ns, values in samples.items()}
    print("ratios of medians (kube-apiserver "
          f"{args.k8s}): webhook / no mutation {medians[WEBHOOK_NS] / without:.2f}; "
          f"admission policies / no mutation {medians[POLICY_NS] / without:.2f}; "
          f"admission policies / webhook {medians[POLICY_NS] / medians[WEBHOOK_NS]:.2f}; "
          f"mutating policy only / webhook {medians[POLICY_ONLY_NS] / medians[WEBHOOK_NS]:.2f}")
    for hook, (total, count) in sorted(after.items()):
        base_total, base_count = before.get(hook, (0.0, 0.0))
        if count > base_count:
            print(f"API server's timing of calls to {hook}: mean "
                  f"{(total - base_total) / (count - base_count) * 1000:.2f} ms")
    print(f"open connections to swapwise at the end: {connections}")
    print(f"inside swapwise (body read to answer built): median "
          f"{percentile(in_app, 50):.3f} ms, p99 {percentile(in_app, 99):.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", action="store_true",
                        help="the one-client latency benchmark of every mode instead")
    parser.add_argument("--pods", type=int, default=None,
                        help="pods per burst (default 1000), or per namespace with --latency "
                             "(default 300)")
    parser.add_argument("--creators", default="16,64",
                        help="concurrent creators, comma-separated (default 16,64)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--apart", action="store_true",
                        help="each server's burst after the other's (default: all at once)")
    parser.add_argument("--compare", metavar="DIR", action="append", default=[],
                        help="also measure the server of another source tree; repeatable")
    parser.add_argument("--noisy", action="store_true",
                        help="write a file next to the policy every 20 ms during bursts")
    parser.add_argument("--syscalls", action="store_true",
                        help="one more burst per server under strace -c -f")
    parser.add_argument("--server-args", default="", help="extra `swapwise serve` options")
    parser.add_argument("--k8s", default=DEFAULT_LINE,
                        help=f"Kubernetes line of the API server (default {DEFAULT_LINE})")
    args = parser.parse_args()
    # A background job ignores SIGINT: let SIGTERM stop the servers and the control plane.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    missing = missing_binaries(bin_dir(DEFAULT_LINE), BINARIES)
    if missing or not (bin_dir(args.k8s) / "kube-apiserver").exists():
        raise SystemExit(f"control plane binaries missing ({', '.join(missing) or args.k8s}):"
                         " run `make control-plane`")
    if args.latency:
        args.pods = args.pods or 300
        latency(args)
        return
    args.pods = args.pods or 1000
    args.creators = [int(c) for c in args.creators.split(",")]
    headline(args)


if __name__ == "__main__":
    main()

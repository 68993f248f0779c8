"""Server CPU per admission under wrk, as a ratio to a no-op webhook on the same stack,
and the decision function as a ratio to bare JSON.

    python -m benchmarks.cpu [--duration 5] [--rounds 3] [--connections 32] [--callgrind]
                             [--compare DIR ...] [--server-args '...']

Absolute times on a shared 2-core machine move from run to run; ratios measured in the
same run move far less, so these are ratios (BENCHMARKS.md; its headline is the run
behind kube-apiserver, benchmarks/apiserver.py, and this is its secondary figure):

- **server CPU per admission**: a real ``swapwise serve`` (one process, its JSON line per
  admission going into a pipe this process reads) and the no-op floor webhook of
  benchmarks/floor.py (uvicorn + uvloop + httptools over TLS, a bare ASGI app that answers
  "allowed" without parsing), each pinned to CPU 0 and driven by wrk pinned to CPU 1 over
  the same keep-alive HTTPS connections, with kube-apiserver's request
  (``POST /mutate/sandbox?timeout=10s``, its headers, its review). The figure
  is the server process's own CPU time (utime + stime of all its threads, from
  /proc/<pid>/stat) over the run, divided by the admissions answered: not wall time, so
  it does not depend on how busy the machine was, only on what the server did. Rounds
  alternate between the two servers so drift hits both alike.
- **decision**: ``decide`` on a parsed review of the 4-container pod (testkit/payloads.py),
  against ``orjson.loads`` + ``orjson.dumps`` of the same review bytes, alternating batches,
  each timed in thread CPU time (so time the process spent preempted is not counted).
- ``--callgrind``: the same two ratios in instructions (valgrind's callgrind), which do not
  depend on the machine's load at all: for the decision, one valgrind run with a dump
  around each measured loop; for the servers, a fixed number of admissions sent by one
  client to each server running under valgrind (slow: a minute or two each).

``SWAPWISE_BENCH_SRC=<dir>`` measures the server (and the decision) of another source tree,
for before/after figures (see BENCHMARKS.md); ``--compare <dir>`` measures another tree's
server in the same run as this one, alternating with it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from statistics import median

from benchmarks.common import machine, report
from benchmarks.https import BASELINE_ENV, start_server, wrk
from testkit.payloads import ADMISSION_PATH, request_bytes, review_bytes
from testkit.server_proc import ServerProcess, free_port

TICK = os.sysconf("SC_CLK_TCK")
SERVER_CPU = 0  # the server under test runs here ...
LOAD_CPU = 1  # ... and the load generator here (when the machine has a second CPU)


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` so far (children excluded)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # fields 14 and 15 of proc(5)


def sched_seconds(pid: int) -> tuple[float, float]:
    """(on CPU, runnable but waiting for a CPU) so far, summed over the live threads of
    ``pid`` (/proc/<pid>/task/*/schedstat, nanoseconds). The wait shows how much the rest
    of the machine held the server back: it limits throughput, not CPU per admission."""
    running = waiting = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            on_cpu, queued, _slices = (task / "schedstat").read_text().split()
        except (OSError, ValueError):
            continue  # a thread that just ended
        running += int(on_cpu)
        waiting += int(queued)
    return running / 1e9, waiting / 1e9


def pin(pid: int, cpu: int) -> None:
    """Pin every thread of ``pid`` (threads started later inherit the main thread's mask)."""
    if cpu >= (os.cpu_count() or 1):
        return
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), {cpu})


class Floor:
    """benchmarks/floor.py on its own port, with the swapwise server's certificate."""

    def __init__(self, cert_dir: Path, wrapper: list[str] | None = None) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [*(wrapper or []), sys.executable, "-m", "benchmarks.floor", "--port",
             str(self.port), "--cert-dir", str(cert_dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("floor server exited")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("floor server did not start")

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def loaded_wrk(url: str, body: Path, connections: int, seconds: float, pid: int
               ) -> tuple[float, float, int]:
    """CPU seconds ``pid`` spent while wrk (on the other CPU) ran, seconds it waited for
    the CPU, and admissions answered."""
    before = cpu_seconds(pid)
    _, waited_before = sched_seconds(pid)
    result = wrk(url, body, connections, seconds, 1)
    used = cpu_seconds(pid) - before
    waited = sched_seconds(pid)[1] - waited_before
    errors = sum(result.get(k, 0) for k in ("connect", "read", "write", "status", "timeout"))
    if errors:
        raise SystemExit(f"wrk saw {errors} errors against {url}: {result}")
    return used, waited, int(result["requests"])


def pid_of(server: ServerProcess) -> int:
    assert server.process is not None, "started"
    return server.process.pid


def start_tree(source: str | None, server_args: str) -> ServerProcess:
    """``swapwise serve`` from this tree, or (``source``) from another one."""
    workdir = Path(tempfile.mkdtemp(prefix="swapwise-bench-"))
    saved = os.environ.pop(BASELINE_ENV, None)
    try:
        if source:
            os.environ[BASELINE_ENV] = source
        return start_server(workdir, 1, *server_args.split())
    finally:
        os.environ.pop(BASELINE_ENV, None)
        if saved is not None:
            os.environ[BASELINE_ENV] = saved


def server_cpu(args: argparse.Namespace, body: Path) -> list[list[str]]:
    servers = {"swapwise": start_tree(os.environ.get(BASELINE_ENV), args.server_args)}
    for source in args.compare:
        servers[f"swapwise from {source}"] = start_tree(source, args.server_args)
    floor = Floor(servers["swapwise"].tls.root)
    rows = []
    try:
        targets = {name: (server.url + ADMISSION_PATH, pid_of(server))
                   for name, server in servers.items()}
        targets["floor"] = (floor.url + ADMISSION_PATH, floor.process.pid)
        for _url, pid in targets.values():
            pin(pid, SERVER_CPU)
        if (os.cpu_count() or 1) > LOAD_CPU:
            os.sched_setaffinity(0, {LOAD_CPU})  # wrk, started from here, inherits it
        for url, _pid in targets.values():
            wrk(url, body, args.connections, 2, 1)  # warm up
        per: dict[str, list[float]] = {name: [] for name in targets}
        rates: dict[str, list[float]] = {name: [] for name in targets}
        for _ in range(args.rounds):
            for name, (url, pid) in targets.items():
                used, waited, answered = loaded_wrk(url, body, args.connections,
                                                    args.duration, pid)
                per[name].append(used / answered * 1e6)
                rates[name].append(answered / args.duration)
                print(f"   {name}: {per[name][-1]:.1f} µs CPU/admission, "
                      f"{rates[name][-1]:,.0f}/s, waited for the CPU "
                      f"{waited / args.duration:.0%} of the time, "
                      f"load {os.getloadavg()[0]:.2f}", flush=True)
        for name in targets:
            rows.append([name, f"{median(per[name]):.1f}",
                         f"{min(per[name]):.1f}-{max(per[name]):.1f}",
                         f"{median(rates[name]):,.0f}", ""])
        for name in servers:
            ratios = [s / f for s, f in zip(per[name], per["floor"], strict=True)]
            rows.append([f"**{name} ÷ floor**", f"**{median(ratios):.2f}**",
                         f"{min(ratios):.2f}-{max(ratios):.2f}", "",
                         f"{os.getloadavg()[0]:.2f}"])
        for source in args.compare:
            name = f"swapwise from {source}"
            ratios = [s / b for s, b in zip(per["swapwise"], per[name], strict=True)]
            rows.append([f"swapwise ÷ {name}", f"{median(ratios):.2f}",
                         f"{min(ratios):.2f}-{max(ratios):.2f}", "", ""])
    finally:
        floor.stop()
        for server in servers.values():
            server.stop()
    return rows


# The decision ratio runs in a child process, so SWAPWISE_BENCH_SRC can put an older tree's
# webhook first on the path, and callgrind can wrap it. os.getppid() marks the loops for
# callgrind (--dump-before=getppid): nothing else in the loop calls it.
DECISION = textwrap.dedent(
    """
    import gc, os, sys, time
    import orjson
    from testkit.payloads import review_bytes
    from webhook.admission import decide, parse_review
    from webhook.policy import parse_policy_bytes
    from testkit.payloads import POLICY_YAML

    iterations, batches = int(sys.argv[1]), int(sys.argv[2])
    policy = parse_policy_bytes(POLICY_YAML)
    body = review_bytes(4)
    request = parse_review(orjson.loads(body))
    decision = decide(request, "sandbox", policy)
    assert decision.outcome == "mutated", decision

    def run_decide(n):
        for _ in range(n):
            decide(request, "sandbox", policy)

    def run_json(n):
        for _ in range(n):
            orjson.dumps(orjson.loads(body))

    run_decide(200); run_json(200)  # warm caches and the allocator
    gc.collect()
    clock = time.thread_time_ns  # CPU time: preemption by other work is not counted
    for _ in range(batches):
        for name, run in (("decide", run_decide), ("json", run_json)):
            os.getppid()
            started = clock()
            run(iterations)
            elapsed = clock() - started
            os.getppid()
            print(name, elapsed / iterations / 1000, flush=True)
    """
)


def decision_child(args: list[str], wrapper: list[str] | None = None
                   ) -> subprocess.CompletedProcess[str]:
    baseline = os.environ.get(BASELINE_ENV)
    repo = str(Path(__file__).resolve().parent.parent)
    path = [baseline, repo] if baseline else [repo]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    # Run from elsewhere: `python -c` puts the current directory first on the path.
    return subprocess.run([*(wrapper or []), sys.executable, "-c", DECISION, *args],
                          env=env, capture_output=True, text=True, check=True,
                          cwd=tempfile.gettempdir())


def decision_timing(iterations: int, batches: int) -> list[list[str]]:
    out = decision_child([str(iterations), str(batches)]).stdout
    times: dict[str, list[float]] = {"decide": [], "json": []}
    for line in out.splitlines():
        name, value = line.split()
        times[name].append(float(value))
    ratios = [d / j for d, j in zip(times["decide"], times["json"], strict=True)]
    return [
        ["decide (4 containers, parsed review)", f"{median(times['decide']):.1f}", ""],
        ["orjson loads + dumps of the same review", f"{median(times['json']):.1f}", ""],
        ["**decide ÷ orjson**", f"**{median(ratios):.2f}**",
         f"{min(ratios):.2f}-{max(ratios):.2f}"],
    ]


def callgrind_totals(outfile_prefix: Path) -> list[int]:
    """Instruction totals of each dump part, in order."""
    parts = []
    for path in sorted(outfile_prefix.parent.glob(outfile_prefix.name + "*"),
                       key=lambda p: int(p.name.rsplit(".", 1)[1]) if "." in p.name else 0):
        match = re.search(r"^summary:\s*(\d+)", path.read_text(), re.MULTILINE)
        if match:
            parts.append(int(match.group(1)))
    return parts


def valgrind(out: Path, *options: str) -> list[str]:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p",
            "--dump-instr=no", *options]


def decision_callgrind(iterations: int) -> list[list[str]]:
    directory = Path(tempfile.mkdtemp(prefix="swapwise-callgrind-"))
    out = directory / "decision"
    decision_child([str(iterations), "1"],
                   valgrind(out, "--dump-before=getppid"))
    # parts: startup | decide loop | between | json loop | rest
    totals = callgrind_totals(out)
    decide_i, json_i = totals[1] / iterations, totals[3] / iterations
    shutil.rmtree(directory, ignore_errors=True)
    return [["decide, instructions", f"{decide_i:,.0f}"],
            ["orjson loads + dumps, instructions", f"{json_i:,.0f}"],
            ["**decide ÷ orjson (instructions)**", f"**{decide_i / json_i:.2f}**"]]


def client_admissions(url: str, ca: Path, body: bytes, count: int, connections: int) -> None:
    """``count`` admissions over ``connections`` keep-alive connections, round robin."""
    context = ssl.create_default_context(cafile=str(ca))
    host, port = url.removeprefix("https://").split(":")
    request = request_bytes(body)
    conns = [context.wrap_socket(socket.create_connection((host, int(port)), timeout=120),
                                 server_hostname="localhost") for _ in range(connections)]
    try:
        for i in range(count):
            conn = conns[i % connections]
            conn.sendall(request)
            reply = b""
            while b"\r\n\r\n" not in reply:
                reply += conn.recv(65536)
            head, _, rest = reply.partition(b"\r\n\r\n")
            length = int(re.search(rb"content-length: *(\d+)", head.lower()).group(1))  # type: ignore[union-attr]
            while len(rest) < length:
                rest += conn.recv(65536)
            if not head.startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"unexpected answer: {head!r}")
    finally:
        for conn in conns:
            conn.close()


def dump(pid: int) -> None:
    subprocess.run(["callgrind_control", "--dump", str(pid)], check=True,
                   capture_output=True)


def server_callgrind(admissions: int, connections: int, compare: list[str]
                     ) -> list[list[str]]:
    """Instructions per admission of each server under valgrind, over ``admissions``."""
    body = review_bytes(4)
    directory = Path(tempfile.mkdtemp(prefix="swapwise-callgrind-"))
    rows = []
    per: dict[str, float] = {}
    workdir = Path(tempfile.mkdtemp(prefix="swapwise-bench-"))
    certs = ServerProcess(workdir / "certs", None)  # only for its certificate mount
    sources = {"swapwise": os.environ.get(BASELINE_ENV)}
    for source in compare:
        sources[f"swapwise from {source}"] = source
    for name in [*sources, "floor"]:
        out = directory / str(len(per))
        wrapper = valgrind(out)
        if name == "floor":
            floor = Floor(certs.tls.root, wrapper)
            url, pid, stop = floor.url, floor.process.pid, floor.stop
        else:
            server = start_server_wrapped(workdir / str(len(per)), wrapper, sources[name])
            url, pid, stop = server.url, pid_of(server), server.stop
        try:
            ca = certs.ca_file() if name == "floor" else server.ca_file()
            client_admissions(url, ca, body, 200, connections)  # warm up
            dump(pid)
            client_admissions(url, ca, body, admissions, connections)
            dump(pid)
        finally:
            stop()
        totals = callgrind_totals(out)
        # parts: startup + warm-up | measured | shutdown
        per[name] = totals[1] / admissions
        rows.append([f"{name}, instructions per admission", f"{per[name]:,.0f}"])
    for name in sources:
        rows.append([f"**{name} ÷ floor (instructions)**",
                     f"**{per[name] / per['floor']:.2f}**"])
    for source in compare:
        rows.append([f"swapwise ÷ swapwise from {source} (instructions)",
                     f"{per['swapwise'] / per[f'swapwise from {source}']:.2f}"])
    shutil.rmtree(directory, ignore_errors=True)
    return rows


def start_server_wrapped(workdir: Path, wrapper: list[str], source: str | None
                         ) -> ServerProcess:
    """``swapwise serve`` under ``wrapper`` (valgrind), from ``source`` if given."""
    from testkit.payloads import POLICY_YAML

    server = ServerProcess(workdir, POLICY_YAML)
    path = f"sys.path.insert(0, {source!r}); " if source else ""
    launcher = f"import sys; {path}from webhook.cli import main; sys.exit(main())"
    server.args[0:1] = [*wrapper, sys.executable, "-c", launcher]
    return server.start(timeout=300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each server")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--server-args", default="",
                        help="extra `swapwise serve` options, e.g. '--log-level warning'")
    parser.add_argument("--callgrind", action="store_true",
                        help="also count instructions under valgrind (a few minutes)")
    parser.add_argument("--compare", metavar="DIR", action="append", default=[],
                        help="also measure the server of another source tree, in the same "
                             "run (a tree as for SWAPWISE_BENCH_SRC); repeatable")
    parser.add_argument("--skip-server", action="store_true")
    parser.add_argument("--skip-decision", action="store_true")
    args = parser.parse_args()
    print(machine())
    if not args.skip_server:
        body = Path(tempfile.mkdtemp(prefix="swapwise-bench-")) / "review.json"
        body.write_bytes(review_bytes(4))
        report(f"Server CPU per admission, 4-container pod, {args.connections} keep-alive "
               f"HTTPS connections, server on CPU {SERVER_CPU}, wrk on CPU {LOAD_CPU}, "
               f"{args.rounds} x {args.duration:g} s each",
               server_cpu(args, body),
               ["server", "µs CPU/admission (median)", "range", "admissions/s", "loadavg"])
    if not args.skip_decision:
        report("Decision function (µs of CPU per call; ratio per batch, median of 15)",
               decision_timing(2000, 15), ["", "median µs", "range"])
    if args.callgrind and not args.skip_decision:
        report("Decision function under callgrind (per call)",
               decision_callgrind(300), ["", "value"])
        report(f"Servers under callgrind (per admission, {args.connections} connections)",
               server_callgrind(1000, args.connections, args.compare), ["", "value"])
    print(machine())


if __name__ == "__main__":
    main()

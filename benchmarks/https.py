"""Throughput and latency over HTTPS against a real ``swapwise serve``.

    python -m benchmarks.https [--duration 10] [--connections 1,8,32,128] [--workers 1,2]
                               [--rate 2000 --rate-connections 32]

Two load shapes, both over keep-alive TLS connections:

- closed loop, by wrk (``apt-get install wrk``): each connection sends its next request
  as soon as the previous answer arrives, so "admissions/s" is the capacity at that
  concurrency, and latency is what queueing at saturation costs (conns / throughput);
- fixed rate, by h2load (``apt-get install nghttp2-client``): ``--rate`` admissions/s
  spread over ``--rate-connections`` connections at independent phases, the shape of a
  busy API server; its p99 is the latency a pod creation pays at that load.

The load generators run on the same 2-core machine as the server: with 2 workers they
compete with the workers for the CPU, which the figures include.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import machine, percentile, report
from testkit.payloads import ADMISSION_PATH, HEADERS, POLICY_YAML, review_bytes
from testkit.server_proc import ServerProcess

LUA = Path(__file__).with_name("wrk.lua")


def wrk(url: str, body: Path, connections: int, seconds: float, threads: int
        ) -> dict[str, Any]:
    """Run wrk once; its Lua script prints one JSON summary line."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install wrk")
    env = {**os.environ, "WRK_BODY": str(body)}
    argv = ["wrk", f"-t{min(threads, connections)}", f"-c{connections}",
            f"-d{max(1, round(seconds))}s", "--timeout", "10s", "-s", str(LUA), url]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith("WRKJSON "):
            result: dict[str, Any] = json.loads(line[len("WRKJSON "):])
            return result
    raise RuntimeError(f"no summary from wrk:\n{out}")


def h2load(url: str, body: Path, connections: int, rate: int, seconds: float
           ) -> dict[str, Any]:
    """Fixed-rate load: one h2load process per connection, at random phases.

    A single h2load with ``-c N --rps R`` fires all N connections in the same instant
    every 1/R s, a synchronized burst no API server produces; separate processes started
    at random offsets within one period spread the arrivals as independent clients do.
    """
    if shutil.which("h2load") is None:
        raise SystemExit("h2load is not installed: apt-get install nghttp2-client")
    per_connection = rate / connections
    logs = [body.with_name(f"h2load-{os.getpid()}-{time.monotonic_ns()}-{i}.tsv")
            for i in range(connections)]
    processes = []
    for log in logs:
        argv = ["h2load", "--h1", "-c", "1", "-t", "1", "--rps", f"{per_connection:g}",
                "-D", str(max(1, round(seconds))), "--warm-up-time", "1", "-d", str(body),
                *(arg for name, value in HEADERS for arg in ("-H", f"{name}: {value}")),
                "--log-file", str(log), url]
        processes.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True))
        time.sleep(random.uniform(0, 2 / per_connection / connections))
    summaries = [process.communicate()[0] for process in processes]
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    crashed = sum(process.returncode != 0 for process in processes)
    for log in logs:
        for line in log.read_text().splitlines():
            _start, status, micros = line.split("\t")[:3]
            if status != "200":
                statuses[status] = statuses.get(status, 0) + 1
            latencies.append(int(micros))
        log.unlink()
    latencies.sort()
    failed = [line for out in summaries for line in out.splitlines()
              if line.startswith("requests:") and " 0 failed, 0 errored, 0 timeout" not in line]
    details = [f"status {status} x{count}" for status, count in statuses.items()]
    details += failed + ([f"{crashed} h2load processes failed"] if crashed else [])
    return {"requests": len(latencies), "duration_us": seconds * 1e6,
            "errors": sum(statuses.values()) + len(failed) + crashed,
            "p50": percentile(latencies, 50), "p99": percentile(latencies, 99),
            "p999": percentile(latencies, 99.9), "max": latencies[-1] if latencies else 0,
            "summary": "; ".join(details) or "h2load: no failed requests"}


BASELINE_ENV = "SWAPWISE_BENCH_SRC"


def start_server(workdir: Path, workers: int, *extra: str) -> ServerProcess:
    """``swapwise serve``, its log lines going into a pipe read by this process (as a
    container runtime reads them); with $SWAPWISE_BENCH_SRC, the one from that source tree.

    The baseline mode measures an older checkout (``git archive <rev> webhook | tar -x``)
    for before/after figures; it only passes options every version has.
    """
    baseline = os.environ.get(BASELINE_ENV)
    if baseline:
        server = ServerProcess(workdir, POLICY_YAML)
        launcher = (f"import sys; sys.path.insert(0, {baseline!r}); "
                    "from webhook.cli import main; sys.exit(main())")
        server.args[0:1] = [sys.executable, "-c", launcher]
    else:
        server = ServerProcess(workdir, POLICY_YAML, "--workers", str(workers),
                               "--drain-seconds", "0", *extra)
    server.pipe_logs = True  # log lines into a pipe, as in a container
    return server.start()


def row(workers: int, connections: int, r: dict[str, Any], shape: str = "closed") -> list[str]:
    seconds = r["duration_us"] / 1e6
    errors = r.get("errors", 0) + sum(
        r.get(k, 0) for k in ("connect", "read", "write", "status", "timeout"))
    return [str(workers), shape, str(connections), f"{r['requests'] / seconds:,.0f}",
            f"{r['p50'] / 1000:.2f}", f"{r['p99'] / 1000:.2f}", f"{r['p999'] / 1000:.2f}",
            f"{r['max'] / 1000:.1f}", str(errors), f"{os.getloadavg()[0]:.2f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--connections", default="1,8,32,128")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--containers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="wrk threads")
    parser.add_argument("--rate", type=int, default=2000, help="fixed-rate run; 0 skips it")
    parser.add_argument("--rate-connections", type=int, default=32)
    parser.add_argument("--server-args", default="",
                        help="extra `swapwise serve` options, e.g. '--log-level warning'")
    args = parser.parse_args()
    body = Path(tempfile.mkdtemp(prefix="swapwise-bench-")) / "review.json"
    body.write_bytes(review_bytes(args.containers))
    rows = []
    print(machine())
    for workers in [int(w) for w in args.workers.split(",")]:
        server = start_server(Path(tempfile.mkdtemp(prefix="swapwise-bench-")), workers,
                              *args.server_args.split())
        try:
            url = server.url + ADMISSION_PATH
            wrk(url, body, 8, 2, args.threads)  # warm up
            for connections in [int(c) for c in args.connections.split(",")]:
                time.sleep(1)
                result = wrk(url, body, connections, args.duration, args.threads)
                rows.append(row(workers, connections, result))
                print("  ", rows[-1], flush=True)
            if args.rate:
                time.sleep(1)
                result = h2load(url, body, args.rate_connections, args.rate, args.duration)
                rows.append(row(workers, args.rate_connections, result,
                                f"{args.rate}/s"))
                print("  ", rows[-1], result["summary"], flush=True)
        finally:
            server.stop()
    report(f"HTTPS, {args.containers}-container pod, {args.duration:g} s per run (ms)", rows,
           ["workers", "load", "conns", "admissions/s", "p50", "p99", "p99.9", "max", "errors",
            "loadavg"])


if __name__ == "__main__":
    main()

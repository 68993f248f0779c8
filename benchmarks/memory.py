"""Memory: RSS of ``swapwise serve`` after 1k and after 200k admissions over HTTPS.

    python -m benchmarks.memory [--total 200000] [--workers 1]

Growth between the two points is what a leak would look like; the first 1k admissions
include the one-off cost of warm caches and allocator arenas.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import machine, report
from benchmarks.https import start_server, wrk
from testkit.payloads import ADMISSION_PATH, HEADERS, review_bytes
from testkit.server_proc import ServerProcess


def rss_kib(pid: int) -> int:
    """Resident set of a process and its children (the workers), KiB."""
    total = 0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    for p in pids:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def measure(server: ServerProcess, start: int, quiet: bool = False) -> list[Any]:
    admitted = server.metric("swapwise_admission_requests_total",
                             profile="sandbox", outcome="mutated")
    assert server.process is not None
    rss = rss_kib(server.process.pid)
    row = [admitted, f"{rss / 1024:.1f}", f"{(rss - start) / 1024:+.1f}"]
    if not quiet:
        print("  ", row, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--total", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    body = Path(tempfile.mkdtemp(prefix="swapwise-bench-")) / "review.json"
    body.write_bytes(review_bytes(4))
    server = start_server(Path(tempfile.mkdtemp(prefix="swapwise-bench-")), args.workers)
    assert server.process is not None
    url = server.url + ADMISSION_PATH
    rows = []
    curve: list[list[Any]] = []
    try:
        start = rss_kib(server.process.pid)
        rows.append(["0 (ready)", f"{start / 1024:.1f}", "-"])
        with server.client() as client:  # the first 1k one by one, to stop exactly there
            content = body.read_bytes()
            for _ in range(1_000):
                client.post(ADMISSION_PATH, content=content,
                            headers=dict(HEADERS)).raise_for_status()
        rows.append(measure(server, start))
        # wrk stops on time, not on count: run it in 10 s rounds and show the curve, so a
        # leak (steady growth) can be told from warm-up (a step, then flat).
        while measure(server, start, quiet=True)[0] < args.total:
            wrk(url, body, args.connections, 10, 1)
            curve.append(measure(server, start, quiet=True))
        rows.append(list(curve[-1]))
    finally:
        server.stop()
    for r in rows[1:]:
        r[0] = f"{r[0]:,.0f}"
    print(machine())
    print("curve (admissions: RSS MiB): " + ", ".join(f"{n:,.0f}: {rss}" for n, rss, _ in curve))
    report(f"RSS of swapwise serve ({args.workers} worker(s), MiB)", rows,
           ["admissions", "RSS MiB", "vs ready"])


if __name__ == "__main__":
    main()

"""In-process latency: AdmissionReview bytes in, response bytes out, through the ASGI app.

    python -m benchmarks.inprocess [--iterations N]

No sockets, TLS or HTTP parsing: this is what the app (routing, body read, JSON parse,
decision, patch, serialization, metrics, the JSON log line) costs per admission.
"""

from __future__ import annotations

import argparse
import gc
import time

import uvloop

from benchmarks.common import build_app, machine, percentile, quiet_json_logs, report
from testkit.asgi import call
from testkit.payloads import ADMISSION_PATH, review_bytes


async def measure(app: object, body: bytes, iterations: int) -> list[float]:
    for _ in range(min(500, iterations)):  # warm caches and the allocator
        await call(app, "POST", ADMISSION_PATH, body)  # type: ignore[arg-type]
    samples: list[float] = []
    clock = time.perf_counter_ns
    for _ in range(iterations):
        started = clock()
        reply = await call(app, "POST", ADMISSION_PATH, body)  # type: ignore[arg-type]
        samples.append((clock() - started) / 1000)
        if reply.status != 200:
            raise SystemExit(f"unexpected status {reply.status}: {reply.body[:200]!r}")
    samples.sort()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--log-in-loop", action="store_true",
                        help="format and write log lines in the request path (the old way)")
    args = parser.parse_args()
    quiet_json_logs(in_loop=args.log_in_loop)
    app = build_app()
    rows = []
    for containers in (4, 60):
        body = review_bytes(containers)
        iterations = args.iterations if containers <= 4 else max(200, args.iterations // 5)
        gc.collect()
        samples = uvloop.run(measure(app, body, iterations))
        rows.append([f"{containers} containers", f"{len(body):,} B", str(iterations),
                     f"{percentile(samples, 50):.1f}", f"{percentile(samples, 99):.1f}",
                     f"{percentile(samples, 100):.1f}"])
    print(machine())
    report("In-process admission (µs)", rows,
           ["pod", "request", "n", "median µs", "p99 µs", "max µs"])


if __name__ == "__main__":
    main()

"""Every benchmark in turn: ``python -m benchmarks`` (what ``make bench`` runs).

Each runs in its own process so one's warm caches or leftover servers cannot flatter the
next. Needs wrk and h2load (``apt-get install wrk nghttp2-client``) for the HTTPS runs and
the control plane binaries (``make control-plane``) for the API-server run, which is
skipped with a message when they are missing.
"""

from __future__ import annotations

import subprocess
import sys

from tests.e2e.cluster import missing_binaries

STEPS = ["cpu", "inprocess", "https", "memory", "apiserver"]


def main() -> int:
    failed = []
    for step in STEPS:
        if step == "apiserver" and missing_binaries():
            print("\n(apiserver benchmark skipped: run `make control-plane` first)")
            continue
        print(f"\n=== benchmarks.{step}", flush=True)
        if subprocess.run([sys.executable, "-m", f"benchmarks.{step}", *sys.argv[1:]]
                          ).returncode != 0:
            failed.append(step)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared bits of the benchmarks: percentiles, machine facts, a policy file, the app."""

from __future__ import annotations

import logging
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

from testkit.payloads import POLICY_YAML


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


def machine() -> str:
    load = os.getloadavg()
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{platform.node()} · {os.cpu_count()} cores · {cpu} · Python "
            f"{platform.python_version()} · load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def policy_file() -> Path:
    directory = Path(tempfile.mkdtemp(prefix="swapwise-bench-"))
    path = directory / "policy.yaml"
    path.write_bytes(POLICY_YAML)
    return path


def quiet_json_logs(in_loop: bool = False) -> None:
    """Production logging (JSON lines, written by the log thread) to /dev/null.

    ``in_loop``: format and write each line on the event loop instead, as before
    webhook/server/asynclog.py, to show what that costs an admission.
    """
    from webhook.base.logs import configure
    from webhook.server import asynclog

    configure("info")
    devnull = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(devnull)
    if not in_loop:
        asynclog.start()


def build_app(policy: Path | None = None) -> Any:
    from webhook.server.app import AppState, create_app
    from webhook.server.metrics import Metrics
    from webhook.server.reload import PolicyStore

    metrics = Metrics()
    state = AppState(PolicyStore(policy or policy_file(), metrics), metrics, serving=True)
    return create_app(state)


def report(title: str, rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    sys.stdout.flush()

"""Benchmark: an idle sandbox's wake-up time at 1x, 2x and 3x, on disk swap and on zram
(``make node-bench``; issue 43).

Each cell packs as many idle sandboxes as its density lets the scheduler place (1x: not
opted in, no swap; 2x: ``swapRatio: 1``; 3x: ``swapRatio: 2``), waits until they
have allocated and their cold pages have gone to swap (their cgroups' own count), then wakes
them (tests/node/wakeup.py): ALONE of them one at a time (those with the most in swap: a
lone wake took up to a minute under the first matrix's 50m CPU limits, so every pod alone
would have taken a 3x cell past 20 minutes), a quarter of the others at once, then all at
once. The same cells run with the guest's swap on its disk and on a zram device of the same
size, at the same RAM. Pages are half filled with pseudo-random bytes, so zram compresses
them as real memory (about 2x), not as zeros. Ratios against 1x within the run are what a
user reads from it; the absolute times are the emulated guest's. Writes
build/node-bench/wakeup.json.

SWAPWISE_WAKEUP_CELLS picks cells (``disk.1x,disk.3x``; default: all six; a name that is no
cell fails the run); a cell's ratios need its device's 1x in the same run.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from tests.e2e.install import Installation
from tests.node.conftest import Agent
from tests.node.node import PressureLog, RealNode
from tests.node.scenarios import LIMIT_BYTES, RESULTS, Run, free_memory
from tests.node.wakeup import most_in_swap_first, wait_idle_in_swap, wake_round

pytestmark = [pytest.mark.node, pytest.mark.slow]

# An idle sandbox: 96 MiB allocated once, 4 MiB touched every 10 s (it waits for a prompt).
# No CPU limit, as the density runs (scenarios.DENSITY_SANDBOX says why): under 50m the
# pages a wake-up brings back were paid for from the pod's own quota, and the matrix of
# 2026-12-07 (f91f7f7) measured that quota as much as the swap.
IDLE: dict[str, Any] = {"cold_mib": 96, "hot_mib": 4, "tick": "10s", "fill": 0.5,
                        "cpu_limit": False}
DENSITIES = {"1x": None, "2x": "double", "3x": "sandbox"}  # profile (None: not opted in)
# On zram the same densities with swap backing off: the agent counts none of a zram device
# as backing (its default, docs/nodes.md), so the backed profiles would place no pod there.
ZRAM_PROFILES = {"double": "double-unbacked", "sandbox": "sandbox-unbacked"}
ALONE = 4
WAKE_PORTS = 23000


def cell(node: RealNode, log: PressureLog, density: str, profile: str | None,
         density_plan: dict[str, Any]) -> dict[str, Any]:
    request = LIMIT_BYTES if profile is None else \
        density_plan[profile]["containers"][0]["after"]["request"]
    count = free_memory(node) // request
    with Run(node, f"wake-{density}", profile, count, IDLE, listen_from=WAKE_PORTS) as run:
        run.wait_all_working(1800)
        pods = run.placed_pods()
        uids = [p["metadata"]["uid"] for p in pods]
        swapped = wait_idle_in_swap(node, uids, 600) if profile is not None else {}
        ports = [run.wake_port(p) for p in pods]
        result = wake_round(node, most_in_swap_first(uids, ports, swapped), log, alone=ALONE)
        result["swapped_out_bytes"] = sum(swapped.values())
        result["oom_kills"] = run.counts()["oom_kills"]
    return result


def test_wakeup_matrix(node: RealNode, swapwise: Installation, agent: Agent,
                       pressure_log: PressureLog, density_plan: dict[str, Any],
                       results: dict[str, Any]) -> None:
    matrix: dict[str, dict[str, Any]] = {}
    every = {f"{device}.{density}" for device in ("disk", "zram") for density in DENSITIES}
    chosen = os.environ.get("SWAPWISE_WAKEUP_CELLS", "")
    cells = {c.strip() for c in chosen.split(",") if c.strip()} or every
    assert cells <= every, f"SWAPWISE_WAKEUP_CELLS: no such cell {sorted(cells - every)}"
    for device in ("disk", "zram"):
        if not any(c.startswith(f"{device}.") for c in cells):
            continue
        if device == "zram":
            node.move_swap_to_zram(4096)
        try:
            for density, profile in DENSITIES.items():
                if f"{device}.{density}" not in cells:
                    continue
                if device == "zram" and profile is not None:
                    profile = ZRAM_PROFILES[profile]
                matrix[f"{device}.{density}"] = cell(node, pressure_log, density, profile,
                                                     density_plan)
        finally:
            if device == "zram":
                node.move_swap_to_disk()
    for key, got in matrix.items():
        device = key.split(".")[0]
        base = matrix.get(f"{device}.1x", {})
        for q in ("p50_ms", "p99_ms"):
            if got[q] is not None and base.get(q):
                got[f"{q}_vs_1x"] = round(got[q] / base[q], 2)
    out = RESULTS.parent / "wakeup.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(matrix, indent=1, sort_keys=True) + "\n")
    for key, got in matrix.items():
        results[f"wakeup_matrix.{key}"] = got
    assert all(got["answered"] == got["asked"] for got in matrix.values()), matrix

"""Benchmark: the control of swap backing on the real node (``make node-bench``).

``requestRatio: 0.1`` with backing off packs as many sandboxes as the density run with a swap
share far below their cold memory: ``plan`` says they do not fit, and the node shows what that
means (OOM kills or evictions). ``plan`` judges a container by its limit, so these sandboxes
hold a cold set near theirs (200 MiB of 256Mi): the density run's calm sandbox holds 96 MiB,
and 18 of those fit the node even with a 53 MiB swap share each (a run of 15 minutes on
2026-12-07 saw no OOM kill). What CI proves instead: with backing on, the scheduler refuses
those pods the node (test_real_node.py), and the agent marks a thrashing node (one pod,
seconds). Figures: ``aggressive.*``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.e2e.install import Installation
from tests.node.conftest import Agent
from tests.node.node import PressureLog, RealNode
from tests.node.scenarios import Run, free_memory

# Near the 256Mi limit, allocated at once (no CPU limit: the emulated guest fills in minutes).
FULL_SANDBOX: dict[str, Any] = {"cold_mib": 200, "cpu_limit": False}

pytestmark = [pytest.mark.node, pytest.mark.slow]


def test_unbacked_pods_overcommit_the_node(
    node: RealNode, swapwise: Installation, agent: Agent, pressure_log: PressureLog,
    density_plan: dict[str, Any], results: dict[str, Any],
) -> None:
    predicted = density_plan["unbacked"]["swapRatio"]["fits"]
    results["plan.predicted_fit.aggressive"] = predicted
    results["plan.per_node.aggressive"] = density_plan["unbacked"]["after"]["perNode"]
    assert predicted is False
    assert density_plan["unbacked"]["backing"]["applies"] is False
    count = free_memory(node) // density_plan["sandbox"]["containers"][0]["after"]["request"]
    start = time.monotonic()
    with Run(node, "density-aggressive", "unbacked", count, FULL_SANDBOX) as run:
        results["aggressive.placed"] = run.placed
        assert run.placed == count  # the scheduler sees room for all of them (and more)
        worst = run.observe(900, stop=lambda c: c["oom_kills"] + c["evictions"] > 0)
        results["aggressive.oom_kills"] = worst["oom_kills"]
        results["aggressive.evictions"] = worst["evictions"]
        results["aggressive.max_some_avg10"] = pressure_log.max_some(start)
    assert worst["oom_kills"] + worst["evictions"] > 0, worst

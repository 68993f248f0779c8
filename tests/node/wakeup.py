"""What the user of a sandbox feels: how long an idle sandbox takes to answer once woken.

An agent sandbox bursts to its working set, idles while it waits for a prompt, and its cold
pages go to swap. A *wake-up* is a request that touches its whole working set and answers
(the workload's ``GET /wake``: every page of its cold and hot sets written once). A round
wakes the pods of a run one at a time, then a quarter of them at once, then all of them at
once, and records each answer's time, the pages the node swapped in meanwhile (the guest's
``pswpin``) and the node's memory and CPU pressure (PSI) while it lasted.

The guest is emulated: absolute times are not what a user sees; ratios within one run are
(BENCHMARKS.md, "Wake-up latency"). CI runs one round at swapwise's density and asserts only
that every pod answered; ``make node-bench`` runs the matrix (bench/test_wakeup.py).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.node.node import GUEST_IP, PressureLog, RealNode

PAGE = 4096
WAKE_TIMEOUT = 600.0  # one answer; a thrashing emulated node pages slowly


def wake(port: int, timeout: float = WAKE_TIMEOUT) -> float | None:
    """One wake-up of the sandbox on the node's ``port``: the time to its answer in ms, or
    None when it did not answer."""
    start = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://{GUEST_IP}:{port}/wake", timeout=timeout) as r:
            json.loads(r.read())
    except (OSError, ValueError):
        return None
    return (time.monotonic() - start) * 1000


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0-1), nearest rank; None of nothing."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def swapped_out(node: RealNode, uids: list[str]) -> dict[str, int]:
    """Each pod's memory.swap.current (bytes), from its container cgroups in the guest."""
    cgroups = node.fresh_status()["cgroups"]
    return {uid: sum(int(files["memory.swap.current"]) for path, files in cgroups.items()
                     if f"/pod{uid}/" in f"/{path}" and files["memory.max"] != "max")
            for uid in uids}


def wait_idle_in_swap(node: RealNode, uids: list[str], timeout: float) -> dict[str, int]:
    """Wait until every pod has pages in swap (its cgroup's own count, not a timer), or the
    deadline; the counts seen last (a pod whose pages all stayed in RAM shows 0)."""
    seen: dict[str, int] = {}

    def all_out() -> bool:
        seen.update(swapped_out(node, uids))
        return all(seen.get(uid, 0) > 0 for uid in uids)

    # Past the deadline, recorded as it is: CI asserts only that every pod answers.
    with contextlib.suppress(TimeoutError):
        node.wait_for(all_out, timeout, interval=5, what="every sandbox's cold pages in swap")
    return seen


def most_in_swap_first(uids: list[str], ports: list[int], swapped: dict[str, int]
                       ) -> list[int]:
    """The ``ports`` of the pods ``uids`` (in the same order), those with the most bytes in
    swap first: those are the ones that wake slowly, so a round that wakes only a few
    alone wakes them."""
    return [port for _, port in sorted(zip((-swapped.get(uid, 0) for uid in uids), ports,
                                           strict=True))]


def wake_round(node: RealNode, ports: list[int], log: PressureLog,
               alone: int | None = None, everyone: bool = True) -> dict[str, Any]:
    """Wake ``ports`` one at a time (the first ``alone`` of them; all by default), then a
    quarter of them at once (with ``alone``, a quarter not woken yet: a woken sandbox's
    pages are back in RAM), then (``everyone``) all of them at once.

    CI's round (test_real_node.py) wakes two alone and a quarter of the others together:
    on the emulated node one sandbox takes up to a minute to page its working set back in,
    and every wave would take the suite past its budget; ``make node-bench`` wakes four
    alone, a quarter of the others, and then all of them at once."""
    quarter = max(1, len(ports) // 4)
    first = 0 if alone is None or alone + quarter > len(ports) else alone
    waves = {"one_at_a_time": [[p] for p in ports[:alone]],
             "quarter": [ports[first:first + quarter]]}
    if everyone:
        waves["all"] = [ports]
    out: dict[str, Any] = {}
    times: list[float] = []
    answered = asked = 0
    start = time.monotonic()
    pswpin = int(node.fresh_status()["vmstat"]["pswpin"])
    for name, groups in waves.items():
        wave_start = time.monotonic()
        got: list[float | None] = []
        for group in groups:
            with ThreadPoolExecutor(len(group)) as pool:
                got += list(pool.map(wake, group))
        ms = [t for t in got if t is not None]
        asked += len(got)
        answered += len(ms)
        times += ms
        samples = log.since(wave_start)
        out[name] = {"pods": len(got), "answered": len(ms),
                     "p50_ms": _round(percentile(ms, 0.5)),
                     "p99_ms": _round(percentile(ms, 0.99)), "max_ms": _round(max(ms, default=0)),
                     "max_memory_some_avg10": max((s.some for s in samples), default=0.0),
                     "max_cpu_some_avg10": max((s.cpu or 0.0 for s in samples), default=0.0)}
    samples = log.since(start)
    out.update({
        "pods": len(ports), "asked": asked, "answered": answered,
        "p50_ms": _round(percentile(times, 0.5)), "p99_ms": _round(percentile(times, 0.99)),
        "max_ms": _round(max(times, default=0)),
        "swapped_in_bytes": (int(node.fresh_status()["vmstat"]["pswpin"]) - pswpin) * PAGE,
        "max_memory_some_avg10": max((s.some for s in samples), default=0.0),
        "max_cpu_some_avg10": max((s.cpu or 0.0 for s in samples), default=0.0),
    })
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)

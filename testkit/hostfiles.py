"""A node's kernel files as the node agent reads them (``--host-proc``, ``--host-sys``,
``--host-cgroup``), written by a test: the unit tests set the PSI counters second by second,
the e2e tests let them advance at a stall share (tests/e2e/agent.py)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

KIB = 1024


class HostFiles:
    """A host's kernel files under ``root`` (``proc/swaps``, ``proc/pressure/*``, the
    kubepods cgroup's pressure files, zswap's parameter), written whole (a rename), so the
    agent never reads half a file; each PSI counter is set exactly."""

    def __init__(self, root: Path, kubepods: str = "kubepods.slice") -> None:
        self.root = root
        self.proc = root / "proc"
        self.sys = root / "sys"
        self.cgroup = root / "cgroup"
        self.kubepods = self.cgroup / kubepods
        for d in (self.proc / "pressure", self.sys / "module" / "zswap" / "parameters",
                  self.kubepods):
            d.mkdir(parents=True, exist_ok=True)
        self.totals = {"memory": 0, "cpu": 0}
        self.avg10 = {"memory": 0.0, "cpu": 0.0}
        self.swaps([])
        self.zswap(False)
        for resource in self.totals:
            self.psi(resource, 0)

    @staticmethod
    def put(path: Path, text: str) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    def swaps(self, devices: Sequence[tuple[str, int]]) -> None:
        """``(path, bytes)`` per device; ``/dev/`` paths are partitions."""
        lines = ["Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority"]
        for index, (path, size) in enumerate(devices):
            kind = "partition" if path.startswith("/dev/") else "file"
            lines.append(f"{path}\t{kind}\t{size // KIB}\t0\t{-2 - index}")
        self.put(self.proc / "swaps", "\n".join(lines) + "\n")

    def zswap(self, on: bool) -> None:
        self.put(self.sys / "module" / "zswap" / "parameters" / "enabled", "Y\n" if on else "N\n")

    def psi(self, resource: str, total_us: int, avg10: float | None = None) -> None:
        """The counter at ``total_us``; ``avg10`` (kept until set again) is only shown."""
        self.totals[resource] = total_us
        if avg10 is not None:
            self.avg10[resource] = avg10
        avg10 = self.avg10[resource]
        text = (f"some avg10={avg10:.2f} avg60=0.00 avg300=0.00 total={total_us}\n"
                "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
        self.put(self.proc / "pressure" / resource, text)
        self.put(self.kubepods / f"{resource}.pressure", text)

    def add_stall(self, resource: str, seconds: float) -> None:
        """The counter rises by ``seconds`` of stall."""
        self.psi(resource, self.totals[resource] + int(seconds * 1e6))

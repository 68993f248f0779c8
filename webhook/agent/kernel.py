"""What the node's kernel says, read from its files: swap devices and pressure stall figures.

The agent runs in a pod, so the host's files are where the chart mounts them (``HostPaths``):
``/proc/swaps`` and ``/proc/pressure/*`` are not namespaced, the ``kubepods`` cgroup is read
through the host's cgroup2 mount. Parsers are pure (text in, figures out), so every shape a
kernel writes is a unit test; the readers around them are a line each.
"""

from __future__ import annotations

import errno
import os
import re
import select
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

SwapKind = Literal["disk", "zram"]
Resource = Literal["memory", "cpu"]

_ZRAM = re.compile(r"zram[0-9]+")
_PSI_FIELD = re.compile(r"(avg10|avg60|avg300|total)=([0-9]+(?:\.[0-9]+)?)")


class KernelReadError(OSError):
    """A kernel file that is missing or does not read as the kernel writes it."""


@dataclass(frozen=True)
class SwapDevice:
    """One line of ``/proc/swaps``."""

    path: str
    kind: SwapKind
    size: int  # bytes
    used: int  # bytes


@dataclass(frozen=True)
class SwapFacts:
    devices: tuple[SwapDevice, ...] = ()
    zswap: bool = False  # zswap compresses pages on their way to a disk device: still disk

    def total(self, kind: SwapKind | None = None) -> int:
        return sum(d.size for d in self.devices if kind is None or d.kind == kind)

    @property
    def kind(self) -> str | None:
        """``disk``, ``zram``, ``mixed``, or None without swap."""
        kinds = {d.kind for d in self.devices}
        if not kinds:
            return None
        return kinds.pop() if len(kinds) == 1 else "mixed"


def parse_swaps(text: str) -> tuple[SwapDevice, ...]:
    """``/proc/swaps``: a header, then ``Filename Type Size Used Priority`` (sizes in KiB).

    A zram device is told by its name (``/dev/zramN``): its pages live in RAM, compressed,
    whatever ``Type`` says (``partition``). Files and other partitions are disk.
    """
    lines = text.splitlines()
    if not lines or not lines[0].startswith("Filename"):
        raise KernelReadError(errno.EINVAL, "/proc/swaps has no header line")
    devices = []
    for line in lines[1:]:
        if not line.strip():
            continue
        # A path with spaces is written with \040: split on whitespace is safe.
        parts = line.split()
        if len(parts) < 4 or not parts[2].isdigit() or not parts[3].isdigit():
            raise KernelReadError(errno.EINVAL, f"/proc/swaps line {line[:80]!r} unreadable")
        path = parts[0]
        kind: SwapKind = "zram" if _ZRAM.fullmatch(os.path.basename(path)) else "disk"
        devices.append(SwapDevice(path, kind, int(parts[2]) * 1024, int(parts[3]) * 1024))
    return tuple(devices)


@dataclass(frozen=True)
class Psi:
    """One PSI file: the ``some`` line (and ``full``, where the kernel writes one)."""

    some_avg10: float
    some_total: int  # microseconds stalled since boot
    full_avg10: float | None = None
    full_total: int | None = None


def parse_psi(text: str) -> Psi:
    """``some avg10=1.23 avg60=0.50 avg300=0.10 total=123456`` (and a ``full`` line)."""
    found: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind in ("some", "full"):
            found[kind] = dict(_PSI_FIELD.findall(rest))
    some = found.get("some", {})
    if "avg10" not in some or "total" not in some:
        raise KernelReadError(errno.EINVAL, f"PSI text {text[:80]!r} has no some line")
    full = found.get("full", {})
    has_full = "avg10" in full and "total" in full
    return Psi(float(some["avg10"]), int(float(some["total"])),
               float(full["avg10"]) if has_full else None,
               int(float(full["total"])) if has_full else None)


@dataclass(frozen=True)
class HostPaths:
    """Where the host's files are seen from the agent (the chart mounts them read-only)."""

    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    cgroup: Path = Path("/sys/fs/cgroup")
    # The pods' parent cgroup under ``cgroup``: ``kubepods.slice`` (systemd driver) or
    # ``kubepods`` (cgroupfs driver); None: whichever exists.
    kubepods: str | None = None
    candidates: tuple[str, ...] = field(default=("kubepods.slice", "kubepods"))

    def pressure(self, resource: Resource) -> Path:
        return self.proc / "pressure" / resource

    def kubepods_pressure(self, resource: Resource) -> Path | None:
        names = (self.kubepods,) if self.kubepods else self.candidates
        for name in names:
            path = self.cgroup / name / f"{resource}.pressure"
            if path.is_file():
                return path
        return None


def _read(path: Path, limit: int = 1 << 16) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("ascii", "replace")
    except OSError as exc:
        raise KernelReadError(exc.errno or errno.EIO, f"{path}: {exc.strerror or exc}") from exc


def read_swap(paths: HostPaths) -> SwapFacts:
    devices = parse_swaps(_read(paths.proc / "swaps", 1 << 20))
    try:
        zswap = _read(paths.sys / "module" / "zswap" / "parameters" / "enabled").strip() == "Y"
    except KernelReadError:
        zswap = False  # no zswap module: not compiled in
    return SwapFacts(devices, zswap)


def read_psi(path: Path) -> Psi:
    return parse_psi(_read(path))


class PsiTrigger:
    """A kernel PSI trigger: the kernel wakes ``poll()`` when the stall within ``window_us``
    exceeds ``stall_us`` (Documentation/accounting/psi.rst). Lets an idle agent sleep.

    Creating one needs CAP_SYS_RESOURCE on kernels before 6.5; from 6.5 anyone may, for a
    window that is a multiple of 2 s. Where the kernel refuses, :meth:`open` raises and the
    agent reads the files once a second instead.
    """

    def __init__(self, path: Path, stall_us: int, window_us: int) -> None:
        self.path = path
        self.spec = f"some {stall_us} {window_us}"
        self.fd = -1

    def open(self) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)
        try:
            if os.fstat(fd).st_size != 0:  # a kernel file reads as size 0; never write a copy
                raise OSError(errno.EINVAL, f"{self.path} is not a kernel PSI file")
            os.write(fd, self.spec.encode() + b"\0")
        except OSError:
            os.close(fd)
            raise
        self.fd = fd
        return fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def wait_for_triggers(triggers: list[PsiTrigger], timeout: float,
                      wake_fd: int | None = None) -> list[PsiTrigger]:
    """Block until a trigger fires, ``wake_fd`` is readable or ``timeout`` seconds pass; the
    triggers that fired."""
    poller = select.poll()
    by_fd = {t.fd: t for t in triggers if t.fd >= 0}
    for fd in by_fd:
        poller.register(fd, select.POLLPRI)
    if wake_fd is not None:
        poller.register(wake_fd, select.POLLIN)
    events = poller.poll(max(timeout, 0.0) * 1000)
    return [by_fd[fd] for fd, mask in events if mask & select.POLLPRI and fd in by_fd]

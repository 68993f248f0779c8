"""The pressure guard's decision, pure: memory PSI readings of a swap node in, mark or clear out.

A swap node thrashes when the hot memory of its pods outgrows its RAM: every task stalls on
swap-in, and the kubelet does nothing (its eviction signal, ``memory.available``, ignores
swap). The kernel measures the stall as pressure stall information (PSI): the share of wall
time in which some (``some``) or all (``full``) non-idle tasks waited for memory, averaged
over 10 s (``avg10``, in percent). The kubelet reports the node's in its Summary API
(``node.memory.psi``, feature ``KubeletPSI``, beta and on by default since 1.34).

Hysteresis, so a node does not flap:

- **mark** when ``some.avg10 >= mark_above`` on every read for at least ``mark_after``
  seconds (from the first such read to the current one);
- **clear** when ``some.avg10 < clear_below`` on every read for at least ``clear_after``
  seconds;
- in between (a read between the two thresholds, or a window not yet long enough) the state
  is kept; a read that breaks a run starts that window again.

Missing data (a failed read, a Summary without memory PSI, garbage) is no evidence either
way: it changes neither the state nor a window. A window survives one missed read; two missed
reads in a row are a blind stretch. What counts is reads missed, not time: a kubelet that
answers slowly (a thrashing node's may take many seconds) still gives evidence with every
answer, and one read per node is in flight at a time, so slow answers space the reads out.

The kernel's counter covers what the reads miss. With every avg10 the Summary carries the
cumulative stall time (``total``, microseconds) and the time the kubelet sampled it
(``node.memory.time``), so two good reads give the exact share of the time between them that
was stalled, however far apart they are. A read whose avg10 is on one side of a threshold and
whose share since the previous good read is on the same side carries its run back to that
read: the run started there, or, across a blind stretch, goes on. The kernel's ``avg60`` is
proof of the last minute the same way (an exponential average: it reaches 60 % only after
about 55 s of a node stalled all the time). A blind stretch without proof (no counter, a
counter that went back, a sample not newer than the last) starts both windows again at the
next good read, so a node is never marked or cleared on evidence with a hole in it. Why it
matters: a thrashing node's kubelet answers few reads in time (its Summary waits on the
container runtime, which thrashes with the pods), and a guard that needed a window of
answered reads marked minutes late on the real node (docs/nodes.md).

The state of a node the guard has not read yet is the mark it carries (so a new leader, or
a restarted labeller, keeps a mark until the clear window has passed).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from webhook.engine.pressure import MARK_FORMS, MarkForm

# The defaults, from the real-node run (tests/node, docs/nodes.md "Memory pressure"): the calm
# density run peaked at some avg10 46 % while its pods started, the overcommitted one reached
# 98 % and stayed high; 60 % for 60 s marks the second and not the first. The CLI
# flags, the chart (which passes only what is set) and the docs all take them from here.
DEFAULT_INTERVAL = 10.0  # seconds between reads of each swap node
DEFAULT_MARK_ABOVE = 60.0  # percent, some avg10
DEFAULT_CLEAR_BELOW = 10.0  # percent, some avg10
DEFAULT_MARK_AFTER = 60.0  # seconds
DEFAULT_CLEAR_AFTER = 120.0  # seconds
MISSED_READS = 2  # failed reads in a row that restart both windows
AVG60_SECONDS = 60.0  # what the kernel's avg60 averages over (exponentially)


class SummaryError(ValueError):
    """A kubelet Summary that does not carry the node's memory PSI in the kubelet's shape."""


@dataclass(frozen=True)
class PSI:
    """A node's memory pressure: ``some`` and ``full`` avg10, in percent (0-100); the
    cumulative ``some`` stall (microseconds), when it was sampled (POSIX seconds, the
    node's clock) and ``some`` avg60, where the Summary has them."""

    some: float
    full: float
    some_total: int | None = None
    sampled: float | None = None
    some_avg60: float | None = None

    def text(self) -> str:
        return f"some avg10 {self.some:.1f}%, full avg10 {self.full:.1f}%"


def _average(psi: Mapping[str, Any], kind: str, field: str = "avg10") -> float:
    data = psi.get(kind)
    if not isinstance(data, Mapping):
        raise SummaryError(f"node.memory.psi.{kind} is missing or not an object")
    value = data.get(field)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SummaryError(f"node.memory.psi.{kind}.{field} is not a number: "
                           f"{str(value)[:40]!r}")
    if not math.isfinite(value) or not 0 <= value <= 100:
        raise SummaryError(f"node.memory.psi.{kind}.{field} {value!r} is not a percentage")
    return float(value)


def summary_memory_psi(payload: Any, node: str) -> PSI:
    """``node.memory.psi.{some,full}.avg10`` of a kubelet Summary (``/stats/summary``).

    Anything else raises :class:`SummaryError`: a Summary for another node, one without
    memory PSI (the kubelet's ``KubeletPSI`` feature off, or a kernel without PSI: booted
    with ``psi=0`` or built without ``CONFIG_PSI``), or values that are not percentages.
    """
    if not isinstance(payload, Mapping):
        raise SummaryError(f"the Summary is a JSON {type(payload).__name__}, not an object")
    stats = payload.get("node")
    if not isinstance(stats, Mapping):
        raise SummaryError("the Summary has no node object")
    reported = stats.get("nodeName")
    if isinstance(reported, str) and reported and reported != node:
        raise SummaryError(f"the Summary is for node {reported[:63]!r}, not {node!r}")
    memory = stats.get("memory")
    if not isinstance(memory, Mapping):
        raise SummaryError("the Summary has no node.memory object")
    psi = memory.get("psi")
    if psi is None:
        raise SummaryError("the Summary has no node.memory.psi (kubelet feature KubeletPSI "
                           "off, or a kernel without PSI)")
    if not isinstance(psi, Mapping):
        raise SummaryError("node.memory.psi is not an object")
    return PSI(_average(psi, "some"), _average(psi, "full"), _total(psi), _sampled(memory),
               _avg60(psi))


def _avg60(psi: Mapping[str, Any]) -> float | None:
    """``some.avg60``, or None: optional evidence, like the counter."""
    try:
        return _average(psi, "some", "avg60")
    except SummaryError:
        return None


def _total(psi: Mapping[str, Any]) -> int | None:
    """``some.total``, or None: no counter is no proof over a gap, not a bad read."""
    value = psi["some"].get("total")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _sampled(memory: Mapping[str, Any]) -> float | None:
    """``node.memory.time`` (RFC 3339, whole seconds) as POSIX seconds, or None."""
    value = memory.get("time")
    if not isinstance(value, str):
        return None
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.timestamp() if when.tzinfo is not None else None


def stalled_share(before: PSI, after: PSI) -> float | None:
    """Percent of the time between two samples that ``some`` task stalled on memory, from
    the kernel's counter; None when the two cannot say (no counter or time, a counter that
    went back: a rebooted node, a sample not newer than the other)."""
    if None in (before.some_total, after.some_total, before.sampled, after.sampled):
        return None
    assert before.some_total is not None and after.some_total is not None
    assert before.sampled is not None and after.sampled is not None
    seconds = after.sampled - before.sampled
    stalled = after.some_total - before.some_total
    if seconds <= 0 or stalled < 0:
        return None
    return min(100.0, stalled / 1e6 / seconds * 100)


def _number(value: float) -> str:
    """A threshold or a window as written: 40, 12.5."""
    return f"{value:g}"


@dataclass(frozen=True)
class PressureSettings:
    """Thresholds (percent of some avg10), windows and the read interval (seconds)."""

    interval: float = DEFAULT_INTERVAL
    mark_above: float = DEFAULT_MARK_ABOVE
    clear_below: float = DEFAULT_CLEAR_BELOW
    mark_after: float = DEFAULT_MARK_AFTER
    clear_after: float = DEFAULT_CLEAR_AFTER
    mark_with: MarkForm = "label"  # the mark's form (webhook/engine/pressure.py: trade-off)

    def __post_init__(self) -> None:
        values = (self.interval, self.mark_above, self.clear_below, self.mark_after,
                  self.clear_after)
        if not all(math.isfinite(v) for v in values):
            raise ValueError("pressure guard settings must be finite numbers")
        if self.interval <= 0:
            raise ValueError("--pressure-interval must be greater than zero")
        if not 0 < self.clear_below <= self.mark_above <= 100:
            raise ValueError("the pressure thresholds need 0 < --pressure-clear-below <= "
                             "--pressure-mark-above <= 100 (percent)")
        if self.mark_with not in MARK_FORMS:
            raise ValueError(f"--pressure-mark-with must be one of {', '.join(MARK_FORMS)}")
        if self.mark_after < 0 or self.clear_after < 0:
            raise ValueError("--pressure-mark-after and --pressure-clear-after must not be "
                             "negative")

    def text(self) -> str:
        return (f"mark at some avg10 >= {_number(self.mark_above)}% for "
                f"{_number(self.mark_after)} s, clear below {_number(self.clear_below)}% for "
                f"{_number(self.clear_after)} s, read every {_number(self.interval)} s, "
                f"mark with a {'label' if self.mark_with == 'label' else 'NoSchedule taint'}")


def rfc3339(when: dt.datetime) -> str:
    """UTC, whole seconds: ``2026-01-01T12:00:00Z``."""
    return when.astimezone(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


Action = Literal["mark", "clear"]


@dataclass(frozen=True)
class Transition:
    action: Action
    message: str  # the annotation value, the Event's message, the log's "why"


def forced_clear(reason: str, when: dt.datetime) -> str:
    """The annotation when a mark goes for a reason other than low pressure."""
    return f"cleared: {reason} at {rfc3339(when)}"


class NodePressure:
    """One swap node's guard state: the mark, the two windows, the last good reading."""

    def __init__(self, settings: PressureSettings, marked: bool) -> None:
        self.settings = settings
        self.marked = marked  # what the node must carry
        self.high_since: float | None = None  # first read of the current run >= mark_above
        self.low_since: float | None = None  # first read of the current run < clear_below
        self.read_at: float | None = None  # the last good read
        self.misses = 0  # failed reads since the last good one
        self.last: PSI | None = None
        self.message = ""  # the annotation of the last transition made here

    def missed(self) -> None:
        """A read that failed: no evidence; the second in a row is a blind stretch."""
        self.misses += 1

    def _run(self, since: float | None, now: float, point: bool, span: bool | None,
             minute: bool | None) -> float | None:
        """Where the run of reads on one side of a threshold starts, after a read at ``now``
        on that side (``point``) whose share since the previous good read (``span``) and
        whose kernel avg60 (``minute``) are or are not on it (None: unknown)."""
        if not point:
            return None
        start = now
        if span and self.read_at is not None:
            start = self.read_at  # the whole time since the previous read was on this side
        if minute:
            start = min(start, now - AVG60_SECONDS)  # and so was the kernel's last minute
        if since is not None and (self.misses < MISSED_READS or span):
            return min(since, start)  # the run goes on (across a blind stretch: proven)
        return start  # a new run, or one broken by a blind stretch nothing bridges

    def observe(self, psi: PSI, now: float, wall: dt.datetime) -> Transition | None:
        """A good read at ``now`` (monotonic seconds); the transition it completes, if any."""
        s = self.settings
        share = stalled_share(self.last, psi) if self.last is not None else None
        avg60 = psi.some_avg60
        self.high_since = self._run(
            self.high_since, now, psi.some >= s.mark_above,
            None if share is None else share >= s.mark_above,
            None if avg60 is None else avg60 >= s.mark_above)
        self.low_since = self._run(
            self.low_since, now, psi.some < s.clear_below,
            None if share is None else share < s.clear_below,
            None if avg60 is None else avg60 < s.clear_below)
        self.read_at, self.last, self.misses = now, psi, 0
        if not self.marked and self.high_since is not None \
                and now - self.high_since >= s.mark_after:
            self.marked = True
            self.message = (f"marked: memory PSI some avg10 {psi.some:.1f}% >= "
                            f"{_number(s.mark_above)}% for {now - self.high_since:.0f} s "
                            f"(full avg10 {psi.full:.1f}%) at {rfc3339(wall)}")
            return Transition("mark", self.message)
        if self.marked and self.low_since is not None and now - self.low_since >= s.clear_after:
            self.marked = False
            self.message = (f"cleared: memory PSI some avg10 {psi.some:.1f}% < "
                            f"{_number(s.clear_below)}% for {now - self.low_since:.0f} s "
                            f"(full avg10 {psi.full:.1f}%) at {rfc3339(wall)}")
            return Transition("clear", self.message)
        return None

"""When a node is under sustained pressure: the stall share over a window, with hysteresis.

The kernel counts, per resource, the microseconds some task waited (PSI ``some total``). The
share of a window spent stalled is the rise of that counter over the window's length. A mark
comes when the share over the *mark window* (10 s by default, what a kernel trigger can
watch) reaches ``mark_above`` percent, and goes only when the share over the longer *clear
window* stays below ``clear_below``: quick to protect a node, slow to send pods back.

Pure: samples (monotonic seconds, counter) in, decisions out. The loop in :mod:`.run` feeds
it the kernel's figures; a kernel trigger only wakes the loop sooner.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Thresholds:
    """Percent of wall-clock time stalled (``some``), and windows in seconds."""

    mark_above: float
    clear_below: float
    mark_window: float = 10.0
    clear_window: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.clear_below <= self.mark_above <= 100:
            raise ValueError(f"need 0 < clear below ({self.clear_below}) <= mark above "
                             f"({self.mark_above}) <= 100")
        if not 1 <= self.mark_window <= self.clear_window <= 3600:
            raise ValueError(f"need 1 <= mark window ({self.mark_window}) <= clear window "
                             f"({self.clear_window}) <= 3600 seconds")


MEMORY_DEFAULTS = Thresholds(mark_above=60, clear_below=10)
# CPU "some" is high on any busy node with more runnable threads than CPUs: only a node that
# waits most of the time is marked, and it is cleared once it waits under half of it.
CPU_DEFAULTS = Thresholds(mark_above=80, clear_below=40)


class StallWindow:
    """The last ``span`` seconds of one PSI counter's samples."""

    def __init__(self, span: float) -> None:
        self.span = span
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, at: float, total_us: int) -> None:
        if self.samples and (at <= self.samples[-1][0] or total_us < self.samples[-1][1]):
            # the clock did not move, or the counter went back (a new cgroup): start again
            if total_us < self.samples[-1][1]:
                self.samples.clear()
            else:
                return
        self.samples.append((at, total_us))
        # keep one sample at or before the span's start, so a full span can be measured
        while len(self.samples) > 2 and self.samples[1][0] <= at - self.span:
            self.samples.popleft()

    def share(self, seconds: float) -> float | None:
        """Percent of the last ``seconds`` stalled; None until the samples cover them."""
        if len(self.samples) < 2:
            return None
        end_at, end_total = self.samples[-1]
        start = None
        for at, total in reversed(self.samples):
            if at <= end_at - seconds:
                start = (at, total)
                break
        if start is None:
            return None
        elapsed_us = (end_at - start[0]) * 1e6
        return min(100.0, max(0.0, 100.0 * (end_total - start[1]) / elapsed_us))


Change = Literal["marked", "cleared"]


@dataclass(frozen=True)
class Decision:
    change: Change | None
    marked: bool
    share: float | None  # over the window the decision looked at
    window: float


class MarkState:
    """One resource's mark: the window of samples and whether the node carries the mark."""

    def __init__(self, thresholds: Thresholds, marked: bool = False) -> None:
        self.thresholds = thresholds
        self.window = StallWindow(thresholds.clear_window)
        self.marked = marked
        self.since: float | None = None  # when the mark last changed (monotonic)

    def observe(self, at: float, total_us: int, triggered: bool = False) -> Decision:
        """Add a sample; mark when the mark window's share reaches the threshold (or the
        kernel's trigger, watching the same window and threshold, fired), clear when the
        clear window's share stays under ``clear_below``."""
        t = self.thresholds
        self.window.add(at, total_us)
        if not self.marked:
            share = self.window.share(t.mark_window)
            if triggered or (share is not None and share >= t.mark_above):
                self.marked, self.since = True, at
                return Decision("marked", True, share, t.mark_window)
            return Decision(None, False, share, t.mark_window)
        share = self.window.share(t.clear_window)
        held = self.since is None or at - self.since >= t.clear_window
        if share is not None and share < t.clear_below and held:
            self.marked, self.since = False, at
            return Decision("cleared", False, share, t.clear_window)
        return Decision(None, True, share, t.clear_window)

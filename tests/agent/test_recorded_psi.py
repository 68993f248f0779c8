"""The agent's mark and clear decisions replayed on PSI counters the real node's kernel wrote.

tests/data/node/ holds psi.log recordings of real-node runs (tests/node: the guest writes one
line a second, with its clock and the memory and CPU ``some`` counters); each file's first
lines (``#``) name the run it came from and the thresholds the agent ran with. CI keeps the
live pressure scenarios short (tests/node/test_real_node.py); this replays a whole recorded
one, second by second, through :class:`~webhook.agent.stall.MarkState`, and checks its
decisions against the kernel's counters computed here independently: a mark exactly when the
share over the mark window first reaches the threshold, a clear exactly when, a clear window
after the mark, the share over it is first below the clear threshold.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from webhook.agent.stall import MarkState, Thresholds

RECORDINGS = Path(__file__).resolve().parents[1] / "data" / "node"


@dataclass(frozen=True)
class Line:
    epoch: float
    memory_total: int
    cpu_total: int


def load(path: Path) -> tuple[dict[str, str], list[Line]]:
    """The recording's header (``# key: value`` lines) and its samples."""
    header: dict[str, str] = {}
    lines = []
    for text in path.read_text().splitlines():
        if text.startswith("#"):
            key, _, value = text[1:].partition(":")
            header[key.strip()] = value.strip()
            continue
        fields = text.split()
        if len(fields) >= 12:
            lines.append(Line(float(fields[8]), int(fields[9]), int(fields[11])))
    return header, lines


def share(lines: list[Line], end: int, window: float, counter: str) -> float | None:
    """Percent of the ``window`` seconds before ``end`` stalled, from the counters."""
    last = lines[end]
    for start in range(end - 1, -1, -1):
        first = lines[start]
        if last.epoch - first.epoch >= window:
            rise = getattr(last, counter) - getattr(first, counter)
            return min(100.0, 100.0 * rise / ((last.epoch - first.epoch) * 1e6))
    return None


def expected(lines: list[Line], t: Thresholds, counter: str) -> list[tuple[str, int]]:
    """(change, sample index) as the kernel's counters call them."""
    changes: list[tuple[str, int]] = []
    marked_at: float | None = None
    for i, line in enumerate(lines):
        if marked_at is None:
            s = share(lines, i, t.mark_window, counter)
            if s is not None and s >= t.mark_above:
                changes.append(("marked", i))
                marked_at = line.epoch
        elif line.epoch - marked_at >= t.clear_window:
            s = share(lines, i, t.clear_window, counter)
            if s is not None and s < t.clear_below:
                changes.append(("cleared", i))
                marked_at = None
    return changes


def replayed(lines: list[Line], t: Thresholds, counter: str) -> list[tuple[str, int]]:
    state = MarkState(t)
    changes = []
    for i, line in enumerate(lines):
        decision = state.observe(line.epoch, getattr(line, counter))
        if decision.change is not None:
            changes.append((decision.change, i))
    return changes


RECORDED = sorted(RECORDINGS.glob("psi-*.log"))


@pytest.mark.parametrize("path", RECORDED, ids=[p.name for p in RECORDED])
def test_the_agent_decides_where_the_kernels_counters_say(path: Path) -> None:
    header, lines = load(path)
    assert header.get("run") and len(lines) > 100, header
    for counter, key in (("memory_total", "memory"), ("cpu_total", "cpu")):
        mark_above, clear_below = (float(v) for v in header[key].split("/"))
        t = Thresholds(mark_above, clear_below, float(header["mark window"]),
                       float(header["clear window"]))
        want = expected(lines, t, counter)
        assert replayed(lines, t, counter) == want, (key, want)
    # The recording holds what it was kept for: the thrash it names was marked and cleared.
    mark_above, clear_below = (float(v) for v in header["memory"].split("/"))
    t = Thresholds(mark_above, clear_below, float(header["mark window"]),
                   float(header["clear window"]))
    assert [change for change, _ in expected(lines, t, "memory_total")][:2] == [
        "marked", "cleared"], header


def test_a_recording_of_a_real_run_is_kept() -> None:
    """The replay above must have something to replay: a parametrised test over no files
    would pass without checking anything."""
    assert RECORDED, f"no psi-*.log recording in {RECORDINGS}"

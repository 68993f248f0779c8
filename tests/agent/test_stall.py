"""webhook/agent/stall.py: the stall share of a window from PSI counters, and the marks'
hysteresis (quick to mark, slow to clear), on synthetic samples with exact figures."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.agent.stall import (
    CPU_DEFAULTS,
    MEMORY_DEFAULTS,
    Decision,
    MarkState,
    StallWindow,
    Thresholds,
)

S = 1_000_000  # microseconds in a second


def feed(window: StallWindow, start: float, seconds: int, percent: float,
         total: int = 0) -> int:
    """One sample a second for ``seconds`` seconds after ``start`` (the sample at ``start``
    is expected to be there), stalled ``percent`` of each; the counter's last value."""
    for i in range(1, seconds + 1):
        total += int(percent / 100 * S)
        window.add(start + i, total)
    return total


# -- StallWindow


def test_share_is_the_counters_rise_over_the_windows_length() -> None:
    window = StallWindow(60)
    window.add(100.0, 5 * S)
    window.add(110.0, 5 * S + 3 * S)  # 3 s stalled in 10 s
    assert window.share(10) == 30.0
    window.add(120.0, 8 * S + 10 * S)  # then the whole next 10 s
    assert window.share(10) == 100.0
    assert window.share(20) == 65.0


def test_share_starts_at_the_latest_sample_at_or_before_the_windows_start() -> None:
    window = StallWindow(60)
    total = 0
    window.add(0.0, total)
    for at in range(1, 21):
        total += (S // 2) if at <= 10 else 0  # 50 % for 10 s, then calm for 10 s
        window.add(float(at), total)
    assert window.share(10) == 0.0
    assert window.share(20) == 25.0
    assert window.share(15) == pytest.approx(100 * 2.5 / 15)  # from t=5: 2.5 s of 15
    # 14.5 s: no sample 14.5 s back; it measures from t=5, the one before
    assert window.share(14.5) == pytest.approx(100 * 2.5 / 15)


def test_share_is_none_until_the_window_is_covered() -> None:
    window = StallWindow(60)
    assert window.share(10) is None
    window.add(0.0, 0)
    assert window.share(10) is None  # one sample measures nothing
    feed(window, 0.0, 9, 50)
    assert window.share(10) is None  # 9 s of samples do not cover 10
    feed(window, 9.0, 1, 50, total=window.samples[-1][1])
    assert window.share(10) == 50.0
    assert window.share(11) is None


def test_share_is_bounded_to_0_100() -> None:
    window = StallWindow(60)
    window.add(0.0, 0)
    window.add(10.0, 50 * S)  # more stall than time: a counter of several CPUs' tasks
    assert window.share(10) == 100.0


def test_a_counter_that_goes_back_starts_the_window_again() -> None:
    window = StallWindow(60)
    window.add(0.0, 0)
    total = feed(window, 0.0, 30, 90)
    assert window.share(10) == 90.0
    window.add(31.0, total - 1)  # a new cgroup (kubepods recreated): a fresh counter
    assert list(window.samples) == [(31.0, total - 1)]
    assert window.share(10) is None
    feed(window, 31.0, 10, 20, total=total - 1)
    assert window.share(10) == pytest.approx(20.0)


def test_a_sample_whose_clock_did_not_move_is_ignored() -> None:
    window = StallWindow(60)
    window.add(0.0, 0)
    window.add(10.0, 2 * S)
    window.add(10.0, 9 * S)  # same instant again
    window.add(9.0, 9 * S)  # the clock went back
    assert list(window.samples) == [(0.0, 0), (10.0, 2 * S)]
    assert window.share(10) == 20.0


def test_the_window_keeps_one_sample_at_or_before_its_span() -> None:
    window = StallWindow(60)
    window.add(0.0, 0)
    feed(window, 0.0, 600, 10)
    assert window.samples[0][0] == 540.0
    assert len(window.samples) == 61
    assert window.share(60) == pytest.approx(10.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 5.0), st.floats(0.0, 100.0)), min_size=2,
                max_size=80), st.floats(1.0, 30.0))
def test_share_is_the_stall_over_exactly_the_measured_span(
        steps: list[tuple[float, float]], seconds: float) -> None:
    """For any sampling, the share is the counter's rise over the elapsed time between the
    sample it starts from (the latest at or before ``seconds`` ago) and the last one."""
    window = StallWindow(60)
    at, total = 1000.0, 0
    samples = [(at, total)]
    window.add(at, total)
    for gap, percent in steps:
        total += int(gap * S * percent / 100)
        at += gap
        samples.append((at, total))
        window.add(at, total)
    share = window.share(seconds)
    end_at, end_total = samples[-1]
    starts = [(a, t) for a, t in samples if a <= end_at - seconds]
    if not starts:
        assert share is None
        return
    start_at, start_total = starts[-1]
    assert share is not None and math.isfinite(share)
    assert share == pytest.approx(
        min(100.0, 100 * (end_total - start_total) / ((end_at - start_at) * S)))
    assert 0.0 <= share <= 100.0


# -- MarkState


def run(state: MarkState, start: int, seconds: int, percent: float, total: int
        ) -> tuple[int, list[tuple[int, Decision]]]:
    """Observe a sample a second from ``start + 1`` for ``seconds``; the counter and every
    decision that changed the mark, with its time."""
    changes = []
    for at in range(start + 1, start + seconds + 1):
        total += int(percent / 100 * S)
        decision = state.observe(float(at), total)
        if decision.change is not None:
            changes.append((at, decision))
    return total, changes


T = Thresholds(mark_above=60, clear_below=10, mark_window=10, clear_window=60)


def test_marks_at_the_threshold_over_the_mark_window() -> None:
    state = MarkState(T)
    assert state.observe(0.0, 0) == Decision(None, False, None, 10)
    total, changes = run(state, 0, 9, 60, 0)
    assert changes == []  # 9 s of 60 %: the window is not covered yet
    _, changes = run(state, 9, 1, 60, total)
    assert changes == [(10, Decision("marked", True, 60.0, 10))]
    assert state.marked and state.since == 10.0


def test_just_below_the_threshold_never_marks() -> None:
    state = MarkState(T)
    state.observe(0.0, 0)
    _, changes = run(state, 0, 300, 59.9, 0)
    assert changes == []
    assert not state.marked


def test_a_short_burst_under_the_window_does_not_mark() -> None:
    state = MarkState(T)
    state.observe(0.0, 0)
    total, _ = run(state, 0, 20, 0, 0)
    total, changes = run(state, 20, 5, 100, total)  # 5 s at 100 %: 50 % of 10 s
    assert changes == []
    total, changes = run(state, 25, 5, 0, total)
    assert changes == [] and not state.marked


def test_clears_only_below_the_clear_threshold_over_the_clear_window() -> None:
    state = MarkState(T)
    state.observe(0.0, 0)
    total, changes = run(state, 0, 10, 100, 0)
    assert [at for at, _ in changes] == [10]
    # calm from 10 s: the clear window (60 s) must pass since the mark, and the last 60 s
    # must have stalled under 10 %
    total, changes = run(state, 10, 59, 0, total)
    assert changes == [] and state.marked
    total, changes = run(state, 69, 1, 0, total)
    assert changes == [(70, Decision("cleared", False, 0.0, 60))]
    assert state.since == 70.0


def test_stall_at_the_clear_threshold_keeps_the_mark() -> None:
    state = MarkState(T)
    state.observe(0.0, 0)
    total, _ = run(state, 0, 10, 100, 0)
    total, changes = run(state, 10, 600, 10, total)  # exactly 10 %: not below
    assert changes == [] and state.marked
    _, changes = run(state, 610, 1, 0, total)  # the last 60 s: 59 at 10 %, one calm
    assert [(at, d.change, d.share) for at, d in changes] == [
        (611, "cleared", pytest.approx(100 * 5.9 / 60))]


def test_between_the_thresholds_the_mark_holds_and_no_mark_comes() -> None:
    state = MarkState(T)
    state.observe(0.0, 0)
    total, changes = run(state, 0, 300, 30, 0)
    assert changes == [] and not state.marked  # 30 %: under the mark threshold
    total, _ = run(state, 300, 10, 100, total)
    assert state.marked
    _, changes = run(state, 310, 600, 30, total)  # 30 %: over the clear threshold
    assert changes == [] and state.marked


def test_the_trigger_marks_before_the_window_is_covered() -> None:
    state = MarkState(T)
    decision = state.observe(5.0, 0, triggered=True)
    assert decision == Decision("marked", True, None, 10)
    assert state.since == 5.0
    # and it holds the mark for a clear window like any other mark
    _, changes = run(state, 5, 59, 0, 0)
    assert changes == []
    _, changes = run(state, 64, 1, 0, 0)
    assert [(at, d.change) for at, d in changes] == [(65, "cleared")]


def test_a_trigger_while_marked_changes_nothing() -> None:
    state = MarkState(T, marked=True)
    assert state.observe(1.0, 0, triggered=True) == Decision(None, True, None, 60)


def test_a_restored_mark_holds_until_a_clear_window_of_calm_is_measured() -> None:
    """A restarted agent finds its node marked: it keeps the mark until it has itself seen a
    clear window of calm (no time since a change it never saw)."""
    state = MarkState(T, marked=True)
    assert state.since is None
    state.observe(1000.0, 0)
    total, changes = run(state, 1000, 59, 0, 0)
    assert changes == [] and state.marked  # the window is not covered yet
    _, changes = run(state, 1059, 1, 0, total)
    assert [(at, d.change) for at, d in changes] == [(1060, "cleared")]


def test_a_restored_mark_under_pressure_stays() -> None:
    state = MarkState(T, marked=True)
    state.observe(0.0, 0)
    _, changes = run(state, 0, 300, 50, 0)
    assert changes == [] and state.marked


def test_a_counter_reset_while_marked_needs_a_new_clear_window() -> None:
    state = MarkState(T)
    state.observe(0.0, 10 * S)
    total, _ = run(state, 0, 10, 100, 10 * S)
    assert state.marked
    total, _ = run(state, 10, 100, 0, total)
    assert not state.marked
    total, _ = run(state, 110, 10, 100, total)
    assert state.marked and state.since == 116.0  # 6 s at 100 % of the last 10
    state.observe(121.0, 0)  # the counter starts again
    _, changes = run(state, 121, 60, 0, 0)
    assert [(at, d.change) for at, d in changes] == [(181, "cleared")]


def test_defaults() -> None:
    assert (MEMORY_DEFAULTS.mark_above, MEMORY_DEFAULTS.clear_below) == (60, 10)
    assert (CPU_DEFAULTS.mark_above, CPU_DEFAULTS.clear_below) == (80, 40)
    assert (MEMORY_DEFAULTS.mark_window, MEMORY_DEFAULTS.clear_window) == (10, 60)


# -- Thresholds


@pytest.mark.parametrize("mark,clear", [(50, 60), (60, 0), (101, 10), (60, -1), (0, 0),
                                        (math.nan, 10), (60, math.nan), (math.inf, 10)])
def test_thresholds_refuse_percentages_out_of_order(mark: float, clear: float) -> None:
    with pytest.raises(ValueError, match="clear below"):
        Thresholds(mark, clear)


@pytest.mark.parametrize("mark_window,clear_window", [(0.5, 60), (20, 10), (10, 3601),
                                                      (math.nan, 60), (10, math.inf)])
def test_thresholds_refuse_windows_out_of_order(mark_window: float,
                                                clear_window: float) -> None:
    with pytest.raises(ValueError, match="mark window"):
        Thresholds(60, 10, mark_window, clear_window)


@pytest.mark.parametrize("args", [(100, 100, 1, 1), (60, 60, 10, 10), (0.1, 0.1, 1, 3600)])
def test_thresholds_at_their_bounds(args: tuple[float, float, float, float]) -> None:
    t = Thresholds(*args)
    assert (t.mark_above, t.clear_below, t.mark_window, t.clear_window) == args

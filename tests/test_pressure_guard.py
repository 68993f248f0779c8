"""The pressure guard of `swapwise label-nodes`, without a cluster.

The hysteresis (:class:`NodePressure`) is driven with exact times; the controller runs on
the fakes of tests/test_labeller.py, extended with a kubelet Summary per node (or a failure)
and an Event sink, and a fake clock, so windows are exact rather than slept.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime as dt
import json
import logging
import math
import re
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.test_labeller import (
    DEFAULT_LABEL,
    GI4,
    PERMILLE,
    SWAP,
    T0,
    Clock,
    FakeNodes,
    node,
    proxy_client,
)
from webhook.cli import main
from webhook.engine.pressure import PRESSURE_ANNOTATION, PRESSURE_LABEL, PRESSURE_TAINT
from webhook.labeller.controller import Labeller
from webhook.labeller.kube import KubeletSummaryError
from webhook.labeller.labels import PressureWant, desired_change, judge
from webhook.labeller.metrics import LabellerMetrics
from webhook.labeller.pressure import (
    PSI,
    NodePressure,
    PressureSettings,
    SummaryError,
    forced_clear,
    rfc3339,
    stalled_share,
    summary_memory_psi,
)
from webhook.labeller.run import configure_logging

DATA = Path(__file__).resolve().parent / "data"
# The defaults: reads every 10 s, mark >= 40 % for 60 s, clear < 10 % for 120 s.
# The hysteresis tests pin their settings (40 % / 10 %, 60 s / 120 s): the defaults may move.
SETTINGS = PressureSettings(mark_above=40, clear_below=10, mark_after=60, clear_after=120)
MARK = "marked: memory PSI some avg10 {some}% >= 40% for {secs} s (full avg10 {full}%) at {at}"
CLEAR = "cleared: memory PSI some avg10 {some}% < 10% for {secs} s (full avg10 {full}%) at {at}"


def at(seconds: float) -> str:
    return rfc3339(T0 + dt.timedelta(seconds=seconds))


def summary(name: str, some: Any, full: Any = 1.5) -> dict[str, Any]:
    """A kubelet Summary (only_cpu_and_memory) of the real shape, cut to the node part."""
    return {
        "node": {
            "nodeName": name, "startTime": "2026-01-01T11:49:31Z",
            "cpu": {"time": "2026-01-01T12:00:03Z", "usageNanoCores": 1573340102},
            "memory": {
                "time": "2026-01-01T12:00:03Z", "workingSetBytes": 1987342336,
                # avg60 between the thresholds and a still counter: evidence of avg10 alone.
                "psi": {"full": {"total": 121335870, "avg10": full, "avg60": 25, "avg300": 0},
                        "some": {"total": 401126590, "avg10": some, "avg60": 25, "avg300": 0}},
            },
        },
        "pods": [],
    }


def run(tracker: NodePressure, reads: list[tuple[float, float | PSI | None]]
        ) -> list[tuple[float, str]]:
    """Feed (time, some avg10 or a whole reading) reads, None for a read that failed; the
    transitions as (time, action)."""
    done = []
    for now, some in reads:
        if some is None:
            tracker.missed()
            continue
        psi = some if isinstance(some, PSI) else PSI(some, 2.0)
        transition = tracker.observe(psi, now, T0 + dt.timedelta(seconds=now))
        if transition is not None:
            done.append((now, transition.action))
    return done


def every(start: float, stop: float, some: float, step: float = 10) -> list[tuple[float, float]]:
    """Reads every ``step`` seconds from ``start`` to ``stop`` inclusive, all of ``some``."""
    count = round((stop - start) / step)
    return [(start + i * step, some) for i in range(count + 1)]


# ------------------------------------------------------------------------- hysteresis


def test_marks_at_exactly_the_threshold_after_exactly_the_window() -> None:
    tracker = NodePressure(SETTINGS, marked=False)
    # 40.0 is "at or above"; the window is from the first such read: 0 .. 60 s.
    assert run(tracker, every(0, 50, 40.0)) == []
    assert not tracker.marked
    assert run(tracker, [(60, 40.0)]) == [(60, "mark")]
    assert tracker.marked
    assert tracker.message == MARK.format(some="40.0", secs=60, full="2.0", at=at(60))


def test_just_below_the_mark_threshold_never_marks() -> None:
    tracker = NodePressure(SETTINGS, marked=False)
    assert run(tracker, every(0, 3600, 39.99)) == []
    assert not tracker.marked and tracker.message == ""


def test_clears_below_exactly_the_threshold_after_exactly_the_window() -> None:
    tracker = NodePressure(SETTINGS, marked=True)
    assert run(tracker, every(0, 600, 10.0)) == []  # 10.0 is not below 10
    assert tracker.marked
    assert run(tracker, every(610, 720, 9.99)) == []  # 110 s of low reads
    assert run(tracker, [(730, 9.99)]) == [(730, "clear")]  # 120 s
    assert tracker.message == CLEAR.format(some="10.0", secs=120, full="2.0", at=at(730))
    assert not tracker.marked


def test_between_the_thresholds_the_state_is_kept_and_both_windows_restart() -> None:
    unmarked, marked = NodePressure(SETTINGS, False), NodePressure(SETTINGS, True)
    for tracker in (unmarked, marked):
        assert run(tracker, every(0, 3600, 25.0)) == []
    assert not unmarked.marked and marked.marked
    # 50 s high, one read in between, 50 s high: never 60 s in a row, never marked.
    tracker = NodePressure(SETTINGS, False)
    assert run(tracker, [*every(0, 50, 80.0), (60, 25.0), *every(70, 120, 80.0)]) == []
    assert run(tracker, [(130, 80.0)]) == [(130, "mark")]  # 70 .. 130: the new window
    # The same for clearing: a read at the threshold breaks the low run.
    assert run(tracker, [*every(140, 250, 1.0), (260, 10.0), *every(270, 380, 1.0)]) == []
    assert run(tracker, [(390, 1.0)]) == [(390, "clear")]


@pytest.mark.parametrize(("high", "low"), [(45.0, 5.0), (40.0, 9.99), (100.0, 0.0)])
def test_alternating_values_never_flap(high: float, low: float) -> None:
    """Readings that jump across both thresholds on every read: no window is ever complete,
    so the node is neither marked nor, once marked, cleared."""
    reads = [(t, high if i % 2 == 0 else low) for i, t in enumerate(range(0, 3600, 10))]
    for start in (False, True):
        tracker = NodePressure(SETTINGS, start)
        assert run(tracker, reads) == []
        assert tracker.marked is start
    # Two high, one low: the same.
    reads = [(t, low if i % 3 == 2 else high) for i, t in enumerate(range(0, 3600, 10))]
    assert run(NodePressure(SETTINGS, False), reads) == []


def test_a_missed_read_keeps_a_window_going() -> None:
    """One read lost: the window runs on across it."""
    tracker = NodePressure(SETTINGS, False)
    assert run(tracker, [(0, 50.0), (10, 50.0), (20, 50.0), (30, None), (40, 50.0),
                         (50, 50.0)]) == []
    assert run(tracker, [(60, 50.0)]) == [(60, "mark")]
    tracker = NodePressure(SETTINGS, True)
    assert run(tracker, [(0, 1.0), (25, None), (50, 1.0), (75, None), (100, 1.0)]) == []
    assert run(tracker, [(120, 1.0)]) == [(120, "clear")]


def test_a_blind_stretch_restarts_both_windows() -> None:
    """Two reads lost in a row: no mark on evidence with a hole in it."""
    tracker = NodePressure(SETTINGS, False)
    assert run(tracker, [*every(0, 30, 50.0), (40, None), (50, None), *every(60, 110, 50.0)]
               ) == []
    assert tracker.high_since == 60
    assert run(tracker, [(120, 50.0)]) == [(120, "mark")]  # 60 .. 120 of fresh reads
    hole = [(t, None) for t in range(210, 300, 10)]
    assert run(tracker, [*every(130, 200, 1.0), *hole, *every(300, 410, 1.0)]) == []
    assert tracker.marked and tracker.low_since == 300
    assert run(tracker, [(420, 1.0)]) == [(420, "clear")]


def test_slow_answers_are_evidence_however_far_apart() -> None:
    """A thrashing node's kubelet may answer in tens of seconds: one read in flight per node,
    so good reads come that far apart, and every one of them counts."""
    tracker = NodePressure(SETTINGS, False)
    assert run(tracker, [(0, 60.0), (35, 60.0)]) == []
    assert run(tracker, [(70, 60.0)]) == [(70, "mark")]
    assert run(tracker, [(100, 1.0), (160, 1.0)]) == []
    assert run(tracker, [(220, 1.0)]) == [(220, "clear")]


def counted(some: float, total_s: float, at_s: float) -> PSI:
    """A read with the kernel's counter: ``total_s`` seconds stalled so far, sampled at
    ``at_s`` (seconds after T0, the node's clock)."""
    return PSI(some, 2.0, round(total_s * 1e6), T0.timestamp() + at_s)


def test_the_share_stalled_between_two_samples_comes_from_the_counter() -> None:
    assert stalled_share(counted(5, 100, 0), counted(90, 115, 30)) == pytest.approx(50.0)
    assert stalled_share(counted(5, 100, 0), counted(5, 100, 30)) == 0.0
    assert stalled_share(counted(5, 100, 0), counted(99, 200, 30)) == 100.0  # rounding
    # No proof: no counter, no time, a counter that went back (reboot), no newer sample.
    assert stalled_share(PSI(5, 2), counted(90, 115, 30)) is None
    assert stalled_share(counted(5, 100, 0), PSI(90, 2, 115_000_000, None)) is None
    assert stalled_share(counted(5, 100, 0), counted(90, 50, 30)) is None
    assert stalled_share(counted(5, 100, 30), counted(90, 115, 30)) is None


def test_the_counter_bridges_a_blind_stretch_to_a_mark_at_the_first_answer() -> None:
    """A thrashing node's kubelet answers no read in time for a minute; the first answer
    shows avg10 high and a counter that stalled 95 % of the time since the last answer:
    the run started at that answer, and the window is complete at once."""
    tracker = NodePressure(SETTINGS, False)
    blind = [(t, None) for t in range(10, 70, 10)]
    assert run(tracker, [(0, counted(1, 10, 0)), *blind]) == []
    assert run(tracker, [(70, counted(97, 10 + 0.95 * 70, 70))]) == [(70, "mark")]
    assert tracker.message == MARK.format(some="97.0", secs=70, full="2.0", at=at(70))
    # The same answers without the counter: the stretch is a hole, the window starts again.
    tracker = NodePressure(SETTINGS, False)
    assert run(tracker, [(0, 1.0), *blind, (70, 97.0)]) == []
    assert tracker.high_since == 70


def test_a_counter_that_disagrees_or_went_back_proves_nothing_over_a_gap() -> None:
    blind = [(t, None) for t in range(10, 70, 10)]
    # The pressure rose late in the stretch: 30 % of it stalled, below the 40 % to mark at.
    tracker = NodePressure(SETTINGS, False)
    assert run(tracker, [(0, counted(1, 10, 0)), *blind,
                          (70, counted(97, 10 + 0.30 * 70, 70))]) == []
    assert tracker.high_since == 70
    # A rebooted node: its counter starts again from 0.
    tracker = NodePressure(SETTINGS, False)
    assert run(tracker, [(0, counted(1, 500, 0)), *blind, (70, counted(97, 60, 70))]) == []
    assert tracker.high_since == 70
    # A run going across a blind stretch the counter proves high goes on; one it does not
    # prove starts again.
    tracker = NodePressure(SETTINGS, False)
    assert run(tracker, [(0, counted(50, 0, 0)), (10, counted(50, 5, 10)), (20, None),
                          (30, None), (40, counted(50, 25, 40))]) == []
    assert tracker.high_since == 0
    assert run(tracker, [(50, None), (60, None), (70, counted(50, 26, 70))]) == []
    assert tracker.high_since == 70


def test_the_counter_carries_a_clear_back_to_the_last_answer() -> None:
    tracker = NodePressure(SETTINGS, True)
    blind = [(t, None) for t in range(10, 130, 10)]
    assert run(tracker, [(0, counted(20, 400, 0)), *blind,
                          (130, counted(2, 400 + 0.02 * 130, 130))]) == [(130, "clear")]
    assert tracker.message == CLEAR.format(some="2.0", secs=130, full="2.0", at=at(130))


def test_answers_in_a_row_with_the_counter_start_the_run_at_the_previous_answer() -> None:
    """No gap: a read whose avg10 and counter are both high began its run at the read
    before (the time between was high on the counter), one read sooner than avg10 alone."""
    tracker = NodePressure(SETTINGS, False)
    assert run(tracker, [(0, counted(5, 0, 0)), (10, counted(80, 8, 10))]) == []
    assert tracker.high_since == 0
    assert run(tracker, [(t, counted(80, 8 + 0.8 * (t - 10), t)) for t in (20, 30, 40, 50)]
                ) == []
    assert run(tracker, [(60, counted(80, 48, 60))]) == [(60, "mark")]


def test_the_kernels_minute_average_is_a_window_in_one_answer() -> None:
    """avg60 past the threshold with avg10: the kernel's last minute was there, so one answer
    completes a window of up to 60 s, even the first after a blind stretch or a start."""
    tracker = NodePressure(SETTINGS, False)
    assert run(tracker, [(0, PSI(97, 40, None, None, 72.0))]) == [(0, "mark")]
    assert tracker.message == MARK.format(some="97.0", secs=60, full="40.0", at=at(0))
    # Later in a run: the minute reaches further back than the run's first read.
    tracker = NodePressure(SETTINGS, False)
    assert run(tracker, [(0, PSI(80, 9, None, None, 20.0)), (20, PSI(85, 9, None, None, 35.0))]
               ) == []
    assert tracker.high_since == 0
    assert run(tracker, [(40, PSI(90, 9, None, None, 41.0))]) == [(40, "mark")]
    # avg10 alone past it, or avg60 alone: no minute's proof.
    tracker = NodePressure(SETTINGS, False)
    assert run(tracker, [(0, PSI(97, 40, None, None, 39.9)), (10, PSI(30, 9, None, None, 70))]
               ) == []
    assert tracker.high_since is None
    # The same for the clear, across a blind stretch.
    tracker = NodePressure(SETTINGS, True)
    assert run(tracker, [(0, PSI(50, 9, None, None, 50)), (10, None), (20, None),
                         (80, PSI(2, 0, None, None, 4.0))]) == []
    assert tracker.low_since == 20
    assert run(tracker, [(140, PSI(1, 0, None, None, 3.0))]) == [(140, "clear")]


def test_a_mark_read_from_the_node_is_kept_until_the_clear_window_passes() -> None:
    """A new leader (or a restarted labeller) starts from the label: no clear on one read."""
    tracker = NodePressure(SETTINGS, marked=True)
    assert run(tracker, every(0, 110, 0.0)) == []
    assert tracker.marked
    assert run(tracker, [(120, 0.0)]) == [(120, "clear")]


def test_zero_windows_act_on_the_first_read() -> None:
    tracker = NodePressure(PressureSettings(mark_above=40, clear_below=10, mark_after=0,
                                            clear_after=0), False)
    assert run(tracker, [(0, 39.0), (10, 40.0), (20, 25.0), (30, 9.0)]) == [
        (10, "mark"), (30, "clear")]


def test_figures_in_the_messages_are_the_last_read_and_the_window_seen() -> None:
    tracker = NodePressure(PressureSettings(mark_above=12.5, clear_below=2.5), False)
    done = tracker.observe(PSI(33.0, 1.0), 0, T0)
    assert done is None
    for now in (9.6, 19.7, 31.0, 38.2, 49.9):
        assert tracker.observe(PSI(47.24, 12.06), now, T0) is None
    transition = tracker.observe(PSI(47.26, 12.06), 61.4, T0 + dt.timedelta(seconds=61))
    assert transition is not None and transition.action == "mark"
    assert transition.message == ("marked: memory PSI some avg10 47.3% >= 12.5% for 61 s "
                                  "(full avg10 12.1%) at 2026-01-01T12:01:01Z")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"interval": 0}, "--pressure-interval must be greater than zero"),
    ({"interval": -1}, "--pressure-interval must be greater than zero"),
    ({"interval": math.nan}, "finite"),
    ({"mark_above": math.inf}, "finite"),
    ({"clear_below": 0}, "0 < --pressure-clear-below <= --pressure-mark-above <= 100"),
    ({"clear_below": 70}, "0 < --pressure-clear-below <= --pressure-mark-above <= 100"),
    ({"mark_above": 101}, "0 < --pressure-clear-below <= --pressure-mark-above <= 100"),
    ({"mark_after": -1}, "must not be negative"),
    ({"clear_after": -0.5}, "must not be negative"),
])
def test_settings_are_checked(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        PressureSettings(**kwargs)


def test_equal_thresholds_are_allowed() -> None:
    settings = PressureSettings(interval=4, mark_above=30, clear_below=30)
    assert settings.text() == ("mark at some avg10 >= 30% for 60 s, clear below 30% for "
                               "120 s, read every 4 s, mark with a label")


# ----------------------------------------------------------------------------- Summary


def test_summary_of_the_kubelet_gives_the_nodes_memory_psi_not_a_pods() -> None:
    payload = json.loads((DATA / "kubelet-summary-cpu-memory.json").read_text())
    memory = payload["node"]["memory"]
    sampled = dt.datetime.fromisoformat(memory["time"].replace("Z", "+00:00")).timestamp()
    assert summary_memory_psi(payload, "swap-node-1") == PSI(
        47.21, 12.13, memory["psi"]["some"]["total"], sampled, memory["psi"]["some"]["avg60"])
    # The Go encoder writes a whole float as an integer: 0, not 0.0.
    assert summary_memory_psi(summary("n", 0, 0), "n").some == 0.0
    assert summary_memory_psi(summary("n", 100, 100), "n").full == 100.0
    # The counter, its time and avg60 are optional: without them a read is still evidence.
    other = summary("n", 5.5)
    some = other["node"]["memory"]["psi"]["some"]
    other["node"]["memory"]["time"] = "yesterday"
    some["total"], some["avg60"] = -3, 101
    assert summary_memory_psi(other, "n") == PSI(5.5, 1.5, None, None, None)
    del other["node"]["memory"]["time"], some["total"], some["avg60"]
    assert summary_memory_psi(other, "n") == PSI(5.5, 1.5, None, None, None)
    no_name = summary("n", 5.5)
    del no_name["node"]["nodeName"]
    assert summary_memory_psi(no_name, "n") .some == 5.5


def _without_psi() -> dict[str, Any]:
    payload = summary("n", 1.0)
    del payload["node"]["memory"]["psi"]
    return payload


def _psi(value: Any, kind: str = "some") -> dict[str, Any]:
    payload = summary("n", 1.0)
    payload["node"]["memory"]["psi"][kind] = value
    return payload


@pytest.mark.parametrize(("payload", "message"), [
    ([], "the Summary is a JSON list, not an object"),
    ("text", "the Summary is a JSON str, not an object"),
    ({"pods": []}, "the Summary has no node object"),
    ({"node": {"nodeName": "n"}}, "the Summary has no node.memory object"),
    (summary("other", 50.0), "the Summary is for node 'other', not 'n'"),
    (_without_psi(), "no node.memory.psi (kubelet feature KubeletPSI off, or a kernel "
                     "without PSI)"),
    (_psi(None, "full"), "node.memory.psi.full is missing or not an object"),
    (_psi([1]), "node.memory.psi.some is missing or not an object"),
    (summary("n", "47.2"), "node.memory.psi.some.avg10 is not a number: '47.2'"),
    (summary("n", True), "node.memory.psi.some.avg10 is not a number"),
    (summary("n", None), "node.memory.psi.some.avg10 is not a number"),
    (summary("n", -0.5), "node.memory.psi.some.avg10 -0.5 is not a percentage"),
    (summary("n", 100.01), "node.memory.psi.some.avg10 100.01 is not a percentage"),
    (summary("n", 1.0, 1e9), "node.memory.psi.full.avg10 1000000000.0 is not a percentage"),
    (json.loads('{"node": {"memory": {"psi": {"some": {"avg10": NaN}, "full": {"avg10": 0}}}}}'),
     "node.memory.psi.some.avg10 nan is not a percentage"),
    (json.loads('{"node": {"memory": {"psi": {"some": {"avg10": 1}, "full": {"avg10": '
                'Infinity}}}}}'), "node.memory.psi.full.avg10 inf is not a percentage"),
])
def test_a_summary_without_usable_memory_psi_is_an_error_with_its_reason(
    payload: Any, message: str
) -> None:
    with pytest.raises(SummaryError, match=re.escape(message)):
        summary_memory_psi(payload, "n")


# ----------------------------------------------------------------------- the patch


def test_the_mark_goes_with_the_other_labels_in_one_patch() -> None:
    n = node("n", GI4, declared="LimitedSwap")
    verdict = judge(n, "LimitedSwap", "declared")
    change = desired_change(n, verdict, DEFAULT_LABEL, PressureWant(True, "marked: why"))
    assert change is not None and change.pressure == "mark"
    assert change.patch == {"metadata": {
        "labels": {SWAP: "true", PERMILLE: "249", PRESSURE_LABEL: "true"},
        "annotations": {PRESSURE_ANNOTATION: "marked: why",
                        "swapwise.io/swap-node": verdict.message}}}
    # Once there, nothing to write; another message alone is no reason to write.
    marked = node("n", GI4, {SWAP: "true", PERMILLE: "249", PRESSURE_LABEL: "true"},
                  declared="LimitedSwap",
                  annotations={"swapwise.io/swap-node": verdict.message,
                               PRESSURE_ANNOTATION: "marked: why"})
    assert desired_change(marked, verdict, DEFAULT_LABEL, PressureWant(True, "other")) is None
    assert desired_change(marked, verdict, DEFAULT_LABEL, None) is None  # None: leave it
    cleared = desired_change(marked, verdict, DEFAULT_LABEL, PressureWant(False, "cleared: x"))
    assert cleared is not None and cleared.pressure == "clear" and cleared.label == "keep"
    assert cleared.patch == {"metadata": {"labels": {PRESSURE_LABEL: None},
                                          "annotations": {PRESSURE_ANNOTATION: "cleared: x"}}}


def test_a_mark_with_another_value_is_corrected_without_a_new_annotation() -> None:
    n = node("n", GI4, {SWAP: "true", PERMILLE: "249", PRESSURE_LABEL: "yes"},
             declared="LimitedSwap")
    verdict = judge(n, "LimitedSwap", "declared")
    n["metadata"]["annotations"] = {"swapwise.io/swap-node": verdict.message}
    change = desired_change(n, verdict, DEFAULT_LABEL, PressureWant(True, "marked: x"))
    assert change is not None and change.pressure == "fix"
    assert change.patch == {"metadata": {"labels": {PRESSURE_LABEL: "true"}}}
    # Any value is the mark (the webhook's DoesNotExist excludes it): clearing removes it.
    change = desired_change(n, verdict, DEFAULT_LABEL, PressureWant(False, "cleared: x"))
    assert change is not None and change.pressure == "clear"


OTHER_TAINT = {"key": "dedicated", "value": "swap", "effect": "NoSchedule"}


def tainted(n: dict[str, Any], *taints: dict[str, Any], version: str = "7") -> dict[str, Any]:
    """``n`` with these taints and a resourceVersion."""
    n["metadata"]["resourceVersion"] = version
    if taints:
        n["spec"] = {"taints": [dict(t) for t in taints]}
    return n


def test_the_taint_form_marks_with_the_whole_taint_list_and_its_resource_version() -> None:
    n = tainted(node("n", GI4, {SWAP: "true", PERMILLE: "249"}, declared="LimitedSwap"),
                OTHER_TAINT)
    verdict = judge(n, "LimitedSwap", "declared")
    n["metadata"]["annotations"] = {"swapwise.io/swap-node": verdict.message}
    change = desired_change(n, verdict, DEFAULT_LABEL, PressureWant(True, "marked: x", "taint"))
    assert change is not None and change.pressure == "mark"
    # No label: the kubelet's restart admission would fail reshaped pods on a labelled node.
    assert change.patch == {
        "metadata": {"annotations": {PRESSURE_ANNOTATION: "marked: x"}, "resourceVersion": "7"},
        "spec": {"taints": [OTHER_TAINT, PRESSURE_TAINT]}}
    on = tainted(copy.deepcopy(n), OTHER_TAINT, PRESSURE_TAINT)
    assert desired_change(on, verdict, DEFAULT_LABEL, PressureWant(True, "y", "taint")) is None
    cleared = desired_change(on, verdict, DEFAULT_LABEL, PressureWant(False, "cleared: z", "taint"))
    assert cleared is not None and cleared.pressure == "clear"
    assert cleared.patch == {
        "metadata": {"annotations": {PRESSURE_ANNOTATION: "cleared: z"}, "resourceVersion": "7"},
        "spec": {"taints": [OTHER_TAINT]}}
    # The last taint going deletes the list.
    alone = tainted(copy.deepcopy(n), PRESSURE_TAINT)
    change = desired_change(alone, verdict, DEFAULT_LABEL, PressureWant(False, "c", "label"))
    assert change is not None and change.patch["spec"] == {"taints": None}


def test_switching_the_form_moves_the_mark_without_a_new_annotation() -> None:
    base = tainted(node("n", GI4, {SWAP: "true", PERMILLE: "249", PRESSURE_LABEL: "true"},
                        declared="LimitedSwap"), OTHER_TAINT)
    verdict = judge(base, "LimitedSwap", "declared")
    base["metadata"]["annotations"] = {"swapwise.io/swap-node": verdict.message}
    to_taint = desired_change(base, verdict, DEFAULT_LABEL, PressureWant(True, "m", "taint"))
    assert to_taint is not None and to_taint.pressure == "fix"
    assert to_taint.patch == {"metadata": {"labels": {PRESSURE_LABEL: None},
                                           "resourceVersion": "7"},
                              "spec": {"taints": [OTHER_TAINT, PRESSURE_TAINT]}}
    by_taint = tainted(node("n", GI4, {SWAP: "true", PERMILLE: "249"}, declared="LimitedSwap"),
                       {**PRESSURE_TAINT, "value": "yes", "effect": "NoExecute"}, OTHER_TAINT)
    by_taint["metadata"]["annotations"] = {"swapwise.io/swap-node": verdict.message}
    to_label = desired_change(by_taint, verdict, DEFAULT_LABEL, PressureWant(True, "m"))
    assert to_label is not None and to_label.pressure == "fix"
    assert to_label.patch == {"metadata": {"labels": {PRESSURE_LABEL: "true"},
                                           "resourceVersion": "7"},
                              "spec": {"taints": [OTHER_TAINT]}}
    # Any value or effect under the mark's key is the mark: it is corrected in place.
    fixed = desired_change(by_taint, verdict, DEFAULT_LABEL, PressureWant(True, "m", "taint"))
    assert fixed is not None and fixed.pressure == "fix"
    assert fixed.patch["spec"] == {"taints": [OTHER_TAINT, PRESSURE_TAINT]}


def test_the_form_is_checked_with_the_other_settings() -> None:
    with pytest.raises(ValueError, match="--pressure-mark-with must be one of label, taint"):
        PressureSettings(mark_with="annotation")  # type: ignore[arg-type]
    assert PressureSettings(mark_with="taint").text().endswith("mark with a NoSchedule taint")


# ------------------------------------------------------------------------ controller


class FakeKubelets(FakeNodes):
    """FakeNodes whose kubelets answer a Summary (or fail) and whose Events are kept."""

    def __init__(self, *nodes: dict[str, Any]) -> None:
        super().__init__(*nodes)
        self.summaries: dict[str, Any] = {}  # node -> payload, or an exception to raise
        self.summary_reads: list[str] = []
        self.events: list[tuple[str, str, str, str]] = []  # node, type, reason, message
        self.event_failure: Exception | None = None

    async def node_summary(self, name: str) -> Any:
        self.summary_reads.append(name)
        answer = self.summaries.get(name, OSError("no route to host"))
        if isinstance(answer, Exception):
            raise answer
        return copy.deepcopy(answer)

    async def create_event(self, node: dict[str, Any], event_type: str, reason: str,
                           message: str, instance: str) -> None:
        if self.event_failure is not None:
            raise self.event_failure
        assert instance == "me"
        self.events.append((node["metadata"]["name"], event_type, reason, message))


class Guarded:
    """A leading labeller with the guard on, a fake clock, and a step of ``interval``."""

    def __init__(self, api: FakeKubelets, settings: PressureSettings = SETTINGS,
                 leading: Any = None) -> None:
        self.api = api
        self.clock = Clock()
        self.metrics = LabellerMetrics()
        self.labeller = Labeller(api, DEFAULT_LABEL, self.metrics,
                                 leading=leading or (lambda: True), clock=self.clock,
                                 pressure=settings, wall=lambda: self.clock.wall,
                                 identity="me")
        self.start = self.clock.now

    @property
    def t(self) -> float:
        """Seconds since the start."""
        return self.clock.now - self.start

    async def begin(self) -> None:
        self.labeller.replace_all((await self.api.list_nodes())[0])
        await self.labeller.reconcile_pending()

    async def step(self, seconds: float = 10, **some: Any) -> int:
        """Advance the clock; set the named nodes' some avg10; one read, one reconcile."""
        self.clock.advance(seconds)
        for name, value in some.items():
            self.api.summaries[name] = (value if isinstance(value, Exception | dict)
                                        else summary(name, value, 3.25))
        changed = await self.labeller.read_pressure()
        await self.labeller.reconcile_pending()
        return changed

    def labels(self, name: str) -> dict[str, str]:
        return dict(self.api.nodes[name]["metadata"]["labels"])

    def note(self, name: str) -> str | None:
        value = (self.api.nodes[name]["metadata"].get("annotations") or {}).get(
            PRESSURE_ANNOTATION)
        return None if value is None else str(value)

    def value(self, metric: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(metric, labels)


def swap_node(name: str, **kwargs: Any) -> dict[str, Any]:
    return node(name, GI4, declared="LimitedSwap", **kwargs)


def test_only_swap_nodes_are_read_and_a_node_is_marked_then_cleared(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> Guarded:
        api = FakeKubelets(swap_node("hot"), swap_node("calm"), node("plain"),
                           node("noswap", GI4, declared="NoSwap"))
        g = Guarded(api)
        await g.begin()
        assert g.value("swapwise_labeller_pressure_threshold_percent", bound="mark") == 40
        assert g.value("swapwise_labeller_pressure_threshold_percent", bound="clear") == 10
        for _ in range(6):  # 0 .. 50 s above the threshold: not yet
            await g.step(hot=47.2, calm=3.0)
        assert api.summary_reads.count("hot") == 6
        assert set(api.summary_reads) == {"hot", "calm"}  # swap nodes only
        assert PRESSURE_LABEL not in g.labels("hot")
        assert await g.step(hot=47.2, calm=3.0) == 1  # 60 s
        assert g.labels("hot")[PRESSURE_LABEL] == "true"
        marked = MARK.format(some="47.2", secs=60, full="3.2", at=at(g.t))
        assert g.note("hot") == marked
        assert api.events == [("hot", "Warning", "SwapwiseMemoryPressure", marked)]
        assert g.value("swapwise_labeller_pressure_marked_nodes") == 1
        assert g.value("swapwise_labeller_pressure_transitions_total", action="mark") == 1
        assert g.value("swapwise_labeller_memory_psi_avg10_percent", node="hot",
                       kind="some") == 47.2
        assert g.value("swapwise_labeller_memory_psi_avg10_percent", node="calm",
                       kind="full") == 3.25
        assert PRESSURE_LABEL not in g.labels("calm")
        assert g.note("calm") is None  # never marked: nothing to say
        # Still hot, then in between: the mark stays, nothing is written.
        patches = len(api.patches)
        await g.step(hot=90.0)
        for _ in range(30):
            await g.step(hot=25.0)
        assert len(api.patches) == patches and len(api.events) == 1
        # Calm for 120 s: cleared.
        for _ in range(12):
            await g.step(hot=4.0)
        assert g.labels("hot")[PRESSURE_LABEL] == "true"
        await g.step(hot=4.0)
        assert PRESSURE_LABEL not in g.labels("hot")
        cleared = CLEAR.format(some="4.0", secs=120, full="3.2", at=at(g.t))
        assert g.note("hot") == cleared
        assert api.events[1:] == [("hot", "Normal", "SwapwiseMemoryPressureCleared", cleared)]
        assert g.value("swapwise_labeller_pressure_marked_nodes") == 0
        assert g.value("swapwise_labeller_pressure_transitions_total", action="clear") == 1
        assert g.labels("hot")[SWAP] == "true"  # the other labels are untouched
        assert g.value("swapwise_labeller_psi_read_errors_total") == 0
        return g

    with caplog.at_level("INFO", logger="swapwise.labeller"):
        asyncio.run(scenario())
    lines = [r.__dict__ for r in caplog.records if r.getMessage().startswith("memory pressure")]
    assert [(r["node"], r["some_avg10"], r["full_avg10"]) for r in lines] == [
        ("hot", 47.2, 3.25), ("hot", 4.0, 3.25)]
    assert [r.getMessage() for r in caplog.records if "memory pressure" in r.getMessage()] == [
        "memory pressure mark set", "memory pressure mark cleared"]
    assert lines[0]["why"].startswith("marked: memory PSI some avg10 47.2% >= 40% for 60 s")
    updated = [r.__dict__["pressure_action"] for r in caplog.records
               if r.getMessage() == "node updated" and r.__dict__["node"] == "hot"]
    assert updated == ["keep", "mark", "clear"]  # the first: the swap label itself


def test_every_answer_is_logged_at_debug_with_the_run_it_extends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The real-node suite splits the guard's latency into the kubelet's and its own from
    these lines; a failed read is no answer and logs none."""
    async def scenario() -> None:
        g = Guarded(FakeKubelets(swap_node("hot")))
        await g.begin()
        await g.step(hot=50.0)
        await g.step(hot=55.0)
        await g.step(hot=OSError("no route to host"))
        await g.step(hot=5.0)

    with caplog.at_level("DEBUG", logger="swapwise.labeller"):
        asyncio.run(scenario())
    reads = [r.__dict__ for r in caplog.records if r.getMessage() == "memory PSI read"]
    assert [(r["node"], r["some_avg10"], r["high_for_s"], r["low_for_s"]) for r in reads] == [
        ("hot", 50.0, 0.0, None), ("hot", 55.0, 10.0, None), ("hot", 5.0, None, 0.0)]
    assert all(r["took_s"] == 0.0 for r in reads)  # the fake clock stands still in a read


def test_at_debug_the_guards_lines_are_logged_and_the_http_clients_trace_is_not() -> None:
    root = logging.getLogger()
    saved = (root.level, list(root.handlers),
             {n: logging.getLogger(n).level for n in ("httpx2", "httpcore2")})
    try:
        configure_logging("debug")
        assert logging.getLogger("swapwise.labeller").isEnabledFor(logging.DEBUG)
        assert not logging.getLogger("httpcore2.http11").isEnabledFor(logging.INFO)
        assert not logging.getLogger("httpx2").isEnabledFor(logging.INFO)
        assert logging.getLogger("httpcore2.http11").isEnabledFor(logging.WARNING)
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        for name, level in saved[2].items():
            logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize("failure", [
    OSError("no route to host"),
    KubeletSummaryError("HTTP 403: nodes \"hot\" is forbidden"),
    KubeletSummaryError("Summary answer is not JSON: Expecting value"),
    "garbage",
])
def test_a_failed_read_changes_nothing_and_is_counted(
    failure: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        api = FakeKubelets(swap_node("hot"), swap_node("marked", labels={PRESSURE_LABEL: "true"}))
        g = Guarded(api)
        await g.begin()
        for _ in range(5):  # 0 .. 40 s high; the marked node is calm
            await g.step(hot=50.0, marked=1.0)
        patches = len(api.patches)
        # One read fails for both (a network error, a 403, not JSON, or garbage):
        await g.step(hot=failure, marked=failure)
        assert g.value("swapwise_labeller_psi_read_errors_total") == 2
        assert len(api.patches) == patches and api.events == []
        assert g.labels("marked")[PRESSURE_LABEL] == "true"
        assert g.value("swapwise_labeller_memory_psi_avg10_percent", node="hot",
                       kind="some") is None  # no stale figure
        state = g.labeller.pressure["hot"]
        assert (state.high_since, state.marked) == (g.start + 10, False)  # window kept
        # The next good read completes the window begun before the failure (0 .. 60 s).
        await g.step(hot=50.0, marked=1.0)
        assert g.labels("hot")[PRESSURE_LABEL] == "true"
        assert g.value("swapwise_labeller_pressure_marked_nodes") == 2
        assert g.value("swapwise_labeller_psi_read_errors_total") == 2

    with caplog.at_level("INFO", logger="swapwise.labeller"):
        asyncio.run(scenario())
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert [r.__dict__["node"] for r in warnings] == ["hot", "marked"]
    assert warnings[1].__dict__["marked"] is True
    assert warnings[0].getMessage() == (
        "memory PSI unreadable; mark and windows left as they are")
    assert [r.__dict__["node"] for r in caplog.records
            if r.getMessage() == "memory PSI readable again"] == ["hot", "marked"]


def test_a_node_whose_psi_stays_unreadable_keeps_its_mark_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> Guarded:
        api = FakeKubelets(swap_node("n", labels={PRESSURE_LABEL: "true"}))
        g = Guarded(api)
        await g.begin()
        for _ in range(60):  # ten minutes without a usable Summary
            await g.step(n={"node": {"nodeName": "n"}, "pods": []})
        assert g.labels("n")[PRESSURE_LABEL] == "true"
        assert g.value("swapwise_labeller_psi_read_errors_total") == 60
        assert g.value("swapwise_labeller_pressure_marked_nodes") == 1
        # After the blind stretch, the clear window starts at the first good read.
        for _ in range(12):
            await g.step(n=1.0)
        assert g.labels("n")[PRESSURE_LABEL] == "true"
        await g.step(n=1.0)
        assert PRESSURE_LABEL not in g.labels("n")
        return g

    with caplog.at_level("WARNING", logger="swapwise.labeller"):
        asyncio.run(scenario())
    assert len(caplog.records) == 1
    assert caplog.records[0].__dict__["error"] == "the Summary has no node.memory object"


def test_a_deleted_node_is_forgotten() -> None:
    async def scenario() -> None:
        api = FakeKubelets(swap_node("n"), swap_node("other"))
        g = Guarded(api)
        await g.begin()
        for _ in range(6):
            await g.step(n=60.0, other=60.0)
        assert "n" in g.labeller.pressure
        gone = copy.deepcopy(api.nodes.pop("n"))
        g.labeller.apply_event("DELETED", gone)
        assert "n" not in g.labeller.pressure
        assert g.value("swapwise_labeller_memory_psi_avg10_percent", node="n",
                       kind="some") is None
        reads = api.summary_reads.count("n")
        await g.step(other=60.0)
        assert api.summary_reads.count("n") == reads  # not asked any more
        assert g.labels("other")[PRESSURE_LABEL] == "true"
        # A node of the same name comes back: a new window, from nothing.
        api.nodes["n"] = swap_node("n")
        g.labeller.apply_event("ADDED", copy.deepcopy(api.nodes["n"]))
        await g.labeller.reconcile_pending()
        for _ in range(6):
            await g.step(n=60.0, other=60.0)
        assert PRESSURE_LABEL not in g.labels("n")
        await g.step(n=60.0, other=60.0)
        assert g.labels("n")[PRESSURE_LABEL] == "true"
        # A fresh list without it forgets it too.
        del api.nodes["n"]
        g.labeller.replace_all((await api.list_nodes())[0])
        assert set(g.labeller.pressure) == {"other"}

    asyncio.run(scenario())


def test_a_node_that_stops_being_a_swap_node_loses_the_mark() -> None:
    async def scenario() -> None:
        api = FakeKubelets(swap_node("n"))
        g = Guarded(api)
        await g.begin()
        for _ in range(7):
            await g.step(n=60.0)
        assert g.labels("n")[PRESSURE_LABEL] == "true"
        noswap = copy.deepcopy(api.nodes["n"])
        noswap["metadata"]["labels"]["swapwise.io/swap-behavior"] = "NoSwap"
        api.nodes["n"] = noswap
        g.labeller.apply_event("MODIFIED", copy.deepcopy(noswap))
        await g.labeller.reconcile_pending()
        assert PRESSURE_LABEL not in g.labels("n") and SWAP not in g.labels("n")
        message = forced_clear("not a swap node (SwapBehaviorNoSwap)", g.clock.wall)
        assert g.note("n") == message
        assert api.events[-1] == ("n", "Normal", "SwapwiseMemoryPressureCleared", message)
        assert "n" not in g.labeller.pressure
        reads = len(api.summary_reads)
        await g.step(n=60.0)
        assert len(api.summary_reads) == reads  # no longer read

    asyncio.run(scenario())


def test_with_the_guard_off_a_mark_left_behind_is_removed_and_nothing_is_read() -> None:
    async def scenario() -> None:
        api = FakeKubelets(swap_node("n", labels={PRESSURE_LABEL: "true"}),
                           node("plain", labels={PRESSURE_LABEL: "true"}),
                           swap_node("other"))
        metrics = LabellerMetrics()
        labeller = Labeller(api, DEFAULT_LABEL, metrics, leading=lambda: True,
                            wall=lambda: T0, identity="me")
        labeller.replace_all((await api.list_nodes())[0])
        assert await labeller.read_pressure() == 0
        await labeller.reconcile_pending()
        assert api.summary_reads == []
        for name in ("n", "plain"):
            assert PRESSURE_LABEL not in api.nodes[name]["metadata"]["labels"]
            assert api.nodes[name]["metadata"]["annotations"][PRESSURE_ANNOTATION] == (
                "cleared: the pressure guard is off at 2026-01-01T12:00:00Z")
        assert [e[:3] for e in api.events] == [
            ("n", "Normal", "SwapwiseMemoryPressureCleared"),
            ("plain", "Normal", "SwapwiseMemoryPressureCleared")]
        assert PRESSURE_ANNOTATION not in (api.nodes["other"]["metadata"].get("annotations")
                                           or {})
        assert metrics.registry.get_sample_value(
            "swapwise_labeller_pressure_threshold_percent", {"bound": "mark"}) is None

    asyncio.run(scenario())


def test_followers_read_nothing_and_a_new_leader_starts_from_the_label() -> None:
    async def scenario() -> None:
        leading = True
        api = FakeKubelets(swap_node("n"))
        g = Guarded(api, leading=lambda: leading)
        await g.begin()
        for _ in range(7):
            await g.step(n=60.0)
        assert g.labels("n")[PRESSURE_LABEL] == "true"
        leading = False
        g.labeller.on_leadership(False)
        assert g.labeller.pressure == {}
        assert g.value("swapwise_labeller_pressure_marked_nodes") == 0
        assert g.value("swapwise_labeller_memory_psi_avg10_percent", node="n",
                       kind="some") is None
        reads, patches = len(api.summary_reads), len(api.patches)
        for _ in range(20):
            await g.step(n=0.0)
        assert (len(api.summary_reads), len(api.patches)) == (reads, patches)
        # Leading again (or another replica): the mark is kept for a whole clear window.
        leading = True
        g.labeller.on_leadership(True)
        await g.labeller.reconcile_pending()
        assert g.labeller.pressure["n"].marked
        assert g.value("swapwise_labeller_pressure_marked_nodes") == 1
        for _ in range(12):
            await g.step(n=0.0)
        assert g.labels("n")[PRESSURE_LABEL] == "true"
        await g.step(n=0.0)
        assert PRESSURE_LABEL not in g.labels("n")

    asyncio.run(scenario())


def test_a_failed_patch_is_retried_and_the_event_follows_the_write() -> None:
    async def scenario() -> None:
        api = FakeKubelets(swap_node("n"))
        g = Guarded(api)
        await g.begin()
        for _ in range(6):
            await g.step(n=60.0)
        api.failing.add("n")
        await g.step(n=60.0)
        assert PRESSURE_LABEL not in g.labels("n") and api.events == []
        assert g.labeller.pressure["n"].marked and "n" in g.labeller.pending
        api.failing.clear()
        await g.labeller.reconcile_pending()
        assert g.labels("n")[PRESSURE_LABEL] == "true"
        assert [e[2] for e in api.events] == ["SwapwiseMemoryPressure"]
        assert g.note("n") == g.labeller.pressure["n"].message

    asyncio.run(scenario())


def test_an_event_that_cannot_be_recorded_does_not_hold_up_the_mark(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        api = FakeKubelets(swap_node("n"))
        api.event_failure = OSError('events is forbidden: cannot create resource "events"')
        g = Guarded(api)
        await g.begin()
        for _ in range(7):
            await g.step(n=60.0)
        assert g.labels("n")[PRESSURE_LABEL] == "true"
        assert g.value("swapwise_labeller_pressure_marked_nodes") == 1

    with caplog.at_level("WARNING", logger="swapwise.labeller"):
        asyncio.run(scenario())
    [record] = caplog.records
    assert record.getMessage() == "could not record the Event"
    assert record.__dict__["reason"] == "SwapwiseMemoryPressure"


def test_with_the_taint_form_a_taint_added_meanwhile_is_kept() -> None:
    async def scenario() -> None:
        api = FakeKubelets(tainted(swap_node("n"), OTHER_TAINT, version="10"))
        g = Guarded(api, dataclasses.replace(SETTINGS, mark_with="taint"))
        await g.begin()
        for _ in range(6):
            await g.step(n=60.0)
        # Another controller taints the node; the labeller has not seen that event yet.
        late = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
        node_now = api.nodes["n"]
        node_now["spec"]["taints"].append(late)
        node_now["metadata"]["resourceVersion"] = str(int(node_now["metadata"][
            "resourceVersion"]) + 1)
        await g.step(n=60.0)  # the window is complete: the patch is refused (409)
        assert g.labeller.pressure["n"].marked and "n" in g.labeller.pending
        assert api.nodes["n"]["spec"]["taints"] == [OTHER_TAINT, late]
        assert g.value("swapwise_labeller_reconcile_errors_total") == 1
        g.labeller.apply_event("MODIFIED", copy.deepcopy(node_now))  # the watch catches up
        await g.labeller.reconcile_pending()
        assert api.nodes["n"]["spec"]["taints"] == [OTHER_TAINT, late, PRESSURE_TAINT]
        assert PRESSURE_LABEL not in g.labels("n")
        assert [e[2] for e in api.events] == ["SwapwiseMemoryPressure"]
        assert g.value("swapwise_labeller_pressure_marked_nodes") == 1
        for _ in range(13):
            await g.step(n=0.0)
        assert api.nodes["n"]["spec"]["taints"] == [OTHER_TAINT, late]
        assert [e[2] for e in api.events] == ["SwapwiseMemoryPressure",
                                              "SwapwiseMemoryPressureCleared"]

    asyncio.run(scenario())


def test_a_mark_removed_by_hand_is_put_back_while_the_pressure_lasts() -> None:
    async def scenario() -> None:
        api = FakeKubelets(swap_node("n"), swap_node("m", labels={PRESSURE_LABEL: "true"}))
        g = Guarded(api)
        await g.begin()
        for _ in range(7):
            await g.step(n=60.0, m=25.0)
        for name in ("n", "m"):  # kubectl label node N swapwise.io/memory-pressure-
            del api.nodes[name]["metadata"]["labels"][PRESSURE_LABEL]
            g.labeller.apply_event("MODIFIED", copy.deepcopy(api.nodes[name]))
        await g.labeller.reconcile_pending()
        assert g.labels("n")[PRESSURE_LABEL] == "true"
        assert g.note("n") == g.labeller.pressure["n"].message  # the transition's message
        assert g.labels("m")[PRESSURE_LABEL] == "true"
        assert g.note("m") == (
            "marked: kept, memory PSI some avg10 has not been below 10% for 120 s since it "
            f"was marked, at {rfc3339(g.clock.wall)}")

    asyncio.run(scenario())


def test_the_pressure_loop_reads_every_interval_until_stopped() -> None:
    async def scenario() -> int:
        api = FakeKubelets(swap_node("n"))
        api.summaries["n"] = summary("n", 1.0)
        labeller = Labeller(api, DEFAULT_LABEL, LabellerMetrics(), leading=lambda: True,
                            pressure=PressureSettings(interval=0.05))
        labeller.replace_all((await api.list_nodes())[0])
        await labeller.reconcile_pending()
        stop = asyncio.Event()
        task = asyncio.create_task(labeller.pressure_loop(stop))
        await asyncio.sleep(0.32)
        stop.set()
        await asyncio.wait_for(task, 1)
        return len(api.summary_reads)

    assert 5 <= asyncio.run(scenario()) <= 8


def test_a_read_that_hangs_holds_up_neither_the_other_nodes_nor_the_next_round() -> None:
    class Hanging(FakeKubelets):
        async def node_summary(self, name: str) -> Any:
            if name == "slow":
                self.summary_reads.append(name)
                await asyncio.Event().wait()  # until its timeout (here: cancelled)
            return await super().node_summary(name)

    async def scenario() -> tuple[int, int, bool]:
        api = Hanging(swap_node("slow"), swap_node("fast"))
        api.summaries["fast"] = summary("fast", 1.0)
        labeller = Labeller(api, DEFAULT_LABEL, LabellerMetrics(), leading=lambda: True,
                            pressure=PressureSettings(interval=0.05))
        labeller.replace_all((await api.list_nodes())[0])
        await labeller.reconcile_pending()
        stop = asyncio.Event()
        task = asyncio.create_task(labeller.pressure_loop(stop))
        await asyncio.sleep(0.32)
        stop.set()
        await asyncio.wait_for(task, 1)
        await asyncio.sleep(0)  # the cancelled read's callback
        return (api.summary_reads.count("fast"), api.summary_reads.count("slow"),
                not labeller.reading)

    fast, slow, none_left = asyncio.run(scenario())
    assert fast >= 5 and slow == 1  # one read in flight per node, never two
    assert none_left  # stopping cancels what is in flight


# ------------------------------------------------------------------- the node proxy


def test_the_summary_is_read_through_the_node_proxy_cpu_and_memory_only() -> None:
    seen: list[httpx2.Request] = []
    payload = json.loads((DATA / "kubelet-summary-cpu-memory.json").read_text())

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, json=payload)

    async def scenario() -> Any:
        return await proxy_client(handler).node_summary("swap-node-1")

    assert asyncio.run(scenario()) == payload
    [request] = seen
    assert request.method == "GET"
    assert str(request.url) == ("https://api.test/api/v1/nodes/swap-node-1/proxy/stats/summary"
                                "?only_cpu_and_memory=true")
    assert request.headers["Authorization"] == "Bearer t0k3n"


@pytest.mark.parametrize(("response", "message"), [
    (httpx2.Response(403, json={"kind": "Status", "message": 'nodes "n" is forbidden'}),
     'HTTP 403: nodes "n" is forbidden'),
    (httpx2.Response(200, text="<html>"), "Summary answer is not JSON"),
    (httpx2.Response(200, content=b'{"pods": "' + b"x" * (4 << 20) + b'"}'),
     "Summary answer larger than 4194304 bytes"),
])
def test_a_bad_summary_answer_is_an_error_with_its_reason(
    response: httpx2.Response, message: str
) -> None:
    async def scenario() -> None:
        with pytest.raises(KubeletSummaryError, match=re.escape(message)):
            await proxy_client(lambda _request: response).node_summary("n")

    asyncio.run(scenario())


def test_an_event_about_a_node_goes_to_default_and_names_the_node() -> None:
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(201, json=json.loads(request.content))

    async def scenario() -> None:
        await proxy_client(handler).create_event(
            {"metadata": {"name": "n1", "uid": "u-1"}}, "Warning", "SwapwiseMemoryPressure",
            "marked: x" * 200, "pod_7")

    asyncio.run(scenario())
    [request] = seen
    assert (request.method, request.url.path) == ("POST", "/api/v1/namespaces/default/events")
    body = json.loads(request.content)
    assert body["metadata"] == {"generateName": "n1.", "namespace": "default"}
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "n1",
                                      "uid": "u-1"}
    assert (body["type"], body["reason"], body["count"]) == (
        "Warning", "SwapwiseMemoryPressure", 1)
    assert len(body["message"]) == 1024
    assert body["source"] == {"component": "swapwise-labeller"}
    assert body["reportingInstance"] == "pod_7"


# ------------------------------------------------------------------------------- CLI


@pytest.mark.parametrize(("args", "message"), [
    (["--pressure-interval", "0"], "--pressure-interval must be greater than zero"),
    (["--pressure-mark-above", "5"], "0 < --pressure-clear-below <= --pressure-mark-above"),
    (["--pressure-clear-below", "0", "--pressure-guard"], "0 < --pressure-clear-below"),
    (["--pressure-mark-after", "-1"], "must not be negative"),
    (["--pressure-clear-after", "nan"], "must be finite numbers"),
    (["--label", f"{PRESSURE_LABEL}=true"], "is the pressure guard's mark"),
])
def test_label_nodes_refuses_bad_guard_options_before_connecting(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["label-nodes", *args]) == 1
    assert message in capsys.readouterr().err

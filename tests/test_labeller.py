"""The labeller's logic without a cluster: label decisions, lease rules, the reconcile loop.

The API server is replaced by in-memory fakes that keep its contract (resourceVersion
preconditions, 409 on a stale write, merge-patch semantics for labels), and time by a
fake clock, so election timing is exact rather than slept.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from starlette.testclient import TestClient

from webhook.cli import main
from webhook.labeller.controller import Labeller
from webhook.labeller.health import create_app
from webhook.labeller.labels import (
    DEFAULT_LABEL,
    Label,
    LabelChange,
    LabelError,
    desired_change,
    swap_capacity,
)
from webhook.labeller.lease import (
    Attempt,
    Conflict,
    Elector,
    LeaseRecord,
    Observation,
    Timing,
    claim,
    micro_now,
    released,
)
from webhook.labeller.metrics import LabellerMetrics

SWAP = "feature.node.kubernetes.io/memory-swap"
T0 = dt.datetime(2026, 1, 1, 12, 0, 0, 1, tzinfo=dt.UTC)


def node(name: str, capacity: Any = None, labels: dict[str, str] | None = None,
         info: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if info:
        status["nodeInfo"] = {"kubeletVersion": "v1.34.4"}
        if capacity is not None:
            status["nodeInfo"]["swap"] = {"capacity": capacity}
    return {"metadata": {"name": name, "labels": dict(labels or {})}, "status": status}


# ------------------------------------------------------------------------------ labels


def test_label_parse_accepts_prefixed_keys_and_empty_values() -> None:
    assert Label.parse(f"{SWAP}=true") == DEFAULT_LABEL
    assert Label.parse("swap=") == Label("swap", "")
    assert str(Label.parse("example.com/has-swap=yes")) == "example.com/has-swap=yes"


@pytest.mark.parametrize("text", [
    "no-equals", "=true", "Bad_Prefix.com/x=1", "/x=1", "x=-bad", "x=" + "v" * 64,
    "k" * 64 + "=1", "x=has space",
])
def test_label_parse_refuses_what_the_api_server_would(text: str) -> None:
    with pytest.raises(LabelError):
        Label.parse(text)


@pytest.mark.parametrize(("value", "expected"), [
    (34359738368, 34359738368), (0, 0), (None, 0), ("1Gi", 0), (True, 0), (-5, 0),
])
def test_swap_capacity_reads_only_a_positive_integer(value: Any, expected: int) -> None:
    assert swap_capacity(node("n", value)) == expected


def test_swap_capacity_of_a_node_without_status_is_zero() -> None:
    assert swap_capacity({"metadata": {"name": "n"}}) == 0
    assert swap_capacity(node("n", info=False)) == 0


def test_swap_node_without_label_gets_it_and_only_it() -> None:
    change = desired_change(node("a", 8 * 2**30, {"team": "x"}), DEFAULT_LABEL)
    assert change == LabelChange("a", "add", {"metadata": {"labels": {SWAP: "true"}}})


def test_swap_node_with_wrong_value_is_corrected() -> None:
    change = desired_change(node("a", 1, {SWAP: "false"}), DEFAULT_LABEL)
    assert change is not None and change.action == "add"


def test_labelled_swap_node_needs_nothing() -> None:
    assert desired_change(node("a", 1, {SWAP: "true"}), DEFAULT_LABEL) is None


@pytest.mark.parametrize("capacity", [0, None])
def test_node_whose_swap_went_away_loses_the_label(capacity: int | None) -> None:
    change = desired_change(node("b", capacity, {SWAP: "true", "team": "x"}), DEFAULT_LABEL)
    # JSON merge patch: null deletes this key; other labels are not in the patch at all.
    assert change == LabelChange("b", "remove", {"metadata": {"labels": {SWAP: None}}})


def test_other_values_and_unlabelled_plain_nodes_are_left_alone() -> None:
    assert desired_change(node("c", 0, {SWAP: "false"}), DEFAULT_LABEL) is None
    assert desired_change(node("c", 0), DEFAULT_LABEL) is None
    assert desired_change({"metadata": {}}, DEFAULT_LABEL) is None  # no name: nothing to patch


def test_custom_label_is_managed_instead_of_the_default() -> None:
    label = Label("example.com/swap", "yes")
    change = desired_change(node("a", 1, {SWAP: "true"}), label)
    assert change is not None
    assert change.patch == {"metadata": {"labels": {"example.com/swap": "yes"}}}


# ------------------------------------------------------------------------- lease rules


def test_micro_now_always_has_microseconds() -> None:
    # MicroTime needs six fractional digits; a zero microsecond would serialize without.
    assert micro_now().microsecond > 0


def test_claim_creates_renews_and_takes_over() -> None:
    first = claim(None, "a", T0, 15, expired=True)
    assert first == LeaseRecord("a", 15, T0, T0, 0)
    later = T0 + dt.timedelta(seconds=2)
    renewed = claim(first, "a", later, 15, expired=False)
    assert renewed == LeaseRecord("a", 15, T0, later, 0)  # acquireTime kept
    assert claim(renewed, "b", later, 15, expired=False) is None  # still validly held
    taken = claim(renewed, "b", later, 15, expired=True)
    assert taken == LeaseRecord("b", 15, later, later, 1)  # a transition


def test_a_released_lease_is_free_at_once() -> None:
    record = LeaseRecord("a", 15, T0, T0, 3, "7")
    empty = released(record, T0)
    assert (empty.holder, empty.duration, empty.transitions) == ("", 1, 3)
    taken = claim(empty, "b", T0, 15, expired=False)
    assert taken is not None and (taken.holder, taken.transitions) == ("b", 4)


def test_expiry_is_measured_from_when_a_change_was_seen_locally() -> None:
    seen = Observation()
    record = LeaseRecord("a", 10, T0, T0, 0, "1")
    seen.observe(record, now=100.0)
    seen.observe(LeaseRecord("a", 10, T0, T0, 0, "2"), now=105.0)  # same state, new RV
    assert not seen.expired(110.0)
    assert seen.expired(110.5)  # 100 + 10 < 110.5
    renewed = LeaseRecord("a", 10, T0, T0 + dt.timedelta(seconds=9), 0, "3")
    seen.observe(renewed, now=110.6)  # the holder renewed: the clock restarts
    assert not seen.expired(120.0)


def test_timing_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        Timing(lease_duration=10, renew_deadline=10, retry_period=2)


class FakeLeaseStore:
    """One Lease with the API server's optimistic concurrency."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0
        self.fail = False

    async def get(self) -> LeaseRecord | None:
        if self.fail:
            raise OSError("connection refused")
        return self.record

    def _store(self, record: LeaseRecord) -> LeaseRecord:
        self.version += 1
        self.record = LeaseRecord(record.holder, record.duration, record.acquire_time,
                                  record.renew_time, record.transitions, str(self.version))
        return self.record

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        if self.fail:
            raise OSError("connection refused")
        if self.record is not None:
            raise Conflict("already exists")
        return self._store(record)

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        if self.fail:
            raise OSError("connection refused")
        if self.record is None or record.resource_version != self.record.resource_version:
            raise Conflict("the object has been modified")
        return self._store(record)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.wall = T0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall += dt.timedelta(seconds=seconds)


TIMING = Timing(lease_duration=15, renew_deadline=10, retry_period=2)


def electors(store: FakeLeaseStore, clock: Clock) -> tuple[Elector, Elector, list[str]]:
    events: list[str] = []

    def make(name: str) -> Elector:
        return Elector(store, name, TIMING, clock=clock, wall=lambda: clock.wall,
                       on_change=lambda leading: events.append(f"{name}:{leading}"))

    return make("a"), make("b"), events


def test_only_one_of_two_candidates_leads_and_the_other_takes_over_after_expiry() -> None:
    async def scenario() -> None:
        store, clock = FakeLeaseStore(), Clock()
        a, b, events = electors(store, clock)
        await a.step()
        await b.step()
        assert a.leading() and not b.leading()
        assert events == ["a:True"]
        # a renews every period; b keeps seeing fresh renewals and never takes over.
        for _ in range(10):
            clock.advance(2)
            await a.step()
            await b.step()
            assert a.leading() and not b.leading()
        # a goes silent (partitioned): it stops acting after the renew deadline...
        clock.advance(10)
        assert not a.leading()
        await b.step()
        assert not b.leading()  # ...but b saw the last renewal only 10 s ago: not expired
        clock.advance(5.5)
        await b.step()  # 15.5 s since b saw the record change: expired, b takes over
        assert b.leading()
        assert store.record is not None
        assert (store.record.holder, store.record.transitions) == ("b", 1)
        # a comes back: the record names b, so a steps down at once.
        await a.step()
        assert not a.leading()
        assert events == ["a:True", "b:True", "a:False"]

    asyncio.run(scenario())


def test_a_newcomer_waits_a_full_duration_whatever_the_renew_time_says() -> None:
    async def scenario() -> None:
        store, clock = FakeLeaseStore(), Clock()
        a, b, _ = electors(store, clock)
        await a.step()
        clock.advance(60)  # a went silent long ago, by the renewTime in the record...
        await b.step()  # ...but b has only just seen it: it trusts its own clock
        assert not b.leading()
        clock.advance(15.5)
        await b.step()
        assert b.leading()

    asyncio.run(scenario())


def test_a_racing_write_loses_with_a_conflict() -> None:
    async def scenario() -> None:
        store, clock = FakeLeaseStore(), Clock()
        a, b, _ = electors(store, clock)
        await a.step()
        await b.step()  # b first sees a's record now...
        clock.advance(20)  # ...and a stays silent past the lease duration
        stale = store.record
        await b.step()  # b takes over first...
        assert b.leading()

        async def stale_get() -> LeaseRecord | None:
            return stale

        a.store = FakeLeaseStoreView(store, stale_get)
        # ...a read the old record before b wrote: its write is refused, it does not lead.
        assert await a.attempt() is Attempt.FAILED
        assert store.record is not None and store.record.holder == "b"

    asyncio.run(scenario())


class FakeLeaseStoreView(FakeLeaseStore):
    """The same store, but reads come from ``get`` (a stale cache)."""

    def __init__(self, inner: FakeLeaseStore, get: Any) -> None:
        self.inner = inner
        self._get = get

    async def get(self) -> LeaseRecord | None:
        result: LeaseRecord | None = await self._get()
        return result

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        return await self.inner.update(record)


def test_leader_keeps_acting_through_short_api_errors_then_stops() -> None:
    async def scenario() -> None:
        store, clock = FakeLeaseStore(), Clock()
        a, _, events = electors(store, clock)
        await a.step()
        store.fail = True
        clock.advance(2)
        await a.step()
        assert a.leading()  # 2 s without renewal < 10 s renew deadline
        clock.advance(8.5)
        await a.step()
        assert not a.leading()
        assert events == ["a:True", "a:False"]
        store.fail = False
        await a.step()  # its own record: it renews and leads again
        assert a.leading()

    asyncio.run(scenario())


def test_release_hands_over_without_waiting_for_expiry() -> None:
    async def scenario() -> None:
        store, clock = FakeLeaseStore(), Clock()
        a, b, _ = electors(store, clock)
        await a.step()
        await b.step()
        await a.release()
        assert not a.leading()
        assert store.record is not None and store.record.holder == ""
        await b.step()  # no waiting: a released holder is nobody
        assert b.leading()

    asyncio.run(scenario())


# ---------------------------------------------------------------------------- controller


class FakeNodes:
    """Nodes with merge-patch semantics for labels; patches can be made to fail."""

    def __init__(self, *nodes: dict[str, Any]) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.failing: set[str] = set()

    async def list_nodes(self) -> tuple[list[dict[str, Any]], str]:
        return list(self.nodes.values()), "1"

    async def watch_nodes(self, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        await asyncio.Event().wait()  # a watch with no events: blocks, like the real one
        yield "ADDED", {}

    async def patch_node_labels(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if name in self.failing:
            raise OSError("500 Internal Server Error")
        self.patches.append((name, patch))
        labels = self.nodes[name]["metadata"]["labels"]
        for key, value in patch["metadata"]["labels"].items():
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value
        return self.nodes[name]


def sample(metrics: LabellerMetrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    return 0.0 if value is None else value


def test_leader_labels_exactly_the_swap_nodes() -> None:
    async def scenario() -> None:
        api = FakeNodes(node("swap", 2**30), node("gone", 0, {SWAP: "true", "keep": "me"}),
                        node("plain"), node("done", 5, {SWAP: "true"}))
        metrics = LabellerMetrics()
        labeller = Labeller(api, DEFAULT_LABEL, metrics, leading=lambda: True)
        labeller.replace_all((await api.list_nodes())[0])
        assert await labeller.reconcile_pending() == 0
        assert api.patches == [
            ("gone", {"metadata": {"labels": {SWAP: None}}}),
            ("swap", {"metadata": {"labels": {SWAP: "true"}}}),
        ]
        assert api.nodes["gone"]["metadata"]["labels"] == {"keep": "me"}
        assert sample(metrics, "swapwise_labeller_labels_added_total") == 1
        assert sample(metrics, "swapwise_labeller_labels_removed_total") == 1
        assert sample(metrics, "swapwise_labeller_swap_nodes") == 2
        assert sample(metrics, "swapwise_labeller_nodes") == 4
        # A second pass finds nothing to do.
        labeller.resync()
        await labeller.reconcile_pending()
        assert len(api.patches) == 2

    asyncio.run(scenario())


def test_follower_patches_nothing_until_it_leads() -> None:
    async def scenario() -> None:
        api = FakeNodes(node("swap", 2**30))
        leader = False
        metrics = LabellerMetrics()
        labeller = Labeller(api, DEFAULT_LABEL, metrics, leading=lambda: leader)
        labeller.replace_all((await api.list_nodes())[0])
        await labeller.reconcile_pending()
        assert api.patches == []
        leader = True
        labeller.on_leadership(True)
        await labeller.reconcile_pending()
        assert [name for name, _ in api.patches] == ["swap"]
        assert sample(metrics, "swapwise_labeller_is_leader") == 1

    asyncio.run(scenario())


def test_watch_events_drive_add_and_remove() -> None:
    async def scenario() -> None:
        api = FakeNodes(node("n"))
        labeller = Labeller(api, DEFAULT_LABEL, LabellerMetrics(), leading=lambda: True)
        labeller.replace_all((await api.list_nodes())[0])
        await labeller.reconcile_pending()
        assert api.patches == []
        labeller.apply_event("MODIFIED", node("n", 4 * 2**30))
        await labeller.reconcile_pending()
        assert api.nodes["n"]["metadata"]["labels"] == {SWAP: "true"}
        labeller.apply_event("MODIFIED", node("n", 0, {SWAP: "true"}))
        await labeller.reconcile_pending()
        assert api.nodes["n"]["metadata"]["labels"] == {}
        labeller.apply_event("DELETED", node("n", 0))
        assert labeller.nodes == {} and labeller.pending == set()

    asyncio.run(scenario())


def test_failed_patch_is_counted_and_retried() -> None:
    async def scenario() -> None:
        api = FakeNodes(node("flaky", 2**30))
        api.failing.add("flaky")
        metrics = LabellerMetrics()
        labeller = Labeller(api, DEFAULT_LABEL, metrics, leading=lambda: True)
        labeller.replace_all((await api.list_nodes())[0])
        assert await labeller.reconcile_pending() == 1
        assert labeller.pending == {"flaky"}
        assert sample(metrics, "swapwise_labeller_reconcile_errors_total") == 1
        api.failing.clear()
        assert await labeller.reconcile_pending() == 0
        assert api.nodes["flaky"]["metadata"]["labels"] == {SWAP: "true"}

    asyncio.run(scenario())


def test_watch_loop_lists_then_marks_ready() -> None:
    async def scenario() -> None:
        api = FakeNodes(node("swap", 1))
        labeller = Labeller(api, DEFAULT_LABEL, LabellerMetrics(), leading=lambda: True)
        stop = asyncio.Event()
        task = asyncio.create_task(labeller.watch_loop(stop))
        for _ in range(100):
            if labeller.synced:
                break
            await asyncio.sleep(0.01)
        stop.set()
        task.cancel()
        assert labeller.synced and set(labeller.nodes) == {"swap"}

    asyncio.run(scenario())


# ------------------------------------------------------------------------------- http


def test_readiness_follows_the_cache_and_metrics_are_served() -> None:
    metrics = LabellerMetrics()
    ready = False
    app = create_app(metrics, ready=lambda: ready, leading=lambda: False)
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        response = client.get("/readyz")
        assert response.status_code == 503 and response.json() == {"ready": False,
                                                                     "leader": False}
        ready = True
        assert client.get("/readyz").status_code == 200
        metrics.labels_added.inc(3)
        body = client.get("/metrics").text
    assert "swapwise_labeller_labels_added_total 3.0" in body
    assert "swapwise_labeller_is_leader 0.0" in body
    assert body == generate_latest(metrics.registry).decode()


# -------------------------------------------------------------------------------- CLI


@pytest.mark.parametrize(("args", "message"), [
    (["--label", "no-value"], "'no-value': expected key=value"),
    (["--label", "x=not valid"], "the value must be"),
    (["--retry-period", "20"], "retry period < renew deadline < lease duration"),
    (["--metrics-port", "0"], "--metrics-port 0 is out of range"),
    (["--resync", "0"], "--resync must be greater than zero"),
])
def test_label_nodes_refuses_bad_options_before_connecting(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["label-nodes", *args]) == 1
    assert message in capsys.readouterr().err


def test_label_nodes_without_a_cluster_exits_1_with_the_reason(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "swapwise"
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "missing"), "HOME": str(tmp_path)}
    proc = subprocess.run([str(exe), "label-nodes"], capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    assert proc.returncode == 1
    assert f"Configuration file {tmp_path / 'missing'} not found" in proc.stderr

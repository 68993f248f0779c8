"""The reconcile loop: a watch-fed cache of Nodes, and patches while this replica leads.

Informer pattern, small: list once (readiness), then watch from that resourceVersion;
every event marks its node pending; the leader judges pending nodes and patches those
whose label or annotation is wrong. Followers keep the cache warm, so a new leader
reconciles at once (all nodes are marked pending when leadership is gained), and a
periodic resync repairs any drift and re-reads kubelet configurations.

With the pressure guard on, the leader also reads each swap node's memory PSI every
``interval`` seconds (:meth:`Labeller.pressure_loop`); a read that completes a mark or a
clear window (:mod:`.pressure`) marks the node pending, and the reconcile loop writes the
mark with the other labels, then records an Event.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Protocol

from webhook.base.logs import get_logger
from webhook.engine.pressure import PRESSURE_ANNOTATION, PRESSURE_LABEL, mark_forms
from webhook.labeller.kubelet import KubeletConfigCache
from webhook.labeller.labels import (
    Label,
    NodeChange,
    PressureWant,
    Reason,
    Source,
    Verdict,
    as_mapping,
    configz_swap_behavior,
    declared_behavior,
    desired_change,
    judge,
    node_name,
    swap_capacity,
)
from webhook.labeller.metrics import LabellerMetrics
from webhook.labeller.pressure import (
    PSI,
    NodePressure,
    PressureSettings,
    Transition,
    forced_clear,
    rfc3339,
    summary_memory_psi,
)

log = get_logger("labeller")

RETRY_MIN = 1.0  # seconds before a failed patch or watch is retried, doubling...
RETRY_MAX = 60.0  # ...up to this
KUBELET_READS = 8  # kubelet reads in flight at once (each goes API server -> kubelet)
MARKED_EVENT = "SwapwiseMemoryPressure"
CLEARED_EVENT = "SwapwiseMemoryPressureCleared"
_ERROR_CHARS = 300  # an error quoted in logs and messages is cut to this


class NodeAPI(Protocol):
    async def list_nodes(self) -> tuple[list[dict[str, Any]], str]: ...

    def watch_nodes(self, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        ...

    async def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]: ...

    async def kubelet_config(self, name: str) -> Any:
        """The decoded JSON of ``GET /api/v1/nodes/{name}/proxy/configz``."""
        ...

    async def node_summary(self, name: str) -> Any:
        """The decoded JSON of the kubelet's ``/stats/summary`` through the node proxy."""
        ...

    async def create_event(self, node: dict[str, Any], event_type: str, reason: str,
                           message: str, instance: str) -> None: ...


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    """Sleep, but wake up at once when ``stop`` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


def error_text(exc: BaseException) -> str:
    """One line for a log or an annotation: some exceptions (timeouts) have no message."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= _ERROR_CHARS else text[:_ERROR_CHARS] + "..."


class Labeller:
    def __init__(
        self,
        api: NodeAPI,
        label: Label,
        metrics: LabellerMetrics,
        leading: Callable[[], bool],
        resync_seconds: float = 300.0,
        source: Source = "declared",
        kubelet_config_ttl: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        pressure: PressureSettings | None = None,
        wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        identity: str = "",
    ) -> None:
        self.api = api
        self.label = label
        self.metrics = metrics
        self.leading = leading
        self.resync_seconds = resync_seconds
        self.source: Source = source
        self.clock = clock
        self.kubelets = KubeletConfigCache(kubelet_config_ttl, RETRY_MIN, RETRY_MAX)
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pending: set[str] = set()
        # The leader's latest judgement of each node: the by-reason and swap-node gauges.
        self.verdicts: dict[str, Verdict] = {}
        self.synced = False  # the first full list has been read
        self.wake = asyncio.Event()
        # The pressure guard (None: off): the leader's state per swap node, and the last
        # error of each node whose PSI could not be read (logged once per new error).
        self.guard = pressure
        self.wall = wall
        self.identity = identity
        self.pressure: dict[str, NodePressure] = {}
        self.psi_errors: dict[str, str] = {}
        self.reading: dict[str, asyncio.Task[Transition | None]] = {}  # reads in flight
        self.read_slots = asyncio.Semaphore(KUBELET_READS)
        for action in ("mark", "clear"):
            self.metrics.pressure_transitions.labels(action=action)
        if pressure is not None:
            self.metrics.pressure_threshold.labels(bound="mark").set(pressure.mark_above)
            self.metrics.pressure_threshold.labels(bound="clear").set(pressure.clear_below)
        self._gauges()  # every reason's series exists from the start, at 0
        self._changed()

    # -- the cache

    def _gauges(self) -> None:
        """The judgement gauges; called when verdicts change, not on every node event."""
        counts = Counter(v.reason for v in self.verdicts.values())
        self.metrics.swap_nodes.set(sum(v.swap is True for v in self.verdicts.values()))
        self.metrics.permille_nodes.set(
            sum(v.permille_value is not None for v in self.verdicts.values()))
        for reason in Reason:
            self.metrics.nodes_by_reason.labels(reason=reason.value).set(counts[reason])
        self.metrics.pressure_marked_nodes.set(sum(
            bool(mark_forms(self.nodes.get(name) or {})) for name in self.verdicts))

    def _changed(self) -> None:
        self.metrics.nodes.set(len(self.nodes))
        self.wake.set()

    def replace_all(self, nodes: list[dict[str, Any]]) -> None:
        """A fresh list: forget what is gone, mark everything pending."""
        self.nodes = {name: node for node in nodes if (name := node_name(node))}
        self.pending = set(self.nodes)
        self.verdicts = {k: v for k, v in self.verdicts.items() if k in self.nodes}
        self.kubelets.retain(set(self.nodes))
        for name in (set(self.pressure) | set(self.psi_errors)) - set(self.nodes):
            self.forget_pressure(name)
        self._gauges()
        self._changed()

    def apply_event(self, kind: str, node: dict[str, Any]) -> None:
        name = node_name(node)
        if not name:
            return
        if kind == "DELETED":
            self.nodes.pop(name, None)
            self.pending.discard(name)
            if self.verdicts.pop(name, None) is not None:
                self._gauges()
            self.kubelets.forget(name)
            self.forget_pressure(name)
        else:  # ADDED, MODIFIED
            self.nodes[name] = node
            self.pending.add(name)
        self._changed()

    def resync(self) -> None:
        """Look at every node again, and re-read kubelet configurations (on a timer, and
        when leadership is gained)."""
        self.pending |= set(self.nodes)
        self.kubelets.expire_all()
        self.wake.set()

    def on_leadership(self, leading: bool) -> None:
        self.metrics.is_leader.set(1 if leading else 0)
        if leading:
            self.resync()
        else:  # the new leader's judgements are the ones that count
            self.verdicts.clear()
            for name in set(self.pressure) | set(self.psi_errors):
                self.forget_pressure(name)
            self._gauges()

    # -- judging

    async def _read_kubelet(self, name: str, limit: asyncio.Semaphore) -> None:
        async with limit:
            node = self.nodes.get(name)
            if node is None or not self.leading():
                return
            try:
                behavior = configz_swap_behavior(await self.api.kubelet_config(name))
            except Exception as exc:  # unreachable, 403, bad JSON: no change, retried later
                error = error_text(exc)
                retry_in = self.kubelets.failed(name, node, error, self.clock())
                self.metrics.kubelet_config_errors.inc()
                log.warning("kubelet configz unavailable; node left unchanged", extra={
                    "node": name, "error": error, "retry_in": retry_in})
                return
            self.kubelets.answered(name, node, behavior, self.clock())

    async def read_kubelets(self, names: Iterable[str]) -> None:
        """Ask the kubelets of the swap nodes among ``names`` whose answer is due."""
        if self.source != "kubelet":
            return
        now = self.clock()
        due = [name for name in names
               if (node := self.nodes.get(name)) is not None and swap_capacity(node) > 0
               and self.kubelets.due(name, node, now)]
        limit = asyncio.Semaphore(KUBELET_READS)
        await asyncio.gather(*(self._read_kubelet(name, limit) for name in due))

    def verdict(self, name: str, node: dict[str, Any]) -> Verdict:
        if self.source == "kubelet":
            behavior, error = self.kubelets.known(name)
            return judge(node, behavior, "kubelet", error)
        return judge(node, declared_behavior(node), "declared")

    # -- acting

    async def reconcile_pending(self) -> int:
        """Judge and patch each pending node, while leading; return the nodes left to retry
        (failed patches, and kubelets that could not be asked)."""
        if not self.leading():
            return 0  # pending nodes stay pending for the next leader term
        await self.read_kubelets(sorted(self.pending))
        failed: set[str] = set()
        for name in sorted(self.pending):
            if not self.leading():
                break
            self.pending.discard(name)
            node = self.nodes.get(name)
            if node is None:
                continue
            verdict = self.verdict(name, node)
            self.verdicts[name] = verdict
            if verdict.swap is None:  # nothing known: change nothing, look again later
                failed.add(name)
                continue
            if verdict.swap is False:  # a node that is not a swap node is not watched
                self.forget_pressure(name)
            change = desired_change(node, verdict, self.label,
                                    self.pressure_want(name, verdict))
            if change is None:
                continue
            try:
                updated = await self.api.patch_node(name, change.patch)
            except Exception as exc:  # retried with backoff; deleted nodes drop out on DELETED
                self.metrics.reconcile_errors.inc()
                log.warning("patch failed", extra={"node": name, "action": change.label,
                                                   "reason": verdict.reason.value,
                                                   "error": error_text(exc)})
                failed.add(name)
                continue
            if name in self.nodes:
                self.nodes[name] = updated
            if change.label == "add":
                self.metrics.labels_added.inc()
            elif change.label == "remove":
                self.metrics.labels_removed.inc()
            permille = verdict.permille
            log.info("node updated", extra={
                "node": name, "label": str(self.label), "action": change.label,
                "swap_node": verdict.swap, "reason": verdict.reason.value,
                "permille_action": change.permille,
                # What the per-mille label is computed from (swap nodes only).
                "swap_bytes": permille.swap if permille else None,
                "memory_bytes": permille.memory if permille else None,
                "permille": verdict.permille_value,
                "pressure_action": change.pressure,
                "why": verdict.message,
            })
            if change.pressure in ("mark", "clear"):
                await self._pressure_changed(name, updated, change)
        self.pending |= failed
        self._gauges()
        return len(failed)

    # -- the pressure guard

    def forget_pressure(self, name: str) -> None:
        """Drop a node's guard state and PSI series (deleted, not a swap node, not leading)."""
        self.pressure.pop(name, None)
        self.psi_errors.pop(name, None)
        for kind in ("some", "full"):
            with contextlib.suppress(KeyError):
                self.metrics.memory_psi.remove(name, kind)

    def tracker(self, name: str) -> NodePressure | None:
        """The node's guard state; a node not seen yet starts in the state its label says."""
        if self.guard is None:
            return None
        state = self.pressure.get(name)
        if state is None:
            marked = bool(mark_forms(self.nodes.get(name) or {}))
            state = self.pressure[name] = NodePressure(self.guard, marked)
        return state

    def pressure_want(self, name: str, verdict: Verdict) -> PressureWant | None:
        """Must the node carry the memory-pressure mark? None: leave it as it is."""
        if verdict.swap is None:
            return None
        if self.guard is None:  # a mark left from when it was on would bar the node forever
            return PressureWant(False, forced_clear("the pressure guard is off", self.wall()))
        if not verdict.swap:
            return PressureWant(False, forced_clear(
                f"not a swap node ({verdict.reason.value})", self.wall()))
        state = self.tracker(name)
        assert state is not None
        message = state.message if state.message.startswith("marked: " if state.marked
                                                             else "cleared: ") else ""
        if not message:  # the mark was changed behind the guard's back: put it right
            message = (forced_clear("the guard has not marked it", self.wall())
                       if not state.marked else
                       f"marked: kept, memory PSI some avg10 has not been below "
                       f"{self.guard.clear_below:g}% for {self.guard.clear_after:g} s since "
                       f"it was marked, at {rfc3339(self.wall())}")
        return PressureWant(state.marked, message, self.guard.mark_with)

    def _reads_psi(self, name: str) -> bool:
        verdict = self.verdicts.get(name)
        return (self.guard is not None and self.leading() and name in self.nodes
                and verdict is not None and verdict.swap is True)

    def _psi_failed(self, name: str, exc: BaseException) -> None:
        error = error_text(exc)
        self.metrics.psi_read_errors.inc()
        for kind in ("some", "full"):  # a stale figure would read as current
            with contextlib.suppress(KeyError):
                self.metrics.memory_psi.remove(name, kind)
        state = self.pressure.get(name)
        if state is not None:
            state.missed()
        extra = {"node": name, "error": error, "marked": bool(state and state.marked)}
        if self.psi_errors.get(name) != error:  # once per new error, not every interval
            log.warning("memory PSI unreadable; mark and windows left as they are", extra=extra)
        else:
            log.debug("memory PSI unreadable", extra=extra)
        self.psi_errors[name] = error

    async def _read_psi(self, name: str, limit: asyncio.Semaphore) -> Transition | None:
        async with limit:
            if not self._reads_psi(name):
                return None
            asked = self.clock()
            try:
                psi = summary_memory_psi(await self.api.node_summary(name), name)
            except Exception as exc:  # unreachable, 403, not JSON, no PSI: counted, no change
                self._psi_failed(name, exc)
                return None
        if not self._reads_psi(name):  # deleted, no longer a swap node, or not leading
            return None
        if self.psi_errors.pop(name, None) is not None:
            log.info("memory PSI readable again", extra={"node": name})
        self.metrics.memory_psi.labels(node=name, kind="some").set(psi.some)
        self.metrics.memory_psi.labels(node=name, kind="full").set(psi.full)
        state = self.tracker(name)
        assert state is not None
        now = self.clock()
        transition = state.observe(psi, now, self.wall())
        # Each answer, for whoever must tell the kubelet's lag from the guard's (tests/node).
        log.debug("memory PSI read", extra={
            "node": name, "some_avg10": psi.some, "some_avg60": psi.some_avg60,
            "sampled": psi.sampled, "took_s": round(now - asked, 3),
            "high_for_s": None if state.high_since is None else round(now - state.high_since, 1),
            "low_for_s": None if state.low_since is None else round(now - state.low_since, 1),
        })
        if transition is not None:  # the reconcile loop writes it
            self.pending.add(name)
            self.wake.set()
        return transition

    def start_reads(self) -> list[asyncio.Task[Transition | None]]:
        """Start a read of every swap node not being read already (leader only; at most
        ``KUBELET_READS`` in flight). A node whose read hangs until its timeout holds up
        neither the others nor the next round: it is just not read again meanwhile."""
        if self.guard is None or not self.leading():
            return []
        started = []
        for name in sorted(self.nodes):
            if name in self.reading or not self._reads_psi(name):
                continue
            task = asyncio.create_task(self._read_psi(name, self.read_slots), name=f"psi {name}")
            self.reading[name] = task

            def done(_task: asyncio.Task[Transition | None], name: str = name) -> None:
                self.reading.pop(name, None)

            task.add_done_callback(done)
            started.append(task)
        return started

    async def read_pressure(self) -> int:
        """One round, waited for: how many nodes must now be marked or cleared."""
        results = await asyncio.gather(*self.start_reads())
        return sum(result is not None for result in results)

    async def _pressure_changed(self, name: str, node: dict[str, Any],
                                change: NodeChange) -> None:
        """After a patch that put the mark on or took it off: metric, log line, Event."""
        marked = change.pressure == "mark"
        message = str(as_mapping(change.patch["metadata"].get("annotations")).get(
            PRESSURE_ANNOTATION, ""))
        self.metrics.pressure_transitions.labels(action=change.pressure).inc()
        state = self.pressure.get(name)
        last: PSI | None = state.last if state is not None else None
        log.info("memory pressure mark set" if marked else "memory pressure mark cleared", extra={
            "node": name, "label": PRESSURE_LABEL,
            "form": self.guard.mark_with if self.guard is not None else None,
            "some_avg10": last.some if last else None, "full_avg10": last.full if last else None,
            "why": message,
        })
        reason, kind = (MARKED_EVENT, "Warning") if marked else (CLEARED_EVENT, "Normal")
        try:
            await self.api.create_event(node, kind, reason, message, self.identity)
        except Exception as exc:  # the mark is what matters; the Event only tells of it
            log.warning("could not record the Event", extra={
                "node": name, "reason": reason, "error": error_text(exc)})

    async def pressure_loop(self, stop: asyncio.Event) -> None:
        """Every ``interval`` seconds (start to start), read the swap nodes' memory PSI."""
        if self.guard is None:
            return
        loop = asyncio.get_running_loop()
        try:
            while not stop.is_set():
                started = loop.time()
                self.start_reads()
                await _sleep(stop, max(self.guard.interval - (loop.time() - started), 0.0))
        finally:
            for task in list(self.reading.values()):
                task.cancel()

    # -- loops

    async def watch_loop(self, stop: asyncio.Event) -> None:
        """List, then watch from the list's resourceVersion; relist after any failure."""
        delay = RETRY_MIN
        while not stop.is_set():
            try:
                nodes, version = await self.api.list_nodes()
                self.replace_all(nodes)
                if not self.synced:
                    log.info("nodes listed", extra={"nodes": len(nodes)})
                self.synced = True
                delay = RETRY_MIN
                async for kind, node in self.api.watch_nodes(version):
                    self.apply_event(kind, node)
                await _sleep(stop, RETRY_MIN)  # the watch ended without error: relist
            except Exception as exc:  # 410 Gone, API server restarts, network: relist
                self.metrics.watch_restarts.inc()
                log.warning("node watch failed; relisting", extra={"error": str(exc),
                                                                   "retry_in": delay})
                await _sleep(stop, delay)
                delay = min(delay * 2, RETRY_MAX)

    async def reconcile_loop(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        next_resync = loop.time() + self.resync_seconds
        delay = RETRY_MIN
        timeout = self.resync_seconds
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout)
            self.wake.clear()
            if stop.is_set():
                break
            if loop.time() >= next_resync:
                self.resync()
                next_resync = loop.time() + self.resync_seconds
            if await self.reconcile_pending():
                timeout = delay
                delay = min(delay * 2, RETRY_MAX)
            else:
                delay = RETRY_MIN
                timeout = max(next_resync - loop.time(), 0.0)

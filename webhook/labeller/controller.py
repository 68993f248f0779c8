"""The reconcile loop: a watch-fed cache of Nodes, and patches while this replica leads.

Informer pattern, small: list once (readiness), then watch from that resourceVersion;
every event marks its node pending; the leader judges pending nodes and patches those
whose label or annotation is wrong. Followers keep the cache warm, so a new leader
reconciles at once (all nodes are marked pending when leadership is gained), and a
periodic resync repairs any drift and re-reads kubelet configurations.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Protocol

from webhook.labeller.kubelet import KubeletConfigCache
from webhook.labeller.labels import (
    Label,
    Reason,
    Source,
    Verdict,
    configz_swap_behavior,
    declared_behavior,
    desired_change,
    judge,
    node_name,
    swap_capacity,
)
from webhook.labeller.metrics import LabellerMetrics
from webhook.logs import get_logger

log = get_logger("labeller")

RETRY_MIN = 1.0  # seconds before a failed patch or watch is retried, doubling...
RETRY_MAX = 60.0  # ...up to this
KUBELET_READS = 8  # configz reads in flight at once (each goes API server -> kubelet)
_ERROR_CHARS = 300  # an error quoted in logs and messages is cut to this


class NodeAPI(Protocol):
    async def list_nodes(self) -> tuple[list[dict[str, Any]], str]: ...

    def watch_nodes(self, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        ...

    async def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]: ...

    async def kubelet_config(self, name: str) -> Any:
        """The decoded JSON of ``GET /api/v1/nodes/{name}/proxy/configz``."""
        ...


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

    def _changed(self) -> None:
        self.metrics.nodes.set(len(self.nodes))
        self.wake.set()

    def replace_all(self, nodes: list[dict[str, Any]]) -> None:
        """A fresh list: forget what is gone, mark everything pending."""
        self.nodes = {name: node for node in nodes if (name := node_name(node))}
        self.pending = set(self.nodes)
        self.verdicts = {k: v for k, v in self.verdicts.items() if k in self.nodes}
        self.kubelets.retain(set(self.nodes))
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
            change = desired_change(node, verdict, self.label)
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
                "why": verdict.message,
            })
        self.pending |= failed
        self._gauges()
        return len(failed)

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

"""The reconcile loop: a watch-fed cache of Nodes, and patches while this replica leads.

Informer pattern, small: list once (readiness), then watch from that resourceVersion;
every event marks its node pending; the leader patches pending nodes whose label is
wrong. Followers keep the cache warm, so a new leader reconciles at once (all nodes are
marked pending when leadership is gained), and a periodic resync repairs any drift.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from webhook.labeller.labels import Label, desired_change, node_name, swap_capacity
from webhook.labeller.metrics import LabellerMetrics
from webhook.server.logs import get_logger

log = get_logger("labeller")

RETRY_MIN = 1.0  # seconds before a failed patch or watch is retried, doubling...
RETRY_MAX = 60.0  # ...up to this


class NodeAPI(Protocol):
    async def list_nodes(self) -> tuple[list[dict[str, Any]], str]: ...

    def watch_nodes(self, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        ...

    async def patch_node_labels(self, name: str, patch: dict[str, Any]) -> dict[str, Any]: ...


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    """Sleep, but wake up at once when ``stop`` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


class Labeller:
    def __init__(
        self,
        api: NodeAPI,
        label: Label,
        metrics: LabellerMetrics,
        leading: Callable[[], bool],
        resync_seconds: float = 300.0,
    ) -> None:
        self.api = api
        self.label = label
        self.metrics = metrics
        self.leading = leading
        self.resync_seconds = resync_seconds
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pending: set[str] = set()
        self.synced = False  # the first full list has been read
        self.wake = asyncio.Event()

    # -- the cache

    def _changed(self) -> None:
        self.metrics.nodes.set(len(self.nodes))
        self.metrics.swap_nodes.set(sum(swap_capacity(n) > 0 for n in self.nodes.values()))
        self.wake.set()

    def replace_all(self, nodes: list[dict[str, Any]]) -> None:
        """A fresh list: forget what is gone, mark everything pending."""
        self.nodes = {name: node for node in nodes if (name := node_name(node))}
        self.pending = set(self.nodes)
        self._changed()

    def apply_event(self, kind: str, node: dict[str, Any]) -> None:
        name = node_name(node)
        if not name:
            return
        if kind == "DELETED":
            self.nodes.pop(name, None)
            self.pending.discard(name)
        else:  # ADDED, MODIFIED
            self.nodes[name] = node
            self.pending.add(name)
        self._changed()

    def resync(self) -> None:
        """Look at every node again (on a timer, and when leadership is gained)."""
        self.pending |= set(self.nodes)
        self.wake.set()

    def on_leadership(self, leading: bool) -> None:
        self.metrics.is_leader.set(1 if leading else 0)
        if leading:
            self.resync()

    # -- acting

    async def reconcile_pending(self) -> int:
        """Patch each pending node whose label is wrong, while leading; return failures."""
        failed: set[str] = set()
        for name in sorted(self.pending):
            if not self.leading():
                break  # pending nodes stay pending for the next leader term
            self.pending.discard(name)
            node = self.nodes.get(name)
            change = desired_change(node, self.label) if node is not None else None
            if change is None:
                continue
            try:
                updated = await self.api.patch_node_labels(name, change.patch)
            except Exception as exc:  # retried with backoff; deleted nodes drop out on DELETED
                self.metrics.reconcile_errors.inc()
                log.warning("patch failed", extra={"node": name, "action": change.action,
                                                   "error": str(exc)})
                failed.add(name)
                continue
            if name in self.nodes:
                self.nodes[name] = updated
            if change.action == "add":
                self.metrics.labels_added.inc()
            else:
                self.metrics.labels_removed.inc()
            log.info(f"label {change.action}", extra={
                "node": name, "label": str(self.label), "swap_capacity": swap_capacity(node or {}),
            })
        self.pending |= failed
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

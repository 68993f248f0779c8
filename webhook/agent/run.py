"""The node agent's loops: one thread watches the Node, one reads the kernel and decides.

- The *watcher* keeps the latest copy of this node only (a watch with ``fieldSelector
  metadata.name``, restarted from its resourceVersion when the server ends it, read afresh
  once per ``resync``). Its retries back off and reset only after progress: on thousands of
  nodes a tight loop would be a denial of service on the API server.
- The *main loop* samples PSI (once a second, or woken by kernel triggers while calm), reads
  ``/proc/swaps`` every ``facts_interval`` and the kubelet's ``/configz`` every
  ``behavior_interval``, and patches the Node only when :mod:`.decide` says something differs.

On SIGTERM the agent takes its pressure marks off before it exits: an uninstalled agent
must not leave a node closed to reshaped pods forever. The swap labels stay (they are facts).
"""

from __future__ import annotations

import contextlib
import http.server
import math
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from webhook.agent.agent_metrics import AgentMetrics
from webhook.agent.decide import Behavior, MarkWant, Source, Verdict, desired_change, judge
from webhook.agent.kernel import (
    HostPaths,
    KernelReadError,
    PsiTrigger,
    Resource,
    SwapFacts,
    read_psi,
    read_swap,
    wait_for_triggers,
)
from webhook.agent.kubelet import ConfigzError, Kubelet
from webhook.agent.nodeapi import ApiError, NodeApi
from webhook.agent.stall import CPU_DEFAULTS, MEMORY_DEFAULTS, MarkState, Thresholds
from webhook.base.logs import get_logger
from webhook.base.upstream import Backoff
from webhook.engine.nodes import as_mapping, declared_behavior
from webhook.engine.pressure import CPU_MARK, MARKS, MEMORY_MARK, Mark, MarkForm

log = get_logger("node-agent")

RESOURCE_MARK: dict[Resource, Mark] = {"memory": MEMORY_MARK, "cpu": CPU_MARK}


@dataclass(frozen=True)
class AgentOptions:
    node: str
    source: Source = "declared"
    zram_backing: Fraction = Fraction(0)
    pressure: bool = True
    # Which resources are marked (both by default); a resource left out has its mark removed.
    resources: tuple[Resource, ...] = ("memory", "cpu")
    mark_with: MarkForm = "label"
    thresholds: dict[Resource, Thresholds] = field(
        default_factory=lambda: {"memory": MEMORY_DEFAULTS, "cpu": CPU_DEFAULTS})
    facts_interval: float = 10.0  # seconds between reads of /proc/swaps
    behavior_interval: float = 60.0  # seconds between reads of the kubelet's /configz
    calm_interval: float = 10.0  # with kernel triggers armed: seconds between calm samples
    watch_seconds: tuple[int, int] = (1800, 3600)  # each watch's timeoutSeconds, drawn
    watch_idle: float = 300.0  # seconds without a byte (bookmarks come ~1/min): dead
    resync: float = 3600.0  # seconds between fresh reads of the Node
    backoff: tuple[float, float] = (1.0, 300.0)  # first and longest retry delay, seconds


def backoff(options: AgentOptions) -> Backoff:
    """Delays that double from ``options.backoff[0]`` to ``[1]`` with jitter, reset only by
    progress (webhook/base/upstream.py). Each retry is logged by :func:`retry`, with its
    fields."""
    first, longest = options.backoff
    return Backoff(first, longest, report=lambda _text: None)


def retry(retries: Backoff, message: str, what: str, why: str) -> float:
    """Count a failure of ``what``; log it with the delay; return the delay."""
    delay = retries.failed(what, why)
    log.warning(message, extra={"error": why[:300], "retry_in_s": round(delay, 1),
                                "failures": retries.failures})
    return delay


class Waker:
    """A pipe the watcher writes to, so the main loop's ``poll`` wakes on a Node change."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self.write_fd, b"\0")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.read_fd, 4096):
                pass


class NodeWatcher:
    """The latest copy of one Node, kept by a watch; None until the first read."""

    def __init__(self, api: NodeApi, options: AgentOptions, stop: threading.Event,
                 on_change: Callable[[], None], metrics: AgentMetrics) -> None:
        self.api = api
        self.options = options
        self.stop = stop
        self.on_change = on_change
        self.metrics = metrics
        self._lock = threading.Lock()
        self._node: dict[str, Any] | None = None

    @property
    def node(self) -> dict[str, Any] | None:
        with self._lock:
            return self._node

    def set(self, node: dict[str, Any] | None) -> None:
        with self._lock:
            self._node = node
        self.on_change()

    def run(self) -> None:
        name = self.options.node
        retries = backoff(self.options)
        version: str | None = None
        fresh_at = -math.inf
        while not self.stop.is_set():
            started = time.monotonic()
            moved = False  # progress: the node's resourceVersion moved, or a long watch
            try:
                if version is None or started - fresh_at >= self.options.resync:
                    node = self.api.get(name)
                    version = str(as_mapping(node.get("metadata")).get("resourceVersion", ""))
                    fresh_at = started
                    self.set(node)
                seconds = random.randint(*self.options.watch_seconds)
                for kind, obj in self.api.watch(name, version, seconds, self.options.watch_idle):
                    if self.stop.is_set():
                        return
                    if kind == "ERROR":
                        code = obj.get("code")
                        raise ApiError(code if isinstance(code, int) else 0,
                                       str(obj.get("message", "watch error"))[:300])
                    self.metrics.node_events.inc()
                    seen = str(as_mapping(obj.get("metadata")).get("resourceVersion", ""))
                    if seen and seen != version:
                        version, moved = seen, True
                    if kind in ("ADDED", "MODIFIED"):
                        self.set(obj)
                    elif kind == "DELETED":
                        version = None
                if moved or time.monotonic() - started >= 60:
                    retries.progressed()
                    continue
                delay = retry(retries, "node watch ended at once; watching again later",
                              "the node watch", "it ended at once, with nothing new")
            except ApiError as exc:
                if exc.status == 410:
                    version = None  # too old: read the node afresh, after the delay
                if moved:
                    retries.progressed()
                delay = retry(retries, "node read or watch failed; retrying later",
                              "the node read or watch", str(exc))
            self.metrics.watch_restarts.inc()
            self.stop.wait(delay)


class HealthServer(http.server.ThreadingHTTPServer):
    daemon_threads = True


def health_handler(agent: Agent) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                ok = time.monotonic() - agent.ticked < 60
                self._answer(200 if ok else 503, b"ok\n" if ok else b"main loop stalled\n")
            elif self.path == "/readyz":
                ok = agent.synced
                self._answer(200 if ok else 503, b"ok\n" if ok else b"not synced yet\n")
            elif self.path == "/metrics":
                self._answer(200, generate_latest(agent.metrics.registry), CONTENT_TYPE_LATEST)
            else:
                self._answer(404, b"not found\n")

        def _answer(self, status: int, body: bytes, kind: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return  # probes every few seconds are not news

    return Handler


class Agent:
    def __init__(self, options: AgentOptions, api: NodeApi, paths: HostPaths,
                 kubelet: Kubelet | None = None, kubelet_factory: Callable[
                     [dict[str, Any]], Kubelet] | None = None) -> None:
        self.options = options
        self.api = api
        self.paths = paths
        self.kubelet = kubelet
        self.kubelet_factory = kubelet_factory
        self.metrics = AgentMetrics()
        self.stop = threading.Event()
        self.waker = Waker()
        self.watcher = NodeWatcher(api, options, self.stop, self.waker.wake, self.metrics)
        marked = options.resources if options.pressure else ()
        self.states: dict[Resource, MarkState] = {
            resource: MarkState(options.thresholds[resource]) for resource in marked}
        self.wants: dict[Mark, MarkWant | None] = {
            mark: None if mark.resource in marked else
            MarkWant(False, f"cleared: {'' if not options.pressure else mark.resource + ' '}"
                     "pressure marks off")
            for mark in MARKS}
        self.triggers: dict[Resource, PsiTrigger] = {}
        self.swap: SwapFacts | None = None
        self.behavior: Behavior | None = None
        self.swap_at = self.behavior_at = -1e18
        self.patch_backoff = backoff(options)
        self.patch_after = 0.0
        self.ticked = time.monotonic()
        self.synced = False
        self.restored = False
        for resource, t in options.thresholds.items():
            self.metrics.threshold.labels(resource, "mark").set(t.mark_above)
            self.metrics.threshold.labels(resource, "clear").set(t.clear_below)

    # -- the kernel

    def arm_triggers(self) -> None:
        """Kernel triggers on the node's PSI files, where the kernel lets this process
        create them (see :class:`PsiTrigger`); else the loop reads once a second."""
        for resource in self.states:
            t = self.options.thresholds[resource]
            if t.mark_window > 10:
                continue  # the kernel watches windows of at most 10 s
            window = int(t.mark_window * 1e6)
            trigger = PsiTrigger(self.paths.pressure(resource), int(window * t.mark_above / 100),
                                 window)
            try:
                trigger.open()
            except OSError as exc:
                log.info("PSI triggers not available; reading PSI once a second",
                         extra={"resource": resource, "error": str(exc)[:200]})
                self.close_triggers()
                break
            self.triggers[resource] = trigger
        self.metrics.triggers.set(1 if self.triggers else 0)

    def close_triggers(self) -> None:
        for trigger in self.triggers.values():
            trigger.close()
        self.triggers.clear()

    def sample(self, now: float, fired: set[Resource]) -> None:
        """One PSI reading per resource, into the marks wanted."""
        if not self.options.pressure:
            return
        for resource, state in self.states.items():
            try:
                psi = read_psi(self.paths.pressure(resource))
            except KernelReadError as exc:
                self.metrics.kernel_errors.inc()
                log.warning("PSI unreadable", extra={"resource": resource, "error": str(exc)})
                continue
            decision = state.observe(now, psi.some_total, triggered=resource in fired)
            t = state.thresholds
            mark_share = state.window.share(t.mark_window)
            if mark_share is not None:
                self.metrics.share.labels(resource, "node").set(round(mark_share, 2))
            pods = self._kubepods_share(resource)
            mark = RESOURCE_MARK[resource]
            if decision.change is not None or self.wants[mark] is None:
                figures = (f"{resource} some {_percent(decision.share)} of the last "
                           f"{decision.window:g} s" + (f", kubepods {_percent(pods)}"
                                                       if pods is not None else ""))
                if decision.change == "marked":
                    source = ("kernel PSI trigger" if resource in fired else "kernel PSI")
                    message = (f"marked: {figures} (marks at {t.mark_above:g} %; {source}, "
                               "swapwise node-agent)")
                else:
                    message = (f"cleared: {figures} (clears below {t.clear_below:g} % over "
                               f"{t.clear_window:g} s; kernel PSI, swapwise node-agent)")
                self.wants[mark] = MarkWant(decision.marked, message)
                if decision.change is not None:
                    self.metrics.transitions.labels(resource, decision.change).inc()
                    log.info(f"{resource} pressure {decision.change}",
                             extra={"resource": resource, "share_percent": decision.share,
                                    "window_s": decision.window, "kubepods_percent": pods,
                                    "trigger": resource in fired})
            self.metrics.marked.labels(resource).set(1 if decision.marked else 0)

    def _kubepods_share(self, resource: Resource) -> float | None:
        """The pods' own stall figure (avg10), for the evidence; None where unreadable."""
        path = self.paths.kubepods_pressure(resource)
        if path is None:
            return None
        try:
            psi = read_psi(path)
        except KernelReadError:
            return None
        self.metrics.share.labels(resource, "kubepods").set(psi.some_avg10)
        return psi.some_avg10

    def read_facts(self, now: float) -> None:
        if now - self.swap_at >= self.options.facts_interval:
            self.swap_at = now
            try:
                self.swap = read_swap(self.paths)
            except KernelReadError as exc:
                self.metrics.kernel_errors.inc()
                log.warning("/proc/swaps unreadable", extra={"error": str(exc)})
            if self.swap is not None:
                for kind in ("disk", "zram"):
                    self.metrics.swap_bytes.labels(kind).set(self.swap.total(kind))
        node = self.watcher.node
        if self.options.source == "declared":
            if node is not None:
                self.behavior = Behavior(declared_behavior(node), "declared")
            return
        if now - self.behavior_at < self.options.behavior_interval:
            return
        if self.kubelet is None and node is not None and self.kubelet_factory is not None:
            self.kubelet = self.kubelet_factory(node)
        if self.kubelet is None:
            return
        self.behavior_at = now
        try:
            self.behavior = Behavior(self.kubelet.swap_behavior(), "kubelet")
        except ConfigzError as exc:
            self.metrics.kubelet_errors.inc()
            log.warning("kubelet configz unreadable", extra={"error": str(exc)[:300]})
            self.behavior = Behavior(None, "kubelet", str(exc)[:300])

    # -- the Node

    def verdict(self, node: dict[str, Any]) -> Verdict:
        if self.swap is None or self.behavior is None:
            return Verdict(None, "unknown: not read yet")
        return judge(node, self.swap, self.behavior, self.options.zram_backing)

    def sync(self, now: float) -> None:
        node = self.watcher.node
        if node is None or now < self.patch_after:
            return
        verdict = self.verdict(node)
        self.metrics.swap_node.set(-1 if verdict.swap is None else int(verdict.swap))
        if verdict.facts is not None:
            permille = verdict.facts.permille
            self.metrics.permille.set(permille if verdict.swap and permille is not None else -1)
        change = desired_change(node, verdict, self.wants, self.options.mark_with)
        if change is None:
            self.synced = self.synced or verdict.swap is not None
            return
        try:
            updated = self.api.patch(change.node, change.patch)
        except ApiError as exc:
            conflict = exc.status == 409
            self.metrics.patches.labels("conflict" if conflict else "error").inc()
            # A conflict is no progress either: something keeps changing the taints, or a
            # proxy answers 409; the next try reads the node afresh, after the delay.
            self.patch_after = now + retry(self.patch_backoff, "node patch failed",
                                           "the node patch", str(exc))
            if conflict:
                with contextlib.suppress(ApiError):
                    self.watcher.set(self.api.get(change.node))
            return
        self.patch_backoff.progressed()
        self.metrics.patches.labels("ok").inc()
        self.watcher.set(updated)
        self.synced = True
        log.info("node patched", extra=change.summary)

    # -- the loop

    def restore(self) -> None:
        """A restarted agent keeps a mark the node carries until the pressure has been low
        for a clear window: a crash must not reopen a thrashing node at once. No mark is
        decided before the node has been read."""
        node = self.watcher.node
        if self.restored or node is None:
            return
        for resource, state in self.states.items():
            state.marked = bool(RESOURCE_MARK[resource].forms(node))
        self.restored = True

    def step(self, now: float, fired: set[Resource]) -> None:
        self.ticked = now
        self.restore()
        if self.restored:
            self.sample(now, fired)
        self.read_facts(now)
        self.sync(now)

    def wait(self) -> set[Resource]:
        """Sleep until the next sample is due; the resources whose kernel trigger fired."""
        # Calm: every marked resource has a trigger to wake the loop, and no mark is on.
        calm = bool(self.triggers) and set(self.triggers) == set(self.states) and not any(
            s.marked for s in self.states.values())
        timeout = self.options.calm_interval if calm else 1.0
        if self.triggers:
            fired = wait_for_triggers(list(self.triggers.values()), timeout, self.waker.read_fd)
            self.waker.drain()
            return {r for r, t in self.triggers.items() if t in fired}
        wait_for_triggers([], timeout, self.waker.read_fd)
        self.waker.drain()
        return set()

    def clear_marks(self, attempts: int = 3) -> None:
        """Take this agent's marks off the node before it goes (see the module doc). A
        conflict (the taints changed since the agent's copy) reads the node afresh and tries
        again: a mark must not outlive an agent that is gone for good."""
        node = self.watcher.node
        if node is None or not self.options.pressure:
            return
        wants = {mark: MarkWant(False, "cleared: swapwise node-agent stopped") for mark in MARKS}
        for _ in range(attempts):
            change = desired_change(node, Verdict(None, ""), wants, self.options.mark_with)
            if change is None:
                return
            try:
                self.api.patch(change.node, change.patch)
                log.info("pressure marks cleared on shutdown", extra=change.summary)
                return
            except ApiError as exc:
                if exc.status != 409:
                    log.warning("could not clear the pressure marks on shutdown",
                                extra={"error": str(exc)[:300]})
                    return
                try:
                    node = self.api.get(change.node)
                except ApiError as again:
                    log.warning("could not read the node to clear its pressure marks",
                                extra={"error": str(again)[:300]})
                    return
        log.warning("pressure marks left on the node: every clear met a conflict")

    def run(self, stop: threading.Event, host: str = "0.0.0.0", port: int = 8080) -> None:
        server = HealthServer((host, port), health_handler(self))
        threads = [threading.Thread(target=server.serve_forever, name="health", daemon=True),
                   threading.Thread(target=self.watcher.run, name="watch", daemon=True)]
        for thread in threads:
            thread.start()
        self.arm_triggers()
        log.info("node agent started", extra={
            "node": self.options.node, "source": self.options.source,
            "psi": "triggers" if self.triggers else "read once a second",
            "pressure_marks": list(self.states)})
        fired: set[Resource] = set()
        try:
            while not stop.is_set():
                self.step(time.monotonic(), fired)
                fired = self.wait()
        finally:
            self.stop.set()
            self.clear_marks()
            self.close_triggers()
            server.shutdown()


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} %"

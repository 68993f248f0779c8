"""Wiring for ``swapwise label-nodes``: client, elector, controller and health server.

Shutdown order matters: on SIGTERM the elector releases the Lease first (so the other
replica takes over within a retry period instead of a lease duration), then the watch
and the health server stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from dataclasses import dataclass, field

from webhook.base.logs import configure, get_logger
from webhook.labeller.controller import Labeller
from webhook.labeller.health import create_app, health_server
from webhook.labeller.kube import KUBELET_TIMEOUT, KubeLeaseStore, KubeNodes, make_client
from webhook.labeller.labels import DEFAULT_LABEL, Label, Source
from webhook.labeller.lease import Elector, Timing
from webhook.labeller.metrics import LabellerMetrics
from webhook.labeller.pressure import PressureSettings

log = get_logger("labeller")


def default_identity() -> str:
    """Unique per process: the pod name (hostname) and the pid."""
    return f"{socket.gethostname()}_{os.getpid()}"


@dataclass(frozen=True)
class LabellerOptions:
    kubeconfig: str | None = None
    label: Label = DEFAULT_LABEL
    lease_name: str = "swapwise-labeller"
    lease_namespace: str | None = None  # default: the client's namespace (in-cluster: own)
    identity: str = field(default_factory=default_identity)
    host: str = "0.0.0.0"  # probes and scrapes come to the pod IP
    port: int = 8080
    timing: Timing = field(default_factory=Timing)
    resync_seconds: float = 300.0
    # "declared" (node label, no extra RBAC) or "kubelet" (configz, needs nodes/proxy get).
    swap_behavior_source: Source = "declared"
    kubelet_config_ttl: float = 300.0
    # The memory-pressure guard (None: off); reads each swap node's Summary, needs
    # nodes/proxy get like the kubelet source.
    pressure: PressureSettings | None = None
    kubelet_timeout: float = KUBELET_TIMEOUT  # one /configz or Summary read, seconds
    log_level: str = "info"


async def run_labeller(options: LabellerOptions, stop: asyncio.Event) -> None:
    client = make_client(options.kubeconfig)
    namespace = options.lease_namespace or client.namespace
    metrics = LabellerMetrics()
    elector: Elector | None = None

    def leading() -> bool:
        return elector is not None and elector.leading()

    labeller = Labeller(KubeNodes(client, options.kubelet_timeout), options.label, metrics, leading,
                        options.resync_seconds, options.swap_behavior_source,
                        options.kubelet_config_ttl, pressure=options.pressure,
                        identity=options.identity)
    elector = Elector(KubeLeaseStore(client, options.lease_name, namespace), options.identity,
                      options.timing, on_change=labeller.on_leadership)
    server = health_server(create_app(metrics, lambda: labeller.synced, leading),
                           options.host, options.port)
    log.info("starting", extra={
        "label": str(options.label), "identity": options.identity,
        "swap_behavior_source": options.swap_behavior_source,
        "pressure_guard": options.pressure.text() if options.pressure else "off",
        "lease": f"{namespace}/{options.lease_name}", "metrics": f"{options.host}:{options.port}",
    })
    serving = asyncio.create_task(server.serve(), name="http")
    workers = [
        asyncio.create_task(labeller.watch_loop(stop), name="watch"),
        asyncio.create_task(labeller.reconcile_loop(stop), name="reconcile"),
    ]
    if options.pressure is not None:  # any worker that ends stops the process: only when on
        workers.append(asyncio.create_task(labeller.pressure_loop(stop), name="pressure"))
    electing = asyncio.create_task(elector.run(stop), name="elector")
    stopping = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([stopping, serving, electing, *workers],
                                     return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopping and task.exception() is not None:
                log.error("task failed", extra={"task": task.get_name()},
                          exc_info=task.exception())
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(electing, options.timing.retry_period + 5)  # releases
        for task in [*workers, stopping]:
            task.cancel()
        await asyncio.gather(*workers, stopping, return_exceptions=True)
        server.should_exit = True
        with contextlib.suppress(Exception):
            await serving
        await client.close()
        log.info("stopped", extra={"identity": options.identity})


async def _main(options: LabellerOptions) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await run_labeller(options, stop)


def configure_logging(level: str) -> None:
    """swapwise's lines at ``level``; the HTTP client's only from WARNING. One INFO line per
    request (lease renewals every retry period) drowns the log, and at debug the transport's
    trace, eight lines a request, was nine tenths of it."""
    configure(level)
    for name in ("httpx2", "httpcore2"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))


def serve(options: LabellerOptions) -> None:
    configure_logging(options.log_level)
    asyncio.run(_main(options))

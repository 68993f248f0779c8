"""One serving process: the app on uvicorn over TLS, with hot reload and graceful shutdown.

The socket it serves is bound by launch.py (a single process and every ``--workers`` worker
serve the same kind of pre-bound socket); the uvicorn server itself, with its connection
guards and TLS handshake timeout, comes from uvicorn_internals.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass
from pathlib import Path

from webhook.base.logs import get_logger
from webhook.policy import Policy
from webhook.server.app import AppState, create_app
from webhook.server.metrics import Metrics
from webhook.server.options import ServeOptions
from webhook.server.reload import PolicyStore, reload_certificate, supervise, watch
from webhook.server.tls import CertificateStore, LoadedCert
from webhook.server.uvicorn_internals import SwapwiseServer, make_server

log = get_logger("server")


@dataclass(frozen=True)
class Fallback:
    """What a restarted worker serves when the files are bad at that moment: the last
    policy and certificate its supervisor could load (see workers.py)."""

    policy: Policy
    certificate: LoadedCert


def build(
    options: ServeOptions, metrics_dir: Path | None = None, *, counting: bool = True,
    fallback: Fallback | None = None,
) -> tuple[SwapwiseServer, AppState, CertificateStore]:
    """Everything but the event loop; raises PolicyError / CertificateError early
    (unless there is a ``fallback``). ``counting``: this process counts reloads."""
    metrics = Metrics(metrics_dir)
    policies = PolicyStore(options.policy, metrics, counting=counting,
                           fallback=fallback.policy if fallback else None)
    certificates = CertificateStore(options.cert, options.key, options.client_ca,
                                    fallback=fallback.certificate if fallback else None)
    if certificates.failing:
        log.error("certificate files unusable, serving the last good certificate",
                  extra={"cert": str(options.cert),
                         "not_after": certificates.current.not_after.isoformat()})
        if counting:
            metrics.certificate_reloads.labels("failure").inc()
    metrics.certificate_expiry.set(certificates.current.not_after.timestamp())
    state = AppState(policies, metrics)
    # The listener's context hands each handshake to the newest certificate (tls.py).
    server = make_server(create_app(state), state, certificates.listener, options)
    return server, state, certificates


async def serve_socket(
    options: ServeOptions, sock: socket.socket, metrics_dir: Path | None = None,
    *, counting: bool = True, fallback: Fallback | None = None,
) -> None:
    """Serve on an already bound socket until SIGTERM/SIGINT (one process of many, or the one).

    ``counting``: this process counts reloads (with ``--workers``, only worker 0 does, so
    each change is counted once); ``fallback``: see :class:`Fallback`.
    """
    server, state, certificates = build(options, metrics_dir, counting=counting,
                                        fallback=fallback)
    metrics = state.metrics

    def on_change() -> None:
        state.policies.reload()
        reload_certificate(certificates, metrics, counting)

    stop = asyncio.Event()
    watched = [options.cert, options.key]
    watched += [path for path in (options.policy, options.client_ca) if path is not None]
    watcher = asyncio.create_task(
        supervise("files", lambda: watch(watched, on_change, stop), stop, metrics))
    log.info(
        "serving",
        extra={
            "address": f"https://{options.host}:{sock.getsockname()[1]}",
            "policy": state.policies.policy.source,
            "profiles": sorted(state.policies.policy.profiles),
            "cert": str(options.cert),
        },
    )
    try:
        await server.serve(sockets=[sock])
    finally:
        stop.set()
        for close in state.on_stop:
            close()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        log.info("stopped")

"""Run the app on uvicorn over TLS, with hot reload and graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import uvicorn
import uvloop

from webhook.server.app import AppState, create_app
from webhook.server.logs import configure, get_logger
from webhook.server.metrics import Metrics
from webhook.server.reload import PolicyStore, reload_certificate, watch
from webhook.server.tls import CertificateStore

log = get_logger("server")


@dataclass(frozen=True)
class ServeOptions:
    cert: Path
    key: Path
    policy: Path | None = None
    client_ca: Path | None = None
    host: str = "0.0.0.0"
    port: int = 8443
    log_level: str = "info"
    # Connection hygiene: a slow or idle client must not pin resources for long.
    # Longer than the API server's 90 s idle-connection timeout: if the server closed an
    # idle connection first, a request racing the close would fail the admission call.
    keep_alive_seconds: int = 120
    max_connections: int = 1000
    graceful_seconds: int = 25  # below the chart's terminationGracePeriodSeconds


class SwapwiseServer(uvicorn.Server):
    """uvicorn.Server that reports readiness and starts draining on SIGTERM."""

    def __init__(self, config: uvicorn.Config, state: AppState) -> None:
        super().__init__(config)
        self.state = state

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.state.serving = not self.should_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.state.draining = True
        super().handle_exit(sig, frame)
        # uvicorn re-raises the signal after shutting down; a drained shutdown is a
        # clean exit (status 0), and it lets the "stopped" log line be written.
        self._captured_signals.clear()


def build(options: ServeOptions) -> tuple[SwapwiseServer, AppState, CertificateStore]:
    """Everything but the event loop; raises PolicyError / CertificateError early."""
    metrics = Metrics()
    policies = PolicyStore(options.policy, metrics)
    certificates = CertificateStore(options.cert, options.key, options.client_ca)
    metrics.certificate_expiry.set(certificates.current.not_after.timestamp())
    state = AppState(policies, metrics)
    config = uvicorn.Config(
        create_app(state),
        host=options.host,
        port=options.port,
        ssl_certfile=str(options.cert),
        ssl_keyfile=str(options.key),
        http="httptools",
        loop="uvloop",
        lifespan="off",
        access_log=False,
        log_config=None,
        server_header=False,
        date_header=False,
        timeout_keep_alive=options.keep_alive_seconds,
        limit_concurrency=options.max_connections,
        timeout_graceful_shutdown=options.graceful_seconds,
    )
    config.load()
    config.ssl = certificates.listener  # reloadable context instead of uvicorn's static one
    return SwapwiseServer(config, state), state, certificates


async def _serve(options: ServeOptions) -> None:
    server, state, certificates = build(options)
    metrics = state.metrics

    def on_change() -> None:
        state.policies.reload()
        reload_certificate(certificates, metrics)

    stop = asyncio.Event()
    watched = [options.cert, options.key] + ([options.policy] if options.policy else [])
    watcher = asyncio.create_task(watch(watched, on_change, stop))
    log.info(
        "serving",
        extra={
            "address": f"https://{options.host}:{options.port}",
            "policy": state.policies.policy.source,
            "profiles": sorted(state.policies.policy.profiles),
            "cert": str(options.cert),
        },
    )
    try:
        await server.serve()
    finally:
        stop.set()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        log.info("stopped")


def serve(options: ServeOptions) -> None:
    configure(options.log_level)
    uvloop.run(_serve(options))

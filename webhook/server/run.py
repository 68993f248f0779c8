"""Run the app on uvicorn over TLS, with hot reload, connection guards and graceful shutdown.

The listening socket is bound here (not by uvicorn) so that one code path serves both a
single process and ``--workers N`` (where the parent binds and the workers inherit it,
see workers.py), and the TLS server is created here so that the handshake gets a timeout,
which uvicorn does not expose: a client that connects and never finishes its handshake is
dropped after ``handshake_timeout`` instead of holding a socket for the OS default.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import uvicorn
import uvloop

from webhook.policy import Policy
from webhook.server import asynclog
from webhook.server.app import AppState, create_app
from webhook.server.logs import configure, get_logger
from webhook.server.metrics import Metrics
from webhook.server.protocol import GuardedHttpToolsProtocol
from webhook.server.reload import PolicyStore, reload_certificate, supervise, watch
from webhook.server.tls import CertificateStore, LoadedCert

log = get_logger("server")


@dataclass(frozen=True)
class ServeOptions:
    """Everything ``swapwise serve`` can be told; the defaults are the production ones."""

    cert: Path
    key: Path
    policy: Path | None = None
    client_ca: Path | None = None
    host: str = "0.0.0.0"
    port: int = 8443
    log_level: str = "info"
    workers: int = 1
    # Connection hygiene: a slow or idle client must not pin resources for long.
    # Longer than the API server's 90 s idle-connection timeout: if the server closed an
    # idle connection first, a request racing the close would fail the admission call.
    keep_alive_seconds: int = 120
    # Beyond this many open connections uvicorn answers 503 (the API server then applies
    # the webhook's failurePolicy). Idle and slow connections are timed out long before.
    max_connections: int = 1000
    request_timeout: float = 10.0  # connect (or a request's first byte) → its body complete
    handshake_timeout: float = 10.0  # TCP accept → TLS handshake complete
    write_timeout: float = 30.0  # a client that does not read its answer for this long is cut
    # SIGTERM starts a lame-duck period: readiness fails, every answer carries
    # "Connection: close", new connections are still served (endpoints take a moment to
    # drop the pod), then the listener closes and in-flight requests get graceful_seconds.
    drain_seconds: float = 5.0
    graceful_seconds: int = 10  # in-flight requests take ms; partial ones time out in 10 s


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything serves (and inherited by workers)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class SwapwiseServer(uvicorn.Server):
    """uvicorn.Server that owns its TLS listener, reports readiness and drains on SIGTERM."""

    def __init__(
        self, config: uvicorn.Config, state: AppState, tls: ssl.SSLContext,
        options: ServeOptions,
    ) -> None:
        super().__init__(config)
        self.state = state
        self.tls = tls
        self.options = options
        self.drain_deadline: float | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        assert sockets, "SwapwiseServer serves sockets bound by bind_socket()"
        config = self.config
        loop = asyncio.get_running_loop()

        def create_protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state={},
            )

        self.servers = [
            await loop.create_server(
                create_protocol, sock=sock, ssl=self.tls, backlog=config.backlog,
                ssl_handshake_timeout=self.options.handshake_timeout,
                # On close, don't wait long for the client's close_notify: idle clients
                # never send it, and shutdown waits for every connection to be gone.
                ssl_shutdown_timeout=1.0,
            )
            for sock in sockets
        ]
        self.started = True
        self.state.serving = not self.should_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_deadline is None and not self.should_exit:
            # First signal: lame duck (see ServeOptions.drain_seconds); on_tick ends it.
            self.state.draining = True
            self.drain_deadline = time.monotonic() + self.options.drain_seconds
            log.info("draining", extra={"seconds": self.options.drain_seconds})
            return
        # A second signal (or one after the drain) stops now, like uvicorn's own.
        super().handle_exit(sig, frame)
        # uvicorn re-raises the signal after shutting down; a drained shutdown is a
        # clean exit (status 0), and it lets the "stopped" log line be written.
        self._captured_signals.clear()

    async def on_tick(self, counter: int) -> bool:
        if self.drain_deadline is not None and time.monotonic() >= self.drain_deadline:
            self.should_exit = True
        return await super().on_tick(counter)


def configure_protocol(options: ServeOptions) -> type[GuardedHttpToolsProtocol]:
    """A protocol class carrying this server's limits (a class per server, not globals)."""
    return type("Protocol", (GuardedHttpToolsProtocol,), {
        "request_timeout": options.request_timeout,
        "write_timeout": options.write_timeout,
    })


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
    config = uvicorn.Config(
        create_app(state),
        host=options.host,
        port=options.port,
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
    config.http_protocol_class = configure_protocol(options)
    # The listener's context hands each handshake to the newest certificate (tls.py).
    return SwapwiseServer(config, state, certificates.listener, options), state, certificates


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


def serve(options: ServeOptions) -> None:
    configure(options.log_level)
    asynclog.start()  # log lines are written off the event loop (see asynclog.py)
    sock = bind_socket(options.host, options.port)
    if options.workers > 1:
        from webhook.server.workers import Supervisor

        Supervisor(options, sock).run()  # refuses a bad policy or certificate first
        return
    uvloop.run(serve_socket(options, sock))

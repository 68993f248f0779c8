"""What ``swapwise serve`` can be told, and the one place its defaults are written down.

The command line (cli/serve_cmd.py) and the connection protocol take their defaults from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    """Everything ``swapwise serve`` can be told; the defaults are the production ones."""

    cert: Path
    key: Path
    policy: Path | None = None
    client_ca: Path | None = None
    host: str = "127.0.0.1"  # 0.0.0.0 (or ::) for all; the image passes 0.0.0.0
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

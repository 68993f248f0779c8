"""``swapwise serve``: bind the socket, then launch one process or a supervisor of
``--workers`` processes.

The choice sits here, above both process.py (one serving process) and workers.py (the
supervisor, whose workers each run what process.py runs), so that neither needs the
other's caller.
"""

from __future__ import annotations

import socket

import uvloop

from webhook.base.logs import configure
from webhook.server import asynclog
from webhook.server.options import ServeOptions
from webhook.server.process import serve_socket
from webhook.server.workers import Supervisor


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


def serve(options: ServeOptions) -> None:
    configure(options.log_level)
    asynclog.start()  # log lines are written off the event loop (see asynclog.py)
    sock = bind_socket(options.host, options.port)
    if options.workers > 1:
        Supervisor(options, sock).run()  # refuses a bad policy or certificate first
        return
    uvloop.run(serve_socket(options, sock))

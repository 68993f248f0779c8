"""``swapwise serve``: the HTTPS admission webhook."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import socket
import sys
from pathlib import Path
from typing import Any

from webhook import certs
from webhook.cli.common import fail
from webhook.policy import PolicyError, load_policy
from webhook.server.options import ServeOptions
from webhook.server.tls import CertificateError

DEV_CERT_DIR = Path("certs")
D = ServeOptions  # every default below is ServeOptions'


def _g(value: float) -> str:
    return f"{value:g}"


def register(subcommands: Any) -> None:
    parser = subcommands.add_parser(
        "serve", help="serve the admission webhook over HTTPS",
        description="Serve the admission webhook over HTTPS: POST /mutate/<profile> "
                    "(AdmissionReview v1), /healthz, /readyz, /metrics. The policy and "
                    "certificate files are watched and reloaded without a restart. With no "
                    "certificate given (--cert-dir, or --tls-cert and --tls-key), a development "
                    "CA and serving certificate are made under certs/ and kept across restarts; "
                    "nothing is written there before the address can be listened on and the "
                    "policy loads.")
    parser.add_argument("--policy", help="policy file (default: built-in policy)")
    parser.add_argument("--cert-dir", help="directory with tls.crt and tls.key")
    parser.add_argument("--tls-cert", help="serving certificate (PEM)")
    parser.add_argument("--tls-key", help="serving key (PEM)")
    parser.add_argument("--client-ca", help="require client certificates signed by this CA")
    parser.add_argument("--host", default=D.host,
                        help=f"listen address (default {D.host}; 0.0.0.0 for all)")
    parser.add_argument("--port", type=int, default=D.port,
                        help=f"listen port (default {D.port})")
    parser.add_argument("--log-level", default=D.log_level,
                        choices=["debug", "info", "warning", "error"])
    limits = parser.add_argument_group(
        "processes, connections and timeouts (defaults suit production; see BENCHMARKS.md)")
    limits.add_argument("--workers", type=int, default=D.workers,
                        help="worker processes sharing the port, one core each "
                             f"(default {D.workers})")
    limits.add_argument("--max-connections", type=int, default=D.max_connections,
                        help="open connections per worker before answering 503 "
                             f"(default {D.max_connections})")
    limits.add_argument("--keep-alive-timeout", type=int, default=D.keep_alive_seconds,
                        metavar="SECONDS",
                        help="close idle keep-alive connections after this; keep it above the "
                             f"API server's 90 s (default {D.keep_alive_seconds})")
    # The time limits a hostile or stuck peer meets, each a float of seconds.
    for flag, default, text in (
        ("--request-timeout", D.request_timeout,
         "time to receive a whole request, from its first byte (or from connecting) to the "
         "end of its body; then 408"),
        ("--handshake-timeout", D.handshake_timeout, "time for a TLS handshake"),
        ("--write-timeout", D.write_timeout,
         "cut a client that has not read its answer for this long"),
        ("--drain-seconds", D.drain_seconds,
         "after SIGTERM, keep answering (with Connection: close) this long before closing "
         "the port"),
    ):
        limits.add_argument(flag, type=float, default=default, metavar="SECONDS",
                            help=f"{text} (default {_g(default)})")
    parser.set_defaults(func=run)


def _given_certificate(args: argparse.Namespace) -> tuple[Path, Path] | None:
    """The certificate and key the flags name; None when none is given."""
    if args.cert_dir and (args.tls_cert or args.tls_key):
        raise ValueError("give --cert-dir or --tls-cert/--tls-key, not both")
    if args.cert_dir:
        directory = Path(args.cert_dir)
        return directory / certs.CERT_FILE, directory / certs.KEY_FILE
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")
        return Path(args.tls_cert), Path(args.tls_key)
    return None


def _dev_certificate(args: argparse.Namespace) -> tuple[Path, Path]:
    """The development certificate under certs/, made or reused: only once the server is
    known to be able to serve (see :func:`_preflight`)."""
    extra_dns: list[str] = []
    extra_ips: list[str] = []
    try:
        if not ipaddress.ip_address(args.host).is_unspecified:  # 0.0.0.0 and :: name nothing
            extra_ips.append(args.host)
    except ValueError:  # a name the machine resolves (the preflight listened on it)
        extra_dns.append(args.host)
    paths, made = certs.ensure_dev_certs(DEV_CERT_DIR, extra_dns, extra_ips)
    if made:
        print(f"swapwise: {made}", file=sys.stderr)
    print(f"swapwise: development certificate {paths.cert}; CA bundle for caBundle: "
          f"{paths.ca.resolve()}", file=sys.stderr)
    return paths.cert, paths.key


def _listen_error(exc: OSError, host: str, port: int) -> str:
    """What a failed bind means, naming the address and what to do."""
    where = f"cannot listen on {host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (f"{where}: port {port} is in use (another swapwise serve, such as make run?); "
                "stop it, or choose another port with --port")
    if exc.errno == errno.EADDRNOTAVAIL:
        return (f"{where}: this machine has no address {host}; --host takes one of its "
                "addresses, or 0.0.0.0 for all")
    if exc.errno == errno.EACCES:
        return (f"{where}: permission denied (ports below 1024 need root or "
                "CAP_NET_BIND_SERVICE); choose another port with --port")
    if isinstance(exc, socket.gaierror):
        return f"{where}: --host {host!r} is not an address this machine can listen on"
    return f"{where}: {exc.strerror or exc}"


def _preflight(args: argparse.Namespace) -> None:
    """What must hold before anything is written to certs/: the policy loads, the client
    CA can be read, and the address can be listened on (bound and let go at once). A run
    that cannot serve leaves certs/ as it found it, and never makes a new CA for a name or
    address that it would never have served."""
    from webhook.server.launch import bind_socket

    if args.policy:
        load_policy(args.policy)
    if args.client_ca and not Path(args.client_ca).is_file():
        raise ValueError(f"--client-ca {args.client_ca}: no such file")
    try:
        bind_socket(args.host, args.port).close()
    except OSError as exc:
        raise ValueError(_listen_error(exc, args.host, args.port)) from None


def run(args: argparse.Namespace) -> int:
    from webhook.server.launch import serve  # server deps only when serving

    if not 0 < args.port < 65536:
        return fail(f"--port {args.port} is out of range")
    if args.workers < 1 or args.max_connections < 1:
        return fail("--workers and --max-connections must be at least 1")
    timeouts = (args.keep_alive_timeout, args.request_timeout, args.handshake_timeout,
                args.write_timeout)
    if min(timeouts) <= 0 or args.drain_seconds < 0:
        return fail("timeouts must be positive and --drain-seconds not negative")
    try:
        given = _given_certificate(args)
        _preflight(args)
        cert, key = given or _dev_certificate(args)
        options = ServeOptions(
            cert=cert, key=key,
            policy=Path(args.policy) if args.policy else None,
            client_ca=Path(args.client_ca) if args.client_ca else None,
            host=args.host, port=args.port, log_level=args.log_level,
            workers=args.workers, max_connections=args.max_connections,
            keep_alive_seconds=args.keep_alive_timeout, request_timeout=args.request_timeout,
            handshake_timeout=args.handshake_timeout, write_timeout=args.write_timeout,
            drain_seconds=args.drain_seconds,
        )
        serve(options)
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):  # taken since the preflight
            return fail(_listen_error(exc, args.host, args.port))
        return fail(str(exc))
    except (ValueError, PolicyError, CertificateError) as exc:
        return fail(str(exc))
    return 0

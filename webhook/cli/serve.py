"""``swapwise serve``: the HTTPS admission webhook."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from webhook import certs
from webhook.cli.common import fail
from webhook.policy import PolicyError
from webhook.server.tls import CertificateError

DEV_CERT_DIR = Path("certs")


def register(subcommands: Any) -> None:
    parser = subcommands.add_parser("serve", help="serve the admission webhook over HTTPS")
    parser.add_argument("--policy", help="policy file (default: built-in policy)")
    parser.add_argument("--cert-dir", help="directory with tls.crt and tls.key")
    parser.add_argument("--tls-cert", help="serving certificate (PEM)")
    parser.add_argument("--tls-key", help="serving key (PEM)")
    parser.add_argument("--client-ca", help="require client certificates signed by this CA")
    parser.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8443, help="listen port (default 8443)")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=run)


def _certificate(args: argparse.Namespace) -> tuple[Path, Path]:
    if args.cert_dir and (args.tls_cert or args.tls_key):
        raise ValueError("give --cert-dir or --tls-cert/--tls-key, not both")
    if args.cert_dir:
        directory = Path(args.cert_dir)
        return directory / certs.CERT_FILE, directory / certs.KEY_FILE
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")
        return Path(args.tls_cert), Path(args.tls_key)
    extra_ips = [args.host] if args.host not in ("0.0.0.0", "::", "127.0.0.1") else []
    paths = certs.ensure_dev_certs(DEV_CERT_DIR, [], extra_ips)
    print(f"swapwise: development certificate {paths.cert}; CA bundle for caBundle: "
          f"{paths.ca.resolve()}", file=sys.stderr)
    return paths.cert, paths.key


def run(args: argparse.Namespace) -> int:
    from webhook.server.run import ServeOptions, serve  # server deps only when serving

    if not 0 < args.port < 65536:
        return fail(f"--port {args.port} is out of range")
    try:
        cert, key = _certificate(args)
        options = ServeOptions(
            cert=cert, key=key,
            policy=Path(args.policy) if args.policy else None,
            client_ca=Path(args.client_ca) if args.client_ca else None,
            host=args.host, port=args.port, log_level=args.log_level,
        )
        serve(options)
    except (ValueError, PolicyError, CertificateError, OSError) as exc:
        return fail(str(exc))
    return 0

"""``swapwise certs``: a CA and serving certificate for a webhook Service."""

from __future__ import annotations

import argparse
import ipaddress
from pathlib import Path
from typing import Any

from webhook import certs
from webhook.cli.common import fail


def register(subcommands: Any) -> None:
    parser = subcommands.add_parser(
        "certs", help="write ca.crt, tls.crt and tls.key for the webhook Service",
        description="Write a new CA (ca.crt, the caBundle) and a serving certificate and key it "
                    "signs (tls.crt, tls.key: what a kubernetes.io/tls Secret holds and serve "
                    "--cert-dir reads) for the webhook Service's names SERVICE, "
                    "SERVICE.NAMESPACE, SERVICE.NAMESPACE.svc and "
                    "SERVICE.NAMESPACE.svc.cluster.local, into certs/SERVICE.NAMESPACE (beside "
                    "the development server's certs/, never over it) unless --out. Existing "
                    "files are never overwritten without --force.",
    )
    parser.add_argument("--service", required=True, help="Service name")
    parser.add_argument("--namespace", required=True, help="Service namespace")
    parser.add_argument("--out", help="output directory (default: certs/SERVICE.NAMESPACE, "
                        "apart from the development server's certs/)")
    parser.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    parser.add_argument("--dns", action="append", default=[], help="extra DNS SAN (repeatable)")
    parser.add_argument("--ip", action="append", default=[], help="extra IP SAN (repeatable)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite existing files (their CA may be in use as a caBundle)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.days < 1:
        return fail("--days must be at least 1")
    for ip in args.ip:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            return fail(f"--ip {ip!r} is not an IP address")
    out = Path(args.out or f"certs/{args.service}.{args.namespace}")
    existing = [out / name for name in (certs.CA_FILE, certs.CERT_FILE, certs.KEY_FILE)
                if (out / name).exists()]
    if existing and not args.force:
        return fail(f"{existing[0]} exists (its CA may be in use as a caBundle); "
                    "choose another --out or pass --force")
    names = [*certs.service_names(args.service, args.namespace), *args.dns]
    paths = certs.write(out, *certs.generate(list(dict.fromkeys(names)), args.ip, args.days))
    print(f"wrote {paths.ca}, {paths.cert}, {paths.key} (valid {args.days} days)")
    print(f"caBundle: base64 of {paths.ca}")
    return 0

"""``swapwise certs``: a CA and serving certificate for a webhook Service."""

from __future__ import annotations

import argparse
import ipaddress
import re
from pathlib import Path
from typing import Any

from webhook import certs
from webhook.cli.common import fail

MAX_DAYS = 36500
# What the API server accepts: a Service name is a DNS-1035 label (it starts with a letter),
# a namespace a DNS-1123 label, a certificate's extra name a DNS-1123 subdomain (a leading
# "*." for a wildcard).
_SERVICE = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_DNS = re.compile(rf"(\*\.)?{_LABEL}(\.{_LABEL})*")


def name_problem(service: str, namespace: str, dns: list[str]) -> str | None:
    """Why a certificate for these names could never be served, or None."""
    if not _SERVICE.fullmatch(service):
        return (f"--service {service!r} is not a Service name (lowercase letters, digits and "
                "'-', starting with a letter, at most 63 characters)")
    if not _NAMESPACE.fullmatch(namespace):
        return (f"--namespace {namespace!r} is not a namespace name (lowercase letters, digits "
                "and '-', at most 63 characters)")
    for name in dns:
        if len(name) > 253 or not _DNS.fullmatch(name):
            return (f"--dns {name!r} is not a DNS name (dot-separated labels of lowercase "
                    "letters, digits and '-')")
    return None


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
    if not 1 <= args.days <= MAX_DAYS:
        return fail(f"--days must be from 1 to {MAX_DAYS} (a certificate ends before the "
                    "year 9999)")
    problem = name_problem(args.service, args.namespace, args.dns)
    if problem is not None:
        return fail(problem)
    for ip in args.ip:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            return fail(f"--ip {ip!r} is not an IP address")
    out = Path(args.out or f"certs/{args.service}.{args.namespace}")
    if out.exists() and not out.is_dir():
        return fail(f"--out {out}: exists and is not a directory")
    existing = [out / name for name in (certs.CA_FILE, certs.CERT_FILE, certs.KEY_FILE)
                if (out / name).exists()]
    if existing and not args.force:
        return fail(f"{existing[0]} exists (its CA may be in use as a caBundle); "
                    "choose another --out or pass --force")
    names = [*certs.service_names(args.service, args.namespace), *args.dns]
    try:
        paths = certs.write(out, *certs.generate(list(dict.fromkeys(names)), args.ip,
                                                 args.days))
    except OSError as exc:
        return fail(f"--out {out}: cannot write the certificates there: "
                    f"{exc.strerror or exc}")
    print(f"wrote {paths.ca}, {paths.cert}, {paths.key} (valid {args.days} days)")
    print(f"caBundle: base64 of {paths.ca}")
    return 0

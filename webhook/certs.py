"""Development and bootstrap certificates: an ECDSA CA and a serving certificate.

The API server only calls webhooks over TLS and verifies them against ``caBundle``;
these helpers make the files a ``kubernetes.io/tls`` Secret would hold (``tls.crt``,
``tls.key``, plus ``ca.crt``) so the same ``--cert-dir`` works locally and in a pod.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"
# The development CA's key, kept beside it (0600) so that a serving certificate for a new
# name or address is issued from the same CA: a caBundle made once keeps working.
CA_KEY_FILE = "ca.key"


@dataclass(frozen=True)
class CertPaths:
    ca: Path
    cert: Path
    key: Path


def service_names(service: str, namespace: str) -> list[str]:
    """The four DNS names the API server may use for a service-backed webhook."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _validity(days: int) -> tuple[dt.datetime, dt.datetime]:
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)  # tolerate clock skew
    return now, now + dt.timedelta(days=days)


def make_ca(days: int = 365) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A new CA certificate and its key."""
    now, until = _validity(days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("swapwise-ca"))
        .issuer_name(_name("swapwise-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    return ca_cert, ca_key


def issue(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, dns_names: list[str],
          ip_addresses: list[str], days: int = 365) -> tuple[bytes, bytes]:
    """(tls.crt, tls.key) PEM: a serving certificate for the names and addresses, signed by
    the CA (and never valid past it)."""
    now, until = _validity(days)
    until = min(until, ca_cert.not_valid_after_utc)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(dns_names[0] if dns_names else "swapwise"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def generate(
    dns_names: list[str], ip_addresses: list[str], days: int = 365
) -> tuple[bytes, bytes, bytes]:
    """(ca.crt, tls.crt, tls.key) PEM for a fresh CA and a serving certificate it signs."""
    ca_cert, ca_key = make_ca(days)
    cert, key = issue(ca_cert, ca_key, dns_names, ip_addresses, days)
    return ca_cert.public_bytes(serialization.Encoding.PEM), cert, key


def _write_private(path: Path, data: bytes) -> None:
    """A key file, created 0600 so it is never world-readable."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, 0o600)


def write(out: Path, ca: bytes, cert: bytes, key: bytes) -> CertPaths:
    """Write the three files; the key is created 0600 so it is never world-readable."""
    out.mkdir(parents=True, exist_ok=True)
    paths = CertPaths(out / CA_FILE, out / CERT_FILE, out / KEY_FILE)
    paths.ca.write_bytes(ca)
    paths.cert.write_bytes(cert)
    _write_private(paths.key, key)
    return paths


def expiry(cert_pem: bytes) -> dt.datetime:
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


class ForeignCertificateError(ValueError):
    """The development directory holds a certificate that ``serve`` did not make."""


def _dev_ca(out: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    """The development CA under ``out`` with its key, when both are there, belong together
    and the CA stays valid for more than 7 days; else None (a new CA is needed)."""
    try:
        ca_cert = x509.load_pem_x509_certificate((out / CA_FILE).read_bytes())
        ca_key = serialization.load_pem_private_key((out / CA_KEY_FILE).read_bytes(), None)
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        return None
    own = ca_key.public_key().public_bytes(serialization.Encoding.DER,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    stated = ca_cert.public_key().public_bytes(serialization.Encoding.DER,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    fresh = ca_cert.not_valid_after_utc - dt.datetime.now(dt.UTC) > dt.timedelta(days=7)
    return (ca_cert, ca_key) if own == stated and fresh else None


def _new_dev_ca(out: Path, dns: list[str], ips: list[str]) -> CertPaths:
    ca_cert, ca_key = make_ca()
    cert, key = issue(ca_cert, ca_key, dns, ips)
    paths = write(out, ca_cert.public_bytes(serialization.Encoding.PEM), cert, key)
    _write_private(out / CA_KEY_FILE, _pem_key(ca_key))
    return paths


def ensure_dev_certs(
    out: Path, extra_dns: list[str], extra_ips: list[str]
) -> tuple[CertPaths, str | None]:
    """Reuse development certificates under ``out`` while valid; otherwise make new ones.

    Reuse keeps the CA stable across restarts, so a ``caBundle`` registered once
    keeps working. When the serving certificate lacks a name or address (``serve --host``
    on another address) or expires within 7 days, a new one is issued from the same CA
    (whose key is kept in ``ca.key``), naming everything the old one named too: a server
    already running on the directory reloads it, and its clients, holding the old
    ``ca.crt``, still verify it. A new CA is made only when there is none to issue from
    (an old directory without ``ca.key``, or a CA near its end). Returns the paths and what
    was made, when anything was.
    A certificate that does not name ``localhost`` (e.g. one ``swapwise certs`` wrote for
    a Service) is never replaced: its CA may already be some API server's ``caBundle``.
    """
    paths = CertPaths(out / CA_FILE, out / CERT_FILE, out / KEY_FILE)
    dns = list(dict.fromkeys([*service_names("swapwise", "default"), "localhost", *extra_dns]))
    ips = list(dict.fromkeys(str(ipaddress.ip_address(ip)) for ip in
                             ["127.0.0.1", "::1", *extra_ips]))
    if not any(p.exists() for p in (paths.ca, paths.cert, paths.key)):
        return _new_dev_ca(out, dns, ips), None
    reason = f"{paths.cert} is unreadable or incomplete"
    names: set[str] = set()
    addresses: set[str] = set()
    if all(p.exists() for p in (paths.ca, paths.cert, paths.key)):
        try:
            cert = x509.load_pem_x509_certificate(paths.cert.read_bytes())
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            names = set(san.get_values_for_type(x509.DNSName))
            addresses = {str(a) for a in san.get_values_for_type(x509.IPAddress)}
        except (ValueError, x509.ExtensionNotFound):
            pass
        else:
            if "localhost" not in names:
                raise ForeignCertificateError(
                    f"{paths.cert} is not a development certificate (it does not name "
                    f"localhost); serve it with --cert-dir {out}, or move it away to get a "
                    "development certificate"
                )
            fresh = cert.not_valid_after_utc - dt.datetime.now(dt.UTC) > dt.timedelta(days=7)
            if fresh and set(dns) <= names and set(ips) <= addresses:
                return paths, None
            reason = (f"{paths.cert} expires within 7 days" if not fresh
                      else f"{paths.cert} lacks a name or address this server needs")
    ca = _dev_ca(out)
    if ca is not None:
        wanted_dns = [*dns, *sorted(names - set(dns))]
        wanted_ips = [*ips, *sorted(addresses - set(ips))]
        cert_pem, key_pem = issue(*ca, wanted_dns, wanted_ips)
        _replace(paths.key, key_pem, private=True)  # a mismatched pair is refused on reload,
        _replace(paths.cert, cert_pem)              # and the next change event retries it
        return paths, (f"{reason}: issued a new serving certificate from the existing CA "
                       f"({paths.ca} unchanged: caBundles made from it keep working)")
    why_new = ("there is no CA key to issue from" if not (out / CA_KEY_FILE).exists()
               else "its CA cannot issue it (expiring, or not its key)")
    paths = _new_dev_ca(out, dns, ips)
    return paths, (f"{reason}, and {why_new}: made a new CA; update any caBundle made from "
                   f"the old {paths.ca}")


def _replace(path: Path, data: bytes, private: bool = False) -> None:
    """Write ``path`` whole or not at all (a temporary file renamed over it): a server
    watching the directory never reads half a file."""
    temporary = path.with_name(f".{path.name}.tmp")
    if private:
        _write_private(temporary, data)
    else:
        temporary.write_bytes(data)
    os.replace(temporary, path)

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


def generate(
    dns_names: list[str], ip_addresses: list[str], days: int = 365
) -> tuple[bytes, bytes, bytes]:
    """(ca.crt, tls.crt, tls.key) PEM for a fresh CA and a serving certificate it signs."""
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)  # tolerate clock skew
    until = now + dt.timedelta(days=days)
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
    pem = serialization.Encoding.PEM
    return ca_cert.public_bytes(pem), cert.public_bytes(pem), _pem_key(key)


def write(out: Path, ca: bytes, cert: bytes, key: bytes) -> CertPaths:
    """Write the three files; the key is created 0600 so it is never world-readable."""
    out.mkdir(parents=True, exist_ok=True)
    paths = CertPaths(out / CA_FILE, out / CERT_FILE, out / KEY_FILE)
    paths.ca.write_bytes(ca)
    paths.cert.write_bytes(cert)
    fd = os.open(paths.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key)
    os.chmod(paths.key, 0o600)
    return paths


def expiry(cert_pem: bytes) -> dt.datetime:
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


class ForeignCertificateError(ValueError):
    """The development directory holds a certificate that ``serve`` did not make."""


def ensure_dev_certs(
    out: Path, extra_dns: list[str], extra_ips: list[str]
) -> tuple[CertPaths, str | None]:
    """Reuse development certificates under ``out`` while valid; otherwise make new ones.

    Reuse keeps the CA stable across restarts, so a ``caBundle`` registered once
    keeps working. Returns the paths and, when a new CA was made over an old one, why.
    A certificate that does not name ``localhost`` (e.g. one ``swapwise certs`` wrote for
    a Service) is never replaced: its CA may already be some API server's ``caBundle``.
    """
    paths = CertPaths(out / CA_FILE, out / CERT_FILE, out / KEY_FILE)
    dns = [*service_names("swapwise", "default"), "localhost", *extra_dns]
    ips = ["127.0.0.1", "::1", *extra_ips]
    if not any(p.exists() for p in (paths.ca, paths.cert, paths.key)):
        return write(out, *generate(list(dict.fromkeys(dns)), list(dict.fromkeys(ips)))), None
    reason = f"{paths.cert} is unreadable or incomplete"
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
            wanted_ips = {str(ipaddress.ip_address(ip)) for ip in ips}
            if fresh and set(dns) <= names and wanted_ips <= addresses:
                return paths, None
            reason = (f"{paths.cert} expires within 7 days" if not fresh
                      else f"{paths.cert} lacks a name or address this server needs")
    paths = write(out, *generate(list(dict.fromkeys(dns)), list(dict.fromkeys(ips))))
    return paths, f"{reason}: made a new CA; update any caBundle made from the old {paths.ca}"

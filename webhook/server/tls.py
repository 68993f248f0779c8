"""TLS with certificate hot reload and no dropped handshakes.

The listening socket keeps one SSLContext for its lifetime. Its SNI callback (which
OpenSSL runs for every ClientHello, with or without a server name) points each new
connection at the newest *complete* context. A reload builds a whole new context from
the files first, so a half-written or mismatched cert/key pair is refused and the
previous certificate keeps serving; established connections are untouched.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

# TLS 1.2+ with forward-secret AEAD suites only (TLS 1.3 suites are always AEAD).
CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


class CertificateError(ValueError):
    """The certificate/key files cannot serve TLS."""


@dataclass(frozen=True)
class LoadedCert:
    context: ssl.SSLContext
    fingerprint: str
    not_after: dt.datetime


def build_context(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    context.set_alpn_protocols(["http/1.1"])
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=str(client_ca))
    try:
        context.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise CertificateError(f"cannot load {cert} / {key}: {exc}") from exc
    return context


def load(cert: Path, key: Path, client_ca: Path | None = None) -> LoadedCert:
    try:
        cert_pem = cert.read_bytes()
        key_pem = key.read_bytes()
        not_after = x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc
    except (OSError, ValueError) as exc:
        raise CertificateError(f"cannot read {cert} / {key}: {exc}") from exc
    fingerprint = hashlib.sha256(cert_pem + b"\0" + key_pem).hexdigest()
    return LoadedCert(build_context(cert, key, client_ca), fingerprint, not_after)


class CertificateStore:
    """The serving certificate; :meth:`reload` swaps it for new handshakes only."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None) -> None:
        self.cert_path, self.key_path, self.client_ca = cert, key, client_ca
        self.current = load(cert, key, client_ca)
        # The listener's context: same settings, and it hands over to `current`.
        self.listener = build_context(cert, key, client_ca)
        self.listener.sni_callback = self._select
        self.failing = False  # the files on disk are currently unusable

    def _select(self, connection: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        connection.context = self.current.context

    def reload(self) -> bool:
        """Load changed files; True if a new certificate is now served.

        Raises :class:`CertificateError` (and keeps the current one) if they are unusable.
        """
        try:
            loaded = load(self.cert_path, self.key_path, self.client_ca)
        except CertificateError:
            self.failing = True
            raise
        self.failing = False
        if loaded.fingerprint == self.current.fingerprint:
            return False
        self.current = loaded
        return True

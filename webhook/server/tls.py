"""TLS with certificate hot reload and no dropped handshakes.

The listening socket keeps one SSLContext for its lifetime. Its SNI callback (which
OpenSSL runs for every ClientHello, with or without a server name) points each new
connection at the newest *complete* context. A reload builds a whole new context from
the files first, so a half-written or mismatched cert/key pair is refused and the
previous certificate keeps serving; established connections are untouched. A reload
reads the files and compares their bytes with those being served before it parses
anything: files that did not change cost three small reads (reload.py calls it on every
event for the watched files, and every 30 s).
"""

from __future__ import annotations

import datetime as dt
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from webhook.base.files import read_regular

# TLS 1.2+ with forward-secret AEAD suites only (TLS 1.3 suites are always AEAD).
CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
MAX_FILE_BYTES = 1024 * 1024  # a Secret holds at most 1 MiB


class CertificateError(ValueError):
    """The certificate/key files cannot serve TLS."""


@dataclass(frozen=True)
class LoadedCert:
    context: ssl.SSLContext
    files: bytes  # what was read: certificate, key and client CA, NUL-separated
    not_after: dt.datetime


def _no_password() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal for an encrypted key's
    # passphrase; an empty one makes such a key fail to load instead.
    return b""


def build_context(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    """A server context from the files; :class:`CertificateError` for anything unusable."""
    try:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_ciphers(CIPHERS)
        context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
        context.set_alpn_protocols(["http/1.1"])
        if client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            try:
                context.load_verify_locations(cafile=str(client_ca))
            except (OSError, ssl.SSLError, ValueError) as exc:
                raise CertificateError(f"cannot load client CA {client_ca}: {exc}") from exc
        context.load_cert_chain(str(cert), str(key), password=_no_password)
    except CertificateError:
        raise
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise CertificateError(f"cannot load {cert} / {key}: {exc}") from exc
    return context


def read_files(cert: Path, key: Path, client_ca: Path | None = None) -> bytes:
    """The raw bytes of the files, NUL-separated (PEM holds no NUL); unparsed."""
    try:
        cert_pem = read_regular(cert, MAX_FILE_BYTES)
        key_pem = read_regular(key, MAX_FILE_BYTES)
        ca_pem = read_regular(client_ca, MAX_FILE_BYTES) if client_ca is not None else b""
    except OSError as exc:
        raise CertificateError(f"cannot read {cert} / {key}: {exc}") from exc
    return b"\0".join((cert_pem, key_pem, ca_pem))


def _check_validity(cert: Path, not_before: dt.datetime, not_after: dt.datetime,
                    now: dt.datetime | None) -> None:
    now = now or dt.datetime.now(dt.UTC)
    if not_after <= now:
        raise CertificateError(f"{cert} expired at {not_after.isoformat()}")
    if not_before > now:
        raise CertificateError(f"{cert} is not valid before {not_before.isoformat()}")


def load(cert: Path, key: Path, client_ca: Path | None = None,
         now: dt.datetime | None = None, files: bytes | None = None) -> LoadedCert:
    """Read (unless ``files`` holds what :func:`read_files` read) and check the files; an
    expired or not yet valid certificate is refused."""
    if files is None:
        files = read_files(cert, key, client_ca)
    try:
        parsed = x509.load_pem_x509_certificate(files.split(b"\0", 1)[0])
    except ValueError as exc:
        raise CertificateError(f"cannot read {cert} / {key}: {exc}") from exc
    _check_validity(cert, parsed.not_valid_before_utc, parsed.not_valid_after_utc, now)
    return LoadedCert(build_context(cert, key, client_ca), files, parsed.not_valid_after_utc)


class CertificateStore:
    """The serving certificate; :meth:`reload` swaps it for new handshakes only."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None,
                 fallback: LoadedCert | None = None) -> None:
        """Load the files; with ``fallback`` (a restarted worker), serve it if they are
        unusable instead of raising :class:`CertificateError`."""
        self.cert_path, self.key_path, self.client_ca = cert, key, client_ca
        self.failing = False  # the files on disk are currently unusable
        try:
            self.current = load(cert, key, client_ca)
        except CertificateError:
            if fallback is None:
                raise
            self.current, self.failing = fallback, True
        # The listener's context: same settings, and it hands over to `current`.
        self.listener = (self.current.context if self.failing
                         else build_context(cert, key, client_ca))
        self.listener.sni_callback = self._select

    def _select(self, connection: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        connection.context = self.current.context

    def reload(self) -> bool:
        """Load changed files; True if a new certificate is now served.

        Raises :class:`CertificateError` (and keeps the current one) if they are unusable.
        Files with the bytes being served are not parsed again: only their expiry is
        checked.
        """
        try:
            files = read_files(self.cert_path, self.key_path, self.client_ca)
            if files == self.current.files:
                if self.current.not_after <= dt.datetime.now(dt.UTC):
                    raise CertificateError(
                        f"{self.cert_path} expired at {self.current.not_after.isoformat()}")
                self.failing = False
                return False
            loaded = load(self.cert_path, self.key_path, self.client_ca, files=files)
        except CertificateError:
            self.failing = True
            raise
        self.failing = False
        self.current = loaded
        return True

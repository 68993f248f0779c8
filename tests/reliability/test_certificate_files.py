"""Any serving certificate, key or client CA content: refused, logged, counted, the last
good one kept (handshakes go on with it), and the next good files still picked up.

Before this suite: a garbage client CA raised ``ssl.SSLError`` outside the try in
``tls.build_context``, which ended the watch task and stopped rotation for good; an
expired certificate was served; a client CA change was never noticed.
"""

from __future__ import annotations

import datetime as dt
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from testkit.server_proc import Mount, cert_files, wait_until
from tests.reliability.support import Server, client_certificates

PEM = serialization.Encoding.PEM


def self_signed(days: float, encrypt: bool = False) -> dict[str, bytes]:
    """tls.crt/tls.key valid for ``days`` from now (negative: expired that long ago)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    start, end = (now - dt.timedelta(days=2), now + dt.timedelta(days=days)) if days > 0 \
        else (now - dt.timedelta(days=2), now - dt.timedelta(days=-days))
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), False)
            .sign(key, hashes.SHA256()))
    algorithm: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(b"secret") if encrypt
        else serialization.NoEncryption())
    return {"tls.crt": cert.public_bytes(PEM),
            "tls.key": key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, algorithm)}


def served_certificate(server: Server, client: tuple[Path, Path] | None = None) -> bytes:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if client is not None:
        context.load_cert_chain(*map(str, client))
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw, \
            context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def pem_to_der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)


def failures(server: Server) -> float:
    return server.metric("swapwise_certificate_reloads_total", result="failure")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    proc = Server(tmp_path, None, "--drain-seconds", "0").start()
    yield proc
    proc.stop()


def _key_of_another_pair() -> bytes:
    return self_signed(10)["tls.key"]


BAD: dict[str, object] = {
    "expired": lambda: self_signed(-1),
    "encrypted key": lambda: self_signed(10, encrypt=True),
    "garbage": lambda: {"tls.crt": b"\x00garbage" * 100, "tls.key": b"garbage"},
    "partial certificate": lambda: {**(files := cert_files()),
                                    "tls.crt": files["tls.crt"][:200]},
    "key of another certificate": lambda: {**cert_files(), "tls.key": _key_of_another_pair()},
    "empty": lambda: {"tls.crt": b"", "tls.key": b""},
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_serving_files_are_refused_and_the_next_good_ones_served(
    server: Server, name: str
) -> None:
    original = served_certificate(server)
    files = BAD[name]()  # type: ignore[operator]
    server.tls.update({**files, "ca.crt": (server.tls.root / "ca.crt").read_bytes()})
    assert wait_until(lambda: failures(server) == 1, 20), server.logs()[-2000:]
    assert served_certificate(server) == original
    with server.client() as client:  # still trusted, still answering
        assert client.get("/healthz").status_code == 200
    fresh = cert_files()
    server.tls.update(fresh)
    assert wait_until(lambda: served_certificate(server) == pem_to_der(fresh["tls.crt"]), 20)
    assert "Traceback" not in server.logs()


def test_an_expired_certificate_is_refused_at_start(tmp_path: Path) -> None:
    proc = Server(tmp_path, None)
    proc.tls.update({"ca.crt": b"", **self_signed(-1)})
    with pytest.raises(RuntimeError, match="expired"):
        proc.start(timeout=15)


def test_client_ca_garbage_then_rotation(tmp_path: Path) -> None:
    """--client-ca in a watched mount: garbage is refused (the old CA keeps verifying),
    and a new CA is picked up: its clients get in, the old CA's do not."""
    certs = client_certificates(tmp_path / "clients")
    trusted = (certs["trusted"], certs["trusted-key"])
    stranger = (certs["stranger"], certs["stranger-key"])
    ca_mount = Mount(tmp_path / "client-ca", {"ca.crt": certs["trusted-ca"].read_bytes()})
    proc = Server(tmp_path / "server", None, "--client-ca", str(ca_mount.root / "ca.crt"),
                  "--drain-seconds", "0", client_cert=trusted).start()

    def admitted(client: tuple[Path, Path]) -> bool:
        context = ssl.create_default_context(cafile=str(proc.ca_file()))
        context.load_cert_chain(*map(str, client))
        try:
            with httpx.Client(base_url=proc.url, verify=context, timeout=10) as http:
                return http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    try:
        assert admitted(trusted) and not admitted(stranger)
        garbage = (b"-----BEGIN CERTIFICATE-----\nnot base64\n", b"\x00" * 64, b"")
        for round_, content in enumerate(garbage, start=1):
            ca_mount.update({"ca.crt": content})
            assert wait_until(lambda r=round_: failures(proc) == r, 20)
            assert admitted(trusted) and not admitted(stranger)
            # The same CA again (a comment makes the file differ): served, and counted.
            ca_mount.update({"ca.crt": certs["trusted-ca"].read_bytes()
                             + f"# round {round_}\n".encode()})
            assert wait_until(lambda r=round_: proc.metric(
                "swapwise_certificate_reloads_total", result="success") == r, 20)
        ca_mount.update({"ca.crt": certs["stranger-ca"].read_bytes()})
        assert wait_until(lambda: admitted(stranger) and not admitted(trusted), 20)
        assert "Traceback" not in proc.logs()
    finally:
        proc.stop()

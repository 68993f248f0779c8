"""``--client-ca``: only a client presenting a certificate from that CA gets an answer.

This is how the webhook verifies that the caller is the API server (whose
``--admission-control-config-file`` kubeconfig carries the client certificate).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.reliability.support import Server, client_certificates, review_json


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return client_certificates(tmp_path_factory.mktemp("client-certs"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory,
           certs: dict[str, Path]) -> Iterator[Server]:
    proc = Server(tmp_path_factory.mktemp("client-ca"), None,
                  "--client-ca", str(certs["trusted-ca"]), "--drain-seconds", "0",
                  client_cert=(certs["trusted"], certs["trusted-key"])).start()
    yield proc
    proc.stop()


def post(server: Server, cert: tuple[Path, Path] | None, tls12: bool = False) -> int:
    context = ssl.create_default_context(cafile=str(server.ca_file()))
    if tls12:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        context.load_cert_chain(*map(str, cert))
    with httpx.Client(base_url=server.url, verify=context, timeout=10) as client:
        return client.post("/mutate/default", json=review_json()).status_code


@pytest.mark.parametrize("tls12", [False, True])
def test_trusted_client_certificate_is_served(
    server: Server, certs: dict[str, Path], tls12: bool
) -> None:
    assert post(server, (certs["trusted"], certs["trusted-key"]), tls12) == 200


@pytest.mark.parametrize("tls12", [False, True])
@pytest.mark.parametrize("who", [None, "stranger"])
def test_other_clients_are_refused_in_the_handshake(
    server: Server, certs: dict[str, Path], who: str | None, tls12: bool
) -> None:
    cert = None if who is None else (certs[who], certs[f"{who}-key"])
    # TLS 1.2 fails the handshake; with TLS 1.3 the client learns it on its first read.
    with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
        post(server, cert, tls12)


def test_refusals_do_not_disturb_the_trusted_client(
    server: Server, certs: dict[str, Path]
) -> None:
    context = server.ssl_context()
    with httpx.Client(base_url=server.url, verify=context, timeout=10) as trusted:
        for _ in range(5):
            with pytest.raises(httpx.HTTPError):
                post(server, None)
            assert trusted.post("/mutate/default", json=review_json()).status_code == 200

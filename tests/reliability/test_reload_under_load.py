"""Policy reload storms and certificate rotations while admissions stream: none fails.

The files change the way the kubelet changes mounted ConfigMaps and Secrets (symlink
swap, see testkit/server_proc.py), as fast as the test can write them.
"""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import yaml

from testkit.server_proc import cert_files, wait_until
from tests.reliability.support import Server, Stream


def policy(ratio: float) -> bytes:
    return yaml.safe_dump({"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                           "profiles": {"default": {"requestRatio": ratio}}}).encode()


BROKEN = b"apiVersion: swapwise.io/v1alpha1\nkind: SwapPolicy\nprofiles: {default: {swapRaito: 1}}"


def test_policy_reload_storm_under_load(tmp_path: Path) -> None:
    server = Server(tmp_path, policy(0.5), "--drain-seconds", "0").start()
    assert server.policy is not None
    try:
        with Stream(server, threads=4) as stream:
            stream.wait_for(50)
            for round_ in range(60):
                content = BROKEN if round_ % 5 == 4 else policy(0.25 + (round_ % 3) / 10)
                server.policy.update({"policy.yaml": content})
                if round_ % 10 == 0:
                    stream.wait_for(5)
            server.policy.update({"policy.yaml": policy(0.5)})
            assert wait_until(lambda: server.metric(
                "swapwise_policy_reloads_total", result="success") >= 1, 20)
            stream.wait_for(50)
        assert stream.outcomes.failed == [], stream.outcomes.failed[:5]
        assert stream.outcomes.refused == []
        with server.client() as client:
            assert client.get("/readyz").status_code == 200
    finally:
        server.stop()


def _serving_cert(server: Server) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw, \
            context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_certificate_rotations_under_keep_alive_and_new_connections(tmp_path: Path) -> None:
    server = Server(tmp_path, None, "--drain-seconds", "0").start()
    rotations = [cert_files() for _ in range(4)]
    # Clients trust every CA involved, as with a cert-manager CA bundle during rotation.
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(server.ca_file().read_bytes()
                       + b"".join(files["ca.crt"] for files in rotations))

    def trusting() -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(bundle))

    try:
        keep_alive = Stream(server, threads=3, context=trusting)
        with keep_alive:
            keep_alive.wait_for(30)
            for files in rotations:
                before = _serving_cert(server)
                server.tls.update(files)
                assert wait_until(lambda before=before: _serving_cert(server) != before, 20)
                # New connections (handshakes) after the swap, keep-alive ones throughout.
                with Stream(server, threads=2, context=trusting) as fresh:
                    fresh.wait_for(10)
                assert fresh.outcomes.failed == [] and fresh.outcomes.refused == []
                keep_alive.wait_for(10)
        assert keep_alive.outcomes.failed == [], keep_alive.outcomes.failed[:5]
        assert keep_alive.outcomes.refused == []
        assert server.metric("swapwise_certificate_reloads_total",
                             result="success") == len(rotations)
    finally:
        server.stop()

"""A stand-in for the kubelet of a fake Node: HTTPS, reached by the API server's node proxy.

Fake Nodes have no kubelet, so a read through ``/api/v1/nodes/<node>/proxy/...`` fails. For
the pressure guard a test needs one that answers ``/stats/summary`` with memory PSI it
controls. How the API server reaches a node (pkg/registry/core/node ResourceLocation):
the address of the first type in ``--kubelet-preferred-address-types`` (the e2e control
plane: ``InternalIP``) and ``status.daemonEndpoints.kubeletEndpoint.Port``, over HTTPS with
its ``--kubelet-client-certificate`` (here the admin certificate of the cluster CA). It
refuses addresses that are not global unicast, so not 127.0.0.1: the server listens on an
address of this machine's own interfaces instead (:func:`host_address`).

Each FakeKubelet serves one node on a port of its own, with a serving certificate from the
cluster CA, and accepts only clients with a certificate of that CA (the API server). What it
answers is set by the test: a PSI figure, a sequence of figures served in turn, or a failure.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import ssl
import subprocess
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.e2e.cluster import ControlPlane

Answer = float | tuple[int, bytes]  # some avg10 in percent, or (status, body) as it is


def host_address() -> str | None:
    """An IPv4 address of this machine that the API server's node proxy accepts (global
    unicast in Go's sense: not loopback, link-local, multicast or unspecified), or None."""
    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show", "scope", "global"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        fields = line.split()
        if "inet" not in fields:
            continue
        address = ipaddress.ip_interface(fields[fields.index("inet") + 1]).ip
        if not (address.is_loopback or address.is_link_local or address.is_multicast
                or address.is_unspecified):
            return str(address)
    return None


def summary(node: str, some: float, full: float) -> dict[str, Any]:
    """The node part of a kubelet Summary as ``only_cpu_and_memory=true`` gives it."""
    # avg60 between the tests' thresholds and a still counter: the windows of these tests
    # are seconds, which a kernel's minute average could not follow (the guard takes avg60
    # and the counter as evidence too: tests/test_pressure_guard.py covers that).
    psi = {"full": {"total": 1000, "avg10": full, "avg60": 25, "avg300": 25},
           "some": {"total": 5000, "avg10": some, "avg60": 25, "avg300": 25}}
    return {"node": {"nodeName": node, "startTime": "2026-01-01T11:49:31Z",
                     "cpu": {"time": "2026-01-01T12:00:03Z", "usageNanoCores": 1000},
                     "memory": {"time": "2026-01-01T12:00:03Z", "workingSetBytes": 2 << 30,
                                "psi": psi}},
            "pods": []}


class FakeKubelet:
    """One node's kubelet: ``/stats/summary`` only (anything else is a 404)."""

    def __init__(self, cp: ControlPlane, node: str, address: str, pki: Path) -> None:
        self.node = node
        self.address = address
        self._answers: list[Answer] = [0.0]
        self._next = 0
        self._cycle = False
        self.full = 0.5
        self.requests: list[str] = []  # path?query of every request, in order
        self._lock = threading.Lock()
        cert, key = cp.issue_serving_cert(f"kubelet-{node}", node, address)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        context.load_verify_locations(pki / "ca.crt")
        context.verify_mode = ssl.CERT_REQUIRED  # only the API server (a client of the CA)
        handler = self._handler()
        self.server = ThreadingHTTPServer((address, 0), handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                        name=f"kubelet-{node}")

    def start(self) -> FakeKubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, *answers: Answer) -> None:
        """Serve these in turn, then the last one again and again (one: always that)."""
        with self._lock:
            self._answers, self._next, self._cycle = list(answers), 0, False

    def cycle(self, *answers: Answer) -> None:
        """Serve these in turn, over and over."""
        with self._lock:
            self._answers, self._next, self._cycle = list(answers), 0, True

    def reads(self) -> int:
        with self._lock:
            return sum(r.startswith("/stats/summary") for r in self.requests)

    def _take(self) -> Answer:
        with self._lock:
            count = len(self._answers)
            index = self._next % count if self._cycle else min(self._next, count - 1)
            self._next += 1
            return self._answers[index]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        kubelet = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with kubelet._lock:
                    kubelet.requests.append(self.path)
                if not self.path.startswith("/stats/summary"):
                    self._send(404, b"404 page not found\n", "text/plain")
                    return
                answer = kubelet._take()
                if isinstance(answer, tuple):
                    status, body = answer
                    self._send(status, body, "application/json")
                    return
                body = json.dumps(summary(kubelet.node, answer, kubelet.full)).encode()
                self._send(200, body, "application/json")

            def _send(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the test's own records are enough

        return Handler


def point_node_at(cp: ControlPlane, kubelet: FakeKubelet) -> None:
    """What a kubelet reports about itself: its address and port, in the Node's status."""
    status = {"addresses": [{"type": "InternalIP", "address": kubelet.address},
                            {"type": "Hostname", "address": kubelet.node}],
              "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet.port}}}
    cp.kubectl("patch", "node", kubelet.node, "--subresource=status", "--type=merge", "-p",
               json.dumps({"status": status}))


NO_ADDRESS = ("the API server's node proxy refuses loopback addresses, and this machine has no "
              "global unicast IPv4 address to serve a fake kubelet on")


@contextlib.contextmanager
def fake_kubelets(cp: ControlPlane, nodes: Sequence[str]) -> Iterator[dict[str, FakeKubelet]]:
    """A started FakeKubelet per node, each Node pointed at its own; stopped on the way out.
    Check :func:`host_address` first: without one this raises RuntimeError(NO_ADDRESS)."""
    address = host_address()
    if address is None:
        raise RuntimeError(NO_ADDRESS)
    kubelets: dict[str, FakeKubelet] = {}
    try:
        for name in nodes:
            kubelets[name] = FakeKubelet(cp, name, address, cp.pki).start()
            point_node_at(cp, kubelets[name])
        yield kubelets
    finally:
        for kubelet in kubelets.values():
            kubelet.stop()

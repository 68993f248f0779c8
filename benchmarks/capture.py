"""What kube-apiserver sends a mutating webhook, byte for byte.

    python -m benchmarks.capture [--k8s 1.34] [--out benchmarks/data/captured]

Starts the e2e control plane (tests/e2e/cluster.py), registers a tiny HTTPS server (the
standard library's, HTTP/1.1, no ALPN, like uvicorn) as the webhook for one namespace,
creates the benchmarks' 4-container pod there (benchmarks/apiserver.py's ``bench_pod``)
and writes what the API server sent: the request line and headers (``request-head.txt``)
and the AdmissionReview body (``review.json``). testkit/payloads.py builds the benchmarks'
requests from what this shows; benchmarks/tests/test_payloads.py checks they agree with it.
"""

from __future__ import annotations

import argparse
import json
import ssl
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

from benchmarks.apiserver import bench_pod
from tests.e2e.cluster import (
    DEFAULT_LINE,
    ControlPlane,
    Swapwise,
    bin_dir,
    free_port,
    register_webhook,
)

CAPTURED = Path(__file__).resolve().parent / "data" / "captured"


class Capture(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[tuple[bytes, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        head = "".join(f"{line}\r\n" for line in [
            self.requestline, *(f"{k}: {v}" for k, v in self.headers.items())]).encode()
        Capture.seen.append((head, body))
        uid = json.loads(body)["request"]["uid"]
        answer = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                             "response": {"uid": uid, "allowed": True}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *_args: Any) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--k8s", default=DEFAULT_LINE)
    parser.add_argument("--out", type=Path, default=CAPTURED)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="swapwise-capture-"))
    certs = Swapwise(work / "certs-owner")  # only for `swapwise certs` (not started)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.cert_dir / "tls.crt", certs.cert_dir / "tls.key")
    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Capture)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    apiserver = bin_dir(args.k8s) / "kube-apiserver"
    with ControlPlane(bin_dir(DEFAULT_LINE), apiserver=apiserver) as cp:
        cp.create_namespace("capture", {"swapwise.io/profile": "sandbox"})
        register_webhook(cp, f"https://127.0.0.1:{port}", certs.ca_bundle, ["sandbox"])
        pod = bench_pod()
        pod["metadata"]["namespace"] = "capture"
        for _ in range(300):
            Capture.seen.clear()
            cp.kubectl("create", "-f", "-", input=json.dumps(pod))
            if Capture.seen:
                break
            time.sleep(0.2)
    server.shutdown()
    if not Capture.seen:
        raise SystemExit("the API server never called the capture webhook")
    head, body = Capture.seen[-1]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "request-head.txt").write_bytes(head)
    (args.out / "review.json").write_bytes(body)
    print(head.decode())
    print(f"body: {len(body)} bytes -> {args.out}")


if __name__ == "__main__":
    main()

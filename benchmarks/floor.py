"""The cheapest possible admission webhook, to price the API server's side of a call.

    python -m benchmarks.floor --port P --cert-dir D

Raw asyncio protocol on uvloop over TLS, no framework, no JSON parsing: it finds the uid
with a regex and allows the pod unchanged. benchmarks/apiserver.py registers it for one
namespace, so "floor" minus "without webhook" is what any webhook costs a pod creation
on this machine, and swapwise's own share is what it adds on top.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import ssl
from typing import cast

import uvloop

UID = re.compile(rb'"uid"\s*:\s*"([^"]*)"')


class Floor(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's TLS transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buffer[:head_end].lower()
            match = re.search(rb"content-length:\s*(\d+)", head)
            length = int(match.group(1)) if match else 0
            end = head_end + 4 + length
            if len(self.buffer) < end:
                return
            body, self.buffer = self.buffer[head_end + 4:end], self.buffer[end:]
            found = UID.search(body)
            uid = found.group(1) if found else b""
            answer = (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",'
                      b'"response":{"uid":"' + uid + b'","allowed":true}}')
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\n\r\n%s" % (len(answer), answer))


async def serve(port: int, cert_dir: str) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(f"{cert_dir}/tls.crt", f"{cert_dir}/tls.key")
    server = await asyncio.get_running_loop().create_server(
        Floor, "127.0.0.1", port, ssl=context)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert-dir", required=True)
    args = parser.parse_args()
    uvloop.run(serve(args.port, args.cert_dir))


if __name__ == "__main__":
    main()

"""The floor: a no-op admission webhook on the same server stack as swapwise.

    python -m benchmarks.floor --port P --cert-dir D

uvicorn on uvloop with httptools over TLS (swapwise's stack), serving a bare ASGI app: no
framework, no routing, no JSON parsing, no logging. It reads the body, finds the uid
with a regex and allows the pod unchanged. What a webhook costs on this stack before it
does anything, so swapwise ÷ floor is what swapwise adds: its HTTP guards, routing, the
review parsed and decided, the patch, metrics and the log line.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import uvicorn

UID = re.compile(rb'"uid"\s*:\s*"([^"]*)"')
HEADERS = [(b"content-type", b"application/json")]

Message = MutableMapping[str, Any]


async def app(scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Message]],
              send: Callable[[Message], Awaitable[None]]) -> None:
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    found = UID.search(body)
    uid = found.group(1) if found else b""
    answer = (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",'
              b'"response":{"uid":"' + uid + b'","allowed":true}}')
    await send({"type": "http.response.start", "status": 200,
                "headers": [*HEADERS, (b"content-length", b"%d" % len(answer))]})
    await send({"type": "http.response.body", "body": answer})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert-dir", required=True)
    args = parser.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, loop="uvloop", http="httptools",
                lifespan="off", access_log=False, log_level="warning", server_header=False,
                date_header=False, proxy_headers=False,
                timeout_keep_alive=120,  # as swapwise: longer than the API server's idle 90 s
                ssl_certfile=f"{args.cert_dir}/tls.crt", ssl_keyfile=f"{args.cert_dir}/tls.key")


if __name__ == "__main__":
    main()

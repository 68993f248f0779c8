"""The benchmarks send what kube-apiserver sends: checked against a captured call.

benchmarks/data/captured/ holds what kube-apiserver 1.34 sent a webhook for the benchmarks'
4-container pod created by kubectl (benchmarks/capture.py). The generated review of the
same pod, by the same client, must be the same bytes once the per-call values (uid, the
token volume's random suffix, the managedFields time, the client's credential) are set
to the captured ones; the request head must carry the same request line and headers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from testkit import payloads

CAPTURED = Path(__file__).resolve().parents[1] / "data" / "captured"


def test_generated_review_is_what_the_api_server_sends() -> None:
    captured = (CAPTURED / "review.json").read_bytes()
    request = json.loads(captured)["request"]
    obj = payloads.pod(4, owned=False, manager="kubectl-create",
                       namespace=request["namespace"])
    obj["metadata"]["managedFields"][0]["time"] = \
        request["object"]["metadata"]["managedFields"][0]["time"]
    generated = payloads.dumps(payloads.review(
        obj, request["uid"], user=request["userInfo"], options=request["options"]))
    volume = request["object"]["spec"]["volumes"][0]["name"]
    assert generated.replace(payloads.TOKEN_VOLUME.encode(), volume.encode()) == captured


def test_request_head_is_what_the_api_server_sends() -> None:
    head = (CAPTURED / "request-head.txt").read_bytes()
    captured_lines = head.decode().strip().split("\r\n")
    body = b"{}"
    ours = payloads.request_bytes(body).split(b"\r\n\r\n")[0].decode().split("\r\n")
    line, *headers = captured_lines
    assert re.fullmatch(r"POST /mutate/sandbox\?timeout=\d+s HTTP/1\.1", line)
    assert re.fullmatch(r"POST /mutate/sandbox\?timeout=10s HTTP/1\.1", ours[0])
    names = [h.split(":", 1)[0] for h in headers]
    assert names == [h.split(":", 1)[0] for h in ours[1:]]
    fixed = {h for h in headers if not h.startswith(("Host:", "Content-Length:"))}
    assert fixed == {h for h in ours[1:] if not h.startswith(("Host:", "Content-Length:"))}

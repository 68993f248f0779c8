"""Shared machinery of the reliability tests: the app in-process, checks, real servers.

Why in-process for volume: hypothesis needs thousands of examples to find the odd input,
and a socket round trip per example would make that minutes. The same checks then run on
a smaller sample over real HTTPS, where TLS and the HTTP parser are in the path too.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime as dt
import json
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import kubernetes_validate
import uvloop
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from testkit.asgi import Reply, call
from testkit.engine_check import path_allowed, strip_memory
from testkit.server_proc import ServerProcess, wait_until
from webhook.analysis.workloads import POD_PATHS
from webhook.policy import Policy, default_policy
from webhook.server.app import AppState, create_app
from webhook.server.metrics import Metrics
from webhook.server.reload import PolicyStore

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.34.0"
# SWAPWISE_FUZZ_LONG=1: the long mode (50x the examples, fresh random ones each run) for a
# soak before a release; SWAPWISE_FUZZ_LONG=N multiplies by N. CI runs a fixed sample.
_LONG = os.environ.get("SWAPWISE_FUZZ_LONG", "")
LONG = _LONG not in ("", "0")
SCALE = (int(_LONG) if _LONG.isdigit() and int(_LONG) > 1 else 50) if LONG else 1
HANG = 10.0  # seconds: an in-process admission taking this long is a hang


def examples(n: int) -> int:
    """Example count for hypothesis: ``n`` in CI, ``SCALE`` times more in the long mode."""
    return n * SCALE


class InProcess:
    """The real ASGI app on a private event loop; the policy can be swapped per example."""

    def __init__(self, policy: Policy | None = None) -> None:
        metrics = Metrics()
        self.state = AppState(PolicyStore(None, metrics), metrics, serving=True)
        if policy is not None:
            self.state.policies.policy = policy
        self.app = create_app(self.state)
        self.loop = uvloop.new_event_loop()

    def post(self, body: bytes, profile: str = "default", chunks: int = 1,
             declare_length: bool = True) -> Reply:
        coroutine = call(self.app, "POST", f"/mutate/{profile}", body, chunks=chunks,
                         declare_length=declare_length)
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, HANG))

    def use(self, policy: Policy) -> None:
        self.state.policies.policy = policy

    def close(self) -> None:
        self.loop.close()


def default() -> Policy:
    return default_policy()


def check_reply(reply: Reply | Any, uid: str | None = None) -> dict[str, Any] | None:
    """Never a 5xx; a 200 is a well-formed AdmissionReview response (returned)."""
    status = reply.status if isinstance(reply, Reply) else reply.status_code
    content = reply.body if isinstance(reply, Reply) else reply.content
    assert status < 500, (status, content[:500])
    assert status in (200, 400, 413), (status, content[:500])
    parsed = json.loads(content)
    if status != 200:
        assert "AdmissionReview" in parsed["error"] or status == 413, parsed
        return None
    assert parsed["apiVersion"] == "admission.k8s.io/v1" and parsed["kind"] == "AdmissionReview"
    response: dict[str, Any] = parsed["response"]
    assert response["allowed"] is True
    if uid is not None:
        assert response["uid"] == uid
    for message in response.get("warnings", []):
        assert isinstance(message, str) and message.startswith("swapwise: ")
        assert len(message) <= 120, message
    if "patch" in response:
        assert response["patchType"] == "JSONPatch"
    else:
        assert "patchType" not in response
    return response


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    if "patch" not in response:
        return []
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


def apply_checked(pod: Any, response: dict[str, Any]) -> Any:
    """Apply the response's patch to ``pod``; check docs/rules.md's limits on what may change."""
    ops = patch_of(response)
    if not ops:
        return pod
    for op in ops:
        assert op["op"] in ("add", "replace"), op
        assert path_allowed(op["path"]), f"patch touches {op['path']}"
    result = jsonpatch.apply_patch(copy.deepcopy(pod), ops)  # raises if it does not apply
    assert _unnulled(strip_memory(result)) == _unnulled(strip_memory(pod)), \
        "something besides memory changed"
    return result


def _unnulled(pod: Any) -> Any:
    """``metadata: null`` and ``annotations: null`` read as absent, as the engine reads them."""
    if isinstance(pod, dict):
        if pod.get("metadata") is None:
            pod.pop("metadata", None)
        elif isinstance(pod["metadata"], dict) and "annotations" in pod["metadata"] \
                and pod["metadata"]["annotations"] is None:
            del pod["metadata"]["annotations"]
            if not pod["metadata"]:
                del pod["metadata"]
    return pod


def validate(pod: Any) -> None:
    """The pod is valid against the Kubernetes 1.34 OpenAPI schema (strict: no unknowns)."""
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def review_bytes(obj: Any, uid: str = "fuzz-uid", namespace: str = "ns") -> bytes:
    from testkit.pods import review

    body = review(None, namespace=namespace)
    body["request"]["uid"] = uid
    body["request"]["object"] = obj
    return json.dumps(body).encode()


def example_pods() -> Iterator[dict[str, Any]]:
    """Every pod (and pod template, as a Pod) in examples/."""
    for path in sorted(ROOT.joinpath("examples").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if not isinstance(document, dict) or document.get("kind") not in POD_PATHS:
                continue
            node: Any = document
            for key in POD_PATHS[document["kind"]]:
                node = node[key]
            pod = copy.deepcopy(node)
            pod.setdefault("apiVersion", "v1")
            pod.setdefault("kind", "Pod")
            pod.setdefault("metadata", {}).setdefault("name", "from-example")
            yield pod


# --- real servers and steady clients ---------------------------------------------------


class Server(ServerProcess):
    """``swapwise serve`` with an optional client certificate for every probe it makes."""

    def __init__(self, workdir: Path, policy: bytes | None = None, *extra: str,
                 client_cert: tuple[Path, Path] | None = None) -> None:
        super().__init__(workdir, policy, *extra)
        self.client_cert = client_cert

    def ssl_context(self) -> ssl.SSLContext:
        context = super().ssl_context()
        if self.client_cert is not None:
            context.load_cert_chain(*map(str, self.client_cert))
        return context

    def children(self) -> list[int]:
        assert self.process is not None
        path = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(pid) for pid in path.read_text().split()] if path.exists() else []


def review_json(containers: int = 1) -> dict[str, Any]:
    from testkit.pods import guaranteed, pod, review

    return review(pod(*[guaranteed(name=f"c{i}") for i in range(containers)]))


class Outcomes:
    """What a steady client saw, sorted the way a shutdown test must tell them apart."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok = 0
        self.refused: list[str] = []  # no connection: the request was never sent
        self.failed: list[str] = []  # sent on an open connection and not answered 200

    def add(self, kind: str, detail: str = "") -> None:
        with self.lock:
            if kind == "ok":
                self.ok += 1
            elif kind == "refused":
                self.refused.append(detail)
            else:
                self.failed.append(detail)


class Stream:
    """``threads`` clients, each on its own keep-alive connection, posting reviews back to
    back until stopped: the load a busy API server puts on the webhook."""

    def __init__(self, server: ServerProcess, threads: int = 4,
                 context: Callable[[], ssl.SSLContext] | None = None,
                 profile: str = "default") -> None:
        self.server = server
        self.outcomes = Outcomes()
        self.stop_event = threading.Event()
        self.context = context or server.ssl_context
        self.profile = profile
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        body = review_json(2)
        client = httpx.Client(base_url=self.server.url, verify=self.context(), timeout=30)
        try:
            while not self.stop_event.is_set():
                try:
                    reply = client.post(f"/mutate/{self.profile}", json=body)
                except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                    self.outcomes.add("refused", repr(exc))
                    time.sleep(0.05)
                    continue
                except httpx.HTTPError as exc:
                    self.outcomes.add("failed", repr(exc))
                    continue
                if reply.status_code == 200 and reply.json()["response"]["uid"] == \
                        body["request"]["uid"]:
                    self.outcomes.add("ok")
                else:
                    self.outcomes.add("failed", f"{reply.status_code} {reply.text[:200]}")
        finally:
            client.close()

    def __enter__(self) -> Stream:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> Outcomes:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(60)
        return self.outcomes

    def wait_for(self, answered: int, timeout: float = 30) -> None:
        """Block until ``answered`` more requests succeeded (progress, not timing)."""
        target = self.outcomes.ok + answered
        assert wait_until(lambda: self.outcomes.ok >= target or bool(self.outcomes.failed),
                          timeout), f"no progress: {self.outcomes.ok} < {target}"


def client_certificates(directory: Path) -> dict[str, Path]:
    """A client CA, a client certificate it signs, and one from an unrelated CA."""
    directory.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for label in ("trusted", "stranger"):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{label} client CA")])
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
              .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .sign(ca_key, hashes.SHA256()))
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")])
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(ca_name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
        pem = serialization.Encoding.PEM
        (directory / f"{label}-ca.crt").write_bytes(ca.public_bytes(pem))
        (directory / f"{label}.crt").write_bytes(cert.public_bytes(pem))
        (directory / f"{label}.key").write_bytes(key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        paths[f"{label}-ca"] = directory / f"{label}-ca.crt"
        paths[label] = directory / f"{label}.crt"
        paths[f"{label}-key"] = directory / f"{label}.key"
    return paths

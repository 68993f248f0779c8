"""Integration: a real ``swapwise serve`` over TLS, driven by a real HTTPS client."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import pytest
import yaml

from testkit.pods import container, guaranteed, pod, review
from testkit.server_proc import ServerProcess, cert_files, wait_until

POLICY = {
    "apiVersion": "swapwise.io/v1alpha1",
    "kind": "SwapPolicy",
    "profiles": {"sandbox": {"swapRatio": 2}, "ci": {"requestRatio": 0.5, "minRequest": "64Mi"}},
    "namespaces": {"team-a": {"requestRatio": 0.25}},
}


def policy_bytes(policy: dict[str, Any]) -> bytes:
    return yaml.safe_dump(policy).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("server"), policy_bytes(POLICY)).start()
    yield proc
    proc.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def admit(client: httpx.Client, body: Any, profile: str = "sandbox") -> dict[str, Any]:
    reply = client.post(f"/mutate/{profile}", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"] == "application/json"
    result: dict[str, Any] = reply.json()
    assert result["apiVersion"] == "admission.k8s.io/v1" and result["kind"] == "AdmissionReview"
    return result["response"]


def patched(obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(obj, ops)
    return result


def test_mutates_guaranteed_pod(client: httpx.Client) -> None:
    p = pod(guaranteed("2Gi"))
    body = review(p)
    response = admit(client, body)
    assert response["uid"] == body["request"]["uid"]
    assert response["allowed"] is True
    result = patched(p, response)
    assert result["spec"]["containers"][0]["resources"]["requests"]["memory"] == "683Mi"
    assert result["metadata"]["annotations"]["swapwise.io/profile"] == "sandbox"
    assert response["warnings"] == [
        "swapwise: app memory request 2Gi -> 683Mi (limit 2Gi)",
        "swapwise: needs nodes whose swap is >= 1999\u2030 of their RAM (node label "
        "swapwise.io/swap-permille, from the node agent)"]
    terms = result["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][-1] == {
        "key": "swapwise.io/swap-permille", "operator": "Gt", "values": ["1998"]}


def test_profiles_and_namespace_overrides(client: httpx.Client) -> None:
    p = pod(guaranteed("1Gi"))
    ci = patched(p, admit(client, review(p), "ci"))
    assert ci["spec"]["containers"][0]["resources"]["requests"]["memory"] == "512Mi"
    team = patched(p, admit(client, review(p, namespace="team-a"), "sandbox"))
    assert team["spec"]["containers"][0]["resources"]["requests"]["memory"] == "256Mi"


def test_dry_run_gets_the_same_answer(client: httpx.Client) -> None:
    p = pod(guaranteed("2Gi"))
    wet, dry = review(p), review(p, dry_run=True)
    dry["request"]["uid"] = wet["request"]["uid"]
    assert admit(client, wet) == admit(client, dry)


def test_reinvocation_of_mutated_pod_gives_no_patch(client: httpx.Client) -> None:
    p = pod(guaranteed("2Gi"), container("sidecar", request="10Mi", limit="100Mi"))
    once = patched(p, admit(client, review(p)))
    response = admit(client, review(once))
    assert "patch" not in response and "patchType" not in response


@pytest.mark.parametrize(
    "body",
    [
        review(pod(guaranteed()), operation="UPDATE"),
        review(pod(guaranteed()), operation="DELETE"),
        review({"metadata": {"name": "d"}}, kind="Deployment"),
        review(pod(guaranteed()), sub_resource="ephemeralcontainers"),
        review(None, operation="CONNECT"),
    ],
)
def test_other_requests_are_allowed_without_patch(client: httpx.Client, body: Any) -> None:
    response = admit(client, body)
    assert response == {"uid": body["request"]["uid"], "allowed": True}


def test_unknown_profile_allowed_with_warning(client: httpx.Client) -> None:
    body = review(pod(guaranteed()))
    response = admit(client, body, "no-such-profile")
    assert response["allowed"] is True and "patch" not in response
    assert response["warnings"] == [
        "swapwise: unknown profile 'no-such-profile'; pod left unchanged"]


def test_skipped_pod_is_allowed_without_patch(client: httpx.Client) -> None:
    body = review(pod(guaranteed(), priorityClassName="system-node-critical"))
    assert admit(client, body) == {"uid": body["request"]["uid"], "allowed": True}


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json",
        b"[1,2,3]",
        b'{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"a"}}',
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}',
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":""}}',
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":7}}',
        b"\xff\xfe\x00garbage",
        b"[" * 100_000,
        b'{"a":' + b"1" * 5000 + b"}",
    ],
)
def test_not_an_admission_review_is_400_with_json_error(
    client: httpx.Client, content: bytes
) -> None:
    reply = client.post("/mutate/sandbox", content=content)
    assert reply.status_code == 400
    assert "AdmissionReview" in reply.json()["error"]


def test_malformed_pod_in_valid_review_is_allowed_unchanged(client: httpx.Client) -> None:
    body = review({"spec": {"containers": "oops"}})
    response = admit(client, body)
    assert "patch" not in response and response["allowed"] is True
    assert response["warnings"][0].startswith("swapwise: pod left unchanged")


def test_body_over_3_mib_is_413(client: httpx.Client) -> None:
    reply = client.post("/mutate/sandbox", content=b" " * (3 * 1024 * 1024 + 1))
    assert reply.status_code == 413
    # Without Content-Length (chunked), the limit applies while streaming.
    def chunks() -> Iterator[bytes]:
        for _ in range(5):
            yield b" " * (1024 * 1024)
    reply = client.post("/mutate/sandbox", content=chunks())
    assert reply.status_code == 413


def test_body_just_under_the_limit_is_read(client: httpx.Client) -> None:
    body = review(pod(guaranteed()))
    content = json.dumps(body).encode()
    content += b" " * (3 * 1024 * 1024 - len(content))
    assert client.post("/mutate/sandbox", content=content).status_code == 200


def test_health_and_readiness(client: httpx.Client) -> None:
    assert client.get("/healthz").status_code == 200
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["profiles"] == ["ci", "sandbox"]
    assert client.get("/nope").status_code == 404
    assert client.get("/mutate/sandbox").status_code == 405


def test_metrics(server: ServerProcess, client: httpx.Client) -> None:
    before = server.metric("swapwise_admission_requests_total", profile="ci", outcome="mutated")
    changed = server.metric("swapwise_containers_changed_total", profile="ci")
    admit(client, review(pod(guaranteed(), guaranteed(name="b"))), "ci")
    assert server.metric("swapwise_admission_requests_total",
                         profile="ci", outcome="mutated") == before + 1
    assert server.metric("swapwise_containers_changed_total", profile="ci") == changed + 2
    client.post("/mutate/whatever", content=b"x")
    assert server.metric("swapwise_admission_requests_total",
                         profile="unknown", outcome="invalid") >= 1
    text = client.get("/metrics").text
    assert 'swapwise_admission_duration_seconds_bucket{le="0.0001"}' in text
    assert "swapwise_certificate_expiry_timestamp_seconds" in text
    assert server.metric("swapwise_certificate_expiry_timestamp_seconds") > 1.7e9
    for name in ("swapwise_policy_reloads_total", "swapwise_certificate_reloads_total"):
        assert f'{name}{{result="success"}} 0.0' in text
        assert f'{name}{{result="failure"}} 0.0' in text


def test_only_tls(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(5)
        data = sock.recv(100)
    assert not data.startswith(b"HTTP/1.1 200")


def _handshake(server: ServerProcess, **settings: Any) -> str:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(str(server.ca_file()))
    for name, value in settings.items():
        if name == "ciphers":
            context.set_ciphers(value)
        else:
            setattr(context, name, value)
    with socket.create_connection(("127.0.0.1", server.port)) as sock, context.wrap_socket(
        sock, server_hostname="localhost"
    ) as tls:
        return f"{tls.version()} {tls.cipher()[0]}"  # type: ignore[index]


def test_tls_versions_and_ciphers(server: ServerProcess) -> None:
    tls12 = ssl.TLSVersion.TLSv1_2
    assert _handshake(server, maximum_version=tls12) == "TLSv1.2 ECDHE-ECDSA-AES256-GCM-SHA384"
    assert _handshake(server).startswith("TLSv1.3")
    # CBC suites are refused even on TLS 1.2.
    with pytest.raises(ssl.SSLError):
        _handshake(server, maximum_version=tls12, ciphers="ECDHE-ECDSA-AES128-SHA256")
    # TLS 1.1 is refused (the client is allowed to offer it at security level 0).
    with pytest.raises(ssl.SSLError):
        _handshake(server, minimum_version=ssl.TLSVersion.MINIMUM_SUPPORTED,
                   maximum_version=ssl.TLSVersion.TLSv1_1, ciphers="ALL:@SECLEVEL=0")


def test_one_json_log_line_per_admission_without_pod_contents(
    server: ServerProcess, client: httpx.Client
) -> None:
    body = review(pod(guaranteed(), labels={"secret-label": "do-not-log"}))
    admit(client, body)
    uid = body["request"]["uid"]
    assert wait_until(lambda: uid in server.logs())
    lines = [json.loads(line) for line in server.logs().splitlines() if uid in line]
    assert len(lines) == 1
    entry = lines[0]
    assert entry["msg"] == "admission" and entry["outcome"] == "mutated"
    assert entry["profile"] == "sandbox" and entry["namespace"] == "ns"
    assert entry["containers_changed"] == 1 and entry["duration_ms"] > 0
    assert "do-not-log" not in server.logs()


# --- hot reload ----------------------------------------------------------------------


def test_policy_reload_by_symlink_swap_and_bad_policy_kept_out(tmp_path: Path) -> None:
    proc = ServerProcess(tmp_path, policy_bytes(POLICY)).start()
    try:
        assert proc.policy is not None
        with proc.client() as client:
            p = pod(guaranteed("1Gi"))
            assert admit(client, review(p), "new")["warnings"][0].startswith(
                "swapwise: unknown profile")
            new_policy = {**POLICY, "profiles": {"new": {"requestRatio": 0.5}}}
            proc.policy.update({"policy.yaml": policy_bytes(new_policy)})
            assert wait_until(lambda: proc.metric("swapwise_policy_reloads_total",
                                                  result="success") == 1)
            result = patched(p, admit(client, review(p), "new"))
            assert result["spec"]["containers"][0]["resources"]["requests"]["memory"] == "512Mi"

            typo = b"apiVersion: swapwise.io/v1alpha1\nkind: SwapPolicy\n" \
                b"profiles: {new: {swapRaito: 1}}\n"
            proc.policy.update({"policy.yaml": typo})
            assert wait_until(lambda: proc.metric("swapwise_policy_reloads_total",
                                                  result="failure") == 1)
            # The last good policy stays in force.
            result = patched(p, admit(client, review(p), "new"))
            assert result["spec"]["containers"][0]["resources"]["requests"]["memory"] == "512Mi"
            assert "profiles.new.swapRaito: unknown field" in proc.logs()
            assert client.get("/readyz").status_code == 200
    finally:
        proc.stop()


def _peer_cert(proc: ServerProcess) -> bytes:
    context = ssl.create_default_context(cafile=None)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", proc.port)) as sock, context.wrap_socket(
        sock
    ) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_certificate_rotation_under_load_drops_nothing(tmp_path: Path) -> None:
    proc = ServerProcess(tmp_path).start()
    try:
        first = _peer_cert(proc)
        new_files = cert_files()
        # Clients trust both CAs during the rotation, as with a cert-manager CA bundle.
        bundle = tmp_path / "bundle.pem"
        bundle.write_bytes(proc.ca_file().read_bytes() + new_files["ca.crt"])
        stop = threading.Event()
        results: list[int | str] = []

        def hammer() -> None:
            context = ssl.create_default_context(cafile=str(bundle))
            while not stop.is_set():
                # A new connection each time, so handshakes happen across the swap.
                with httpx.Client(base_url=proc.url, verify=context, timeout=10) as client:
                    try:
                        reply = client.post("/mutate/default", json=review(pod(guaranteed())))
                        results.append(reply.status_code)
                    except httpx.HTTPError as exc:
                        results.append(repr(exc))

        workers = [threading.Thread(target=hammer) for _ in range(4)]
        for worker in workers:
            worker.start()
        wait_until(lambda: len(results) > 20)
        proc.tls.update(new_files)
        assert wait_until(lambda: _peer_cert(proc) != first)
        count = len(results)
        wait_until(lambda: len(results) > count + 20)
        stop.set()
        for worker in workers:
            worker.join()
        assert results and all(r == 200 for r in results), [r for r in results if r != 200][:5]
        assert proc.metric("swapwise_certificate_reloads_total", result="success") == 1
        # A broken pair is refused; the current certificate keeps serving.
        current = _peer_cert(proc)
        proc.tls.update({**new_files, "tls.key": cert_files()["tls.key"]})
        assert wait_until(lambda: proc.metric("swapwise_certificate_reloads_total",
                                              result="failure") == 1)
        assert _peer_cert(proc) == current
    finally:
        proc.stop()


def test_invalid_policy_at_start_is_refused(tmp_path: Path) -> None:
    proc = ServerProcess(tmp_path, b"apiVersion: swapwise.io/v1alpha1\nkind: SwapPolicy\n")
    with pytest.raises(RuntimeError, match="profiles: Field required"):
        proc.start(timeout=10)


def test_sigterm_shuts_down_gracefully(tmp_path: Path) -> None:
    proc = ServerProcess(tmp_path).start()
    assert proc.stop(timeout=10) == 0
    assert '"msg": "stopped"' in proc.logs()

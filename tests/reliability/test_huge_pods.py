"""Bounded work per request: huge reviews cannot stall the others. And no redirects.

The issue's attack: 2.2 MB reviews of 38,000 limit-only containers, 4 clients in a loop.
Before: each blocked the event loop 1.3-2.6 s and answered 15.9 MB, so /healthz and every
ordinary admission on that worker waited past the API server's timeout. Now such a pod
is left unchanged with a warning after reading only its list lengths (more than 1000
containers), and reviews over 64 KiB are parsed and decided in a child process.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from testkit.pods import review
from tests.reliability.support import Server, review_json

CONTAINERS = 38_000
CLIENTS = 4
MEASURE_SECONDS = 25.0
P99_LIMIT = 0.100  # seconds, what the issue asks; typical figures are far below


def huge_review(containers: int = CONTAINERS) -> bytes:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "huge", "namespace": "ns"},
           "spec": {"containers": [{"name": f"c{i}", "resources": {"limits": {"memory": "1Gi"}}}
                                   for i in range(containers)]}}
    body: bytes = orjson.dumps(review(pod))
    return body


def client(server: Server, timeout: float) -> httpx.Client:
    return httpx.Client(base_url=server.url, verify=server.ssl_context(), timeout=timeout)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    proc = Server(tmp_path_factory.mktemp("huge"), None, "--drain-seconds", "0").start()
    yield proc
    proc.stop()


def test_a_huge_pod_is_left_unchanged_with_a_warning_and_a_small_answer(server: Server) -> None:
    body = huge_review()
    assert len(body) > 2_000_000
    with client(server, 60) as http:
        reply = http.post("/mutate/default", content=body,
                          headers={"content-type": "application/json"})
    assert reply.status_code == 200
    assert len(reply.content) < 1000
    response = reply.json()["response"]
    assert response["allowed"] is True and "patch" not in response
    [message] = response["warnings"]
    assert "38000" in message and "at most 1000" in message


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _flood(url: str, ca: str, stop: Any, answered: Any, failed: Any) -> None:
    """One flood client, in a process of its own so that it cannot slow the probe."""
    import ssl

    body = huge_review()
    context = ssl.create_default_context(cafile=ca)
    with httpx.Client(base_url=url, verify=context, timeout=120) as http:
        while not stop.is_set():
            try:
                reply = http.post("/mutate/default", content=body,
                                  headers={"content-type": "application/json"})
            except httpx.HTTPError:
                failed.value += 1
                continue
            if reply.status_code == 200:
                answered.value += 1
            else:
                failed.value += 1


def test_huge_reviews_in_a_loop_do_not_stall_health_or_ordinary_admissions(
    server: Server
) -> None:
    spawn = multiprocessing.get_context("spawn")
    stop = spawn.Event()
    answered = spawn.Value("i", 0)
    failed = spawn.Value("i", 0)
    clients = [spawn.Process(target=_flood, args=(server.url, str(server.ca_file()), stop,
                                                  answered, failed), daemon=True)
               for _ in range(CLIENTS)]
    for process in clients:
        process.start()
    health: list[float] = []
    admissions: list[float] = []
    ordinary = orjson.dumps(review_json(2))
    try:
        deadline = time.monotonic() + 90
        while answered.value < CLIENTS and time.monotonic() < deadline:
            time.sleep(0.1)  # warmed up: the flood is on
        assert answered.value >= CLIENTS, failed.value
        with server.client() as probe:
            end = time.monotonic() + MEASURE_SECONDS
            while time.monotonic() < end:
                started = time.perf_counter()
                assert probe.get("/healthz").status_code == 200
                health.append(time.perf_counter() - started)
                started = time.perf_counter()
                reply = probe.post("/mutate/default", content=ordinary,
                                   headers={"content-type": "application/json"})
                admissions.append(time.perf_counter() - started)
                assert reply.status_code == 200 and "patch" in reply.json()["response"]
                time.sleep(0.02)
    finally:
        stop.set()
        for process in clients:
            process.join(120)
            if process.is_alive():
                process.kill()
    figures: dict[str, Any] = {}
    for name, samples in (("healthz", health), ("admission", admissions)):
        figures[name] = {"n": len(samples),
                         "p50_ms": round(statistics.median(samples) * 1000, 1),
                         "p99_ms": round(_percentile(samples, 0.99) * 1000, 1),
                         "max_ms": round(max(samples) * 1000, 1)}
    figures["huge_answered"] = answered.value
    print(f"\n{CLIENTS} clients x {len(huge_review())} B reviews ({CONTAINERS} containers), "
          f"{MEASURE_SECONDS:.0f} s: {figures}")
    assert failed.value == 0
    assert len(health) > 200
    assert figures["healthz"]["p99_ms"] < P99_LIMIT * 1000, figures
    assert figures["admission"]["p99_ms"] < P99_LIMIT * 1000, figures


def test_no_redirect_on_the_admission_path(server: Server) -> None:
    with server.client(follow_redirects=False) as http:
        reply = http.post("/mutate/default/", json=review_json(),
                          headers={"host": "attacker.example"})
        assert reply.status_code == 404
        assert "location" not in reply.headers
        for path in ("/mutate/", "/mutate", "/healthz/", "/mutate/default//x"):
            reply = http.post(path, json=review_json())
            assert reply.status_code in (404, 405) and "location" not in reply.headers, path

"""``swapwise serve --workers N``: one port, N processes, one set of metrics, one SIGTERM."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from testkit.server_proc import wait_until
from tests.reliability.support import Server, Stream, review_json


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    proc = Server(tmp_path, None, "--workers", "2", "--drain-seconds", "1").start()
    assert wait_until(lambda: len(proc.children()) == 2)
    yield proc
    proc.stop()


def fresh_post(server: Server) -> None:
    """One admission on a new connection: the kernel picks the worker that accepts it."""
    with httpx.Client(base_url=server.url, verify=server.ssl_context(), timeout=10) as client:
        assert client.post("/mutate/default", json=review_json()).status_code == 200


def test_metrics_are_the_sum_over_workers(server: Server) -> None:
    for _ in range(40):
        fresh_post(server)
    # Every scrape (each may land on either worker) reports all 40.
    for _ in range(6):
        assert server.metric("swapwise_admission_requests_total",
                             profile="default", outcome="mutated") == 40
    assert server.metric("swapwise_containers_changed_total", profile="default") == 40
    assert server.metric("swapwise_admission_duration_seconds_count") == 40
    assert server.metric("swapwise_certificate_expiry_timestamp_seconds") > 1.7e9
    assert server.metric("swapwise_policy_profiles") == 1
    # Both workers start serving (the fixture only waits for both to be forked: on a loaded
    # machine the second may still be starting after the first has answered all 40).
    def started() -> int:
        return sum("Started server process" in line for line in server.logs().splitlines())

    assert wait_until(lambda: started() == 2, 20), server.logs()[-2000:]


def test_sigterm_drains_every_worker_and_exits_cleanly(server: Server) -> None:
    assert server.process is not None
    workers = server.children()
    with Stream(server, threads=4) as stream:
        stream.wait_for(50)
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0
    assert stream.outcomes.failed == [], stream.outcomes.failed[:5]
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or \
            "zombie" in Path(f"/proc/{pid}/status").read_text()
    assert server.logs().count('"msg": "worker stopped"') == 2


def test_a_dead_worker_is_replaced_without_failing_requests(server: Server) -> None:
    victim = server.children()[0]
    with Stream(server, threads=2) as stream:
        stream.wait_for(20)
        os.kill(victim, signal.SIGKILL)
        assert wait_until(lambda: len(server.children()) == 2
                          and victim not in server.children(), 20)
        stream.wait_for(20)
    # Connections the killed worker held die with it; the rest never notice.
    assert stream.outcomes.ok > 40
    assert "worker exited unexpectedly" in server.logs()
    for _ in range(10):
        fresh_post(server)

"""File-system events on the watched mounts: a directory deleted and recreated, or
replaced by a file, and watchers that fail. Watching goes on, reloads are counted once
(also with ``--workers``), and a failed watcher is restarted and counted.

Before this suite: a deleted and recreated directory was never watched again (only the
30 s poll noticed changes), and one exception in a watcher ended it for good, silently.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from pathlib import Path

import yaml

from testkit.server_proc import wait_until
from tests.reliability.support import Server
from webhook.server import reload
from webhook.server.metrics import Metrics


def policy(profile: str) -> bytes:
    return yaml.safe_dump({"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                           "profiles": {profile: {}}}).encode()


def profiles(server: Server) -> list[str]:
    with server.client() as client:
        result: list[str] = client.get("/readyz").json()["profiles"]
        return result


def test_policy_directory_deleted_recreated_and_replaced_by_a_file(tmp_path: Path) -> None:
    server = Server(tmp_path, policy("first"), "--drain-seconds", "0").start()
    assert server.policy is not None
    root = server.policy.root
    try:
        shutil.rmtree(root)
        assert wait_until(lambda: server.metric("swapwise_policy_reloads_total",
                                                result="failure") == 1, 20)
        assert profiles(server) == ["first"]  # the last good policy
        root.mkdir()
        (root / "policy.yaml").write_bytes(policy("second"))
        assert wait_until(lambda: profiles(server) == ["second"], 20)
        # Changes in the recreated directory are seen by the watch (not the 30 s poll).
        started = time.monotonic()
        (root / "policy.yaml").write_bytes(policy("third"))
        assert wait_until(lambda: profiles(server) == ["third"], 20)
        assert time.monotonic() - started < 15
        shutil.rmtree(root)
        root.write_bytes(b"a file where the directory was")
        assert wait_until(lambda: server.metric("swapwise_policy_reloads_total",
                                                result="failure") == 2, 20)
        assert profiles(server) == ["third"]
        root.unlink()
        root.mkdir()
        (root / "policy.yaml").write_bytes(policy("fourth"))
        assert wait_until(lambda: profiles(server) == ["fourth"], 20)
        assert server.metric("swapwise_policy_reloads_total", result="success") == 3
        assert "Traceback" not in server.logs()
    finally:
        server.stop()


def test_with_workers_each_change_is_counted_once(tmp_path: Path) -> None:
    server = Server(tmp_path, policy("first"), "--workers", "2",
                    "--drain-seconds", "0").start()
    assert server.policy is not None
    try:
        assert wait_until(lambda: len(server.children()) == 2)
        server.policy.update({"policy.yaml": policy("second")})
        assert wait_until(lambda: all(profiles(server) == ["second"] for _ in range(6)), 20)
        # Worker 0 counts, and may not be the one that answered above: on a loaded machine it
        # can still be behind, and would then see only the broken file (one change, not two).
        assert wait_until(lambda: server.metric("swapwise_policy_reloads_total",
                                                result="success") == 1, 20)
        server.policy.update({"policy.yaml": b"profiles: [broken"})
        assert wait_until(lambda: server.metric("swapwise_policy_reloads_total",
                                                result="failure") >= 1, 20)
        time.sleep(2)  # both workers have long since seen both changes
        for _ in range(6):  # any worker may answer the scrape: the sum is the same
            assert server.metric("swapwise_policy_reloads_total", result="success") == 1
            assert server.metric("swapwise_policy_reloads_total", result="failure") == 1
    finally:
        server.stop()


def test_a_failing_watcher_is_restarted_and_counted() -> None:
    metrics = Metrics()
    runs: list[int] = []

    async def main() -> None:
        stop = asyncio.Event()

        async def flaky() -> None:
            runs.append(1)
            if len(runs) <= 2:
                raise OSError("inotify watch limit reached")
            if len(runs) == 3:
                return  # ending early is a failure too
            stop.set()

        await asyncio.wait_for(
            reload.supervise("files", flaky, stop, metrics, max_backoff=0.05), 10)

    asyncio.run(main())
    assert len(runs) == 4
    assert metrics.registry.get_sample_value("swapwise_watcher_restarts_total",
                                             {"watcher": "files"}) == 3


def test_watch_survives_a_callback_error_through_supervise(tmp_path: Path) -> None:
    """on_change raising (a bug) restarts the watcher; later changes are still seen."""
    directory = tmp_path / "mount"
    directory.mkdir()
    target = directory / "file"
    target.write_text("0")
    metrics = Metrics()
    seen: list[str] = []

    def on_change() -> None:
        content = target.read_text() if target.exists() else ""
        if content == "boom":
            raise RuntimeError("bug in a reload")
        seen.append(content)

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(reload.supervise(
            "files", lambda: reload.watch([target], on_change, stop, poll_seconds=30),
            stop, metrics, max_backoff=0.1))
        await asyncio.sleep(0.5)
        target.write_text("boom")
        for _ in range(100):
            await asyncio.sleep(0.05)
            if metrics.registry.get_sample_value("swapwise_watcher_restarts_total",
                                                 {"watcher": "files"}):
                break
        await asyncio.sleep(0.5)
        target.write_text("after")
        for _ in range(100):
            await asyncio.sleep(0.05)
            if "after" in seen:
                break
        stop.set()
        await asyncio.wait_for(task, 10)

    asyncio.run(main())
    assert "after" in seen
    assert metrics.registry.get_sample_value("swapwise_watcher_restarts_total",
                                             {"watcher": "files"}) >= 1


def test_a_worker_restarted_while_the_policy_is_bad_serves_the_last_good_one(
    tmp_path: Path
) -> None:
    """Before, the new worker refused to start on the bad file, exited, was restarted, and
    after 5 such exits in a minute the supervisor stopped the whole server."""
    server = Server(tmp_path, policy("good"), "--workers", "2",
                    "--drain-seconds", "0").start()
    assert server.policy is not None and server.process is not None
    try:
        assert wait_until(lambda: len(server.children()) == 2)
        server.policy.update({"policy.yaml": b"profiles: [broken"})
        assert wait_until(lambda: server.metric("swapwise_policy_reloads_total",
                                                result="failure") >= 1, 20)
        for _ in range(2):  # within the supervisor's crash-loop limit (5 a minute)
            victim = server.children()[0]
            os.kill(victim, signal.SIGKILL)
            assert wait_until(lambda v=victim: len(server.children()) == 2
                              and v not in server.children(), 20)
        time.sleep(3)  # a worker that could not start would have exited by now, repeatedly
        assert server.process.poll() is None and len(server.children()) == 2
        assert "worker failed" not in server.logs()
        for _ in range(6):
            assert profiles(server) == ["good"]
        server.policy.update({"policy.yaml": policy("fixed")})
        assert wait_until(lambda: all(profiles(server) == ["fixed"] for _ in range(6)), 20)
    finally:
        server.stop()

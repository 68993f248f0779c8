"""No reload without a change: other files written next to the watched ones cost nothing.

Before: the watcher woke the reload on any event in a watched directory, and each reload
re-read the files, parsed the certificate and built a new SSLContext before comparing
(~2.2 ms); a log file written next to the policy every 20 ms took 31-39 % of the
server's CPU. Now events are filtered on the watched names, the kubelet's ``..data``
swap and the directory itself, and a reload compares raw bytes before parsing anything.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import yaml

from testkit.server_proc import Mount, wait_until
from tests.reliability.support import Server
from webhook.server import reload

WRITES = 1000
TICK = os.sysconf("SC_CLK_TCK")


def policy(profile: str) -> bytes:
    return yaml.safe_dump({"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                           "profiles": {profile: {}}}).encode()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def scribble(directory: Path, writes: int = WRITES, pause: float = 0.0) -> None:
    """``writes`` appends to a file nobody watches, in the watched directory."""
    path = directory / "other.log"
    for index in range(writes):
        with path.open("a") as f:
            f.write(f"line {index}\n")
        if pause:
            time.sleep(pause)


class Watching:
    """reload.watch() on its own event loop in a thread, counting on_change calls."""

    def __init__(self, paths: list[Path]) -> None:
        self.calls = 0
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.thread = threading.Thread(target=self.loop.run_until_complete,
                                       args=(self._run(paths),), daemon=True)

    async def _run(self, paths: list[Path]) -> None:
        self.stop = asyncio.Event()
        await reload.watch(paths, self._changed, self.stop)

    def _changed(self) -> None:
        self.calls += 1

    def __enter__(self) -> Watching:
        self.thread.start()
        assert wait_until(lambda: self.calls == 1, 10), "the initial check"
        time.sleep(0.3)  # the watch is set up right after the initial check
        return self

    def __exit__(self, *_exc: object) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(10)


def test_writes_next_to_the_watched_files_never_wake_the_reload(tmp_path: Path) -> None:
    mount = Mount(tmp_path / "policy", {"policy.yaml": policy("first")})
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "client-ca.crt").write_bytes(b"ca")
    with Watching([mount.root / "policy.yaml", plain / "client-ca.crt"]) as watching:
        scribble(mount.root)
        scribble(plain)
        (mount.root / "..2026_01_01").mkdir()  # a kubelet-like name that is not ..data
        time.sleep(1.0)  # several debounce windows: a wake-up would have come by now
        assert watching.calls == 1
        # Real changes still wake it: the file itself, and the kubelet's ..data swap.
        (plain / "client-ca.crt").write_bytes(b"ca2")
        assert wait_until(lambda: watching.calls >= 2, 10)
        calls = watching.calls
        mount.update({"policy.yaml": policy("second")})
        assert wait_until(lambda: watching.calls > calls, 10)


def test_a_server_beside_a_busy_file_stays_idle_and_still_reloads(tmp_path: Path) -> None:
    server = Server(tmp_path, policy("first"), "--drain-seconds", "0").start()
    assert server.policy is not None and server.process is not None
    pid = server.process.pid
    try:
        time.sleep(1.0)  # past start-up
        used, started = cpu_seconds(pid), time.monotonic()
        # Spaced as a log file is written, wider than the watcher's 20 ms grouping of
        # events: before, every one of these woke a reload.
        writers = [threading.Thread(target=scribble, args=(root, 200, 0.025))
                   for root in (server.policy.root, server.tls.root)]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()
        time.sleep(0.5)  # what the last writes would wake
        used, elapsed = cpu_seconds(pid) - used, time.monotonic() - started
        print(f"server CPU {used:.2f} s in {elapsed:.2f} s of sibling writes")
        # Idle: each of these 400 writes used to cost a reload (the policy and the
        # certificate read, the certificate parsed, an SSLContext built: ~2.5 ms), a
        # fifth of a core at this rate. A server that wakes for nothing stays far below.
        assert used < 0.05 * elapsed, f"{used:.2f} s of CPU in {elapsed:.2f} s"
        for result in ("success", "failure"):
            assert server.metric("swapwise_policy_reloads_total", result=result) == 0
            assert server.metric("swapwise_certificate_reloads_total", result=result) == 0
        # A real change, through the kubelet's ..data swap, is served without waiting
        # for the 30 s re-check.
        server.policy.update({"policy.yaml": policy("second")})
        with server.client() as client:
            assert wait_until(lambda: client.get("/readyz").json()["profiles"] == ["second"],
                              10)
        assert server.metric("swapwise_policy_reloads_total", result="success") == 1
    finally:
        server.stop()


"""Any policy file content: refused with a message, counted, the last good policy kept,
and the next good file still picked up. ``policy check`` and ``serve --policy`` answer
every bad file with a message and exit 1, never a traceback.

Before this suite: a non-scalar YAML key (TypeError in the duplicate-key check) or deep
nesting (RecursionError) escaped ``PolicyStore.reload``, ended the watch task silently and
stopped every later reload, policy and certificate alike.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from testkit.server_proc import SWAPWISE, cert_files, free_port, wait_until
from tests.reliability.support import Server
from webhook.server.metrics import Metrics
from webhook.server.reload import PolicyStore


def policy(ratio: float, profile: str = "default") -> bytes:
    return yaml.safe_dump({"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                           "profiles": {profile: {"requestRatio": ratio}}}).encode()


HEAD = b"apiVersion: swapwise.io/v1alpha1\nkind: SwapPolicy\n"
GOOD = policy(0.5)
BAD_FILES: dict[str, bytes] = {
    # odd YAML shapes
    "non-scalar key": HEAD + b"profiles:\n  ? [a, b]\n  : 1\n",
    "mapping key": HEAD + b"profiles:\n  ? {a: 1}\n  : {}\n",
    "top-level non-scalar key": b"? [a]\n: 1\n",
    "duplicate key": HEAD + b"profiles: {a: {}}\nprofiles: {b: {}}\n",
    "bad date": HEAD + b"profiles: {default: {minRequest: 2024-02-30}}\n",
    "set": b"!!set {a, b}\n",
    "python tag": b"!!python/object:os.system {}\n",
    "alias bomb": (b"a: &a [x, x, x, x, x, x, x, x, x, x]\n"
                   + b"".join(f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
                              .encode() for p, c in zip("abcdefgh", "bcdefghi", strict=True))),
    "list": b"- 1\n- 2\n",
    "scalar": b"42\n",
    "empty": b"",
    "null": b"~\n",
    "two documents": GOOD + b"---\n" + GOOD,
    "namespace override not a mapping": HEAD + b"profiles: {default: {}}\nnamespaces: {a: 5}\n",
    "key of another type": HEAD + b"profiles: {1: {}}\n",
    # deep nesting
    "deep flow lists": HEAD + b"profiles: " + b"[" * 5000 + b"]" * 5000 + b"\n",
    "deep flow mappings": b"a: " + b"{b: " * 3000 + b"1" + b"}" * 3000 + b"\n",
    "deep block": b"".join(b"  " * i + b"k:\n" for i in range(2000)),
    "deep in an override": (HEAD + b"profiles: {default: {}}\nnamespaces: {a: {placement: "
                            + b"{x: " * 200 + b"1" + b"}" * 200 + b"}}\n"),
    # garbage and partial files
    "binary": bytes(range(256)) * 4,
    "not utf-8": b"\xff\xfe" + GOOD,
    "partial": GOOD[: len(GOOD) // 2],
    "cut inside a string": HEAD + b'profiles: {default: {minRequest: "16M',
    "tabs": HEAD + b"profiles:\n\tdefault: {}\n",
    "nul bytes": GOOD.replace(b"\n", b"\x00\n"),
    "huge": b"# " + b"x" * (2 * 1024 * 1024) + b"\n" + GOOD,
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_policy_check_answers_every_bad_file_with_a_message(tmp_path: Path, name: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes(BAD_FILES[name])
    result = subprocess.run([SWAPWISE, "policy", "check", str(path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "invalid policy" in result.stderr, result.stderr[-2000:]
    assert len(result.stderr) < 5000  # a message, not a dump


@pytest.mark.parametrize("name", ["non-scalar key", "deep flow lists", "binary", "alias bomb"])
def test_serve_refuses_a_bad_policy_with_a_message(tmp_path: Path, name: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes(BAD_FILES[name])
    result = subprocess.run([SWAPWISE, "serve", "--policy", str(path), "--port", str(free_port())],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "invalid policy" in result.stderr


@pytest.mark.parametrize("kind", ["directory", "fifo", "missing", "dangling symlink"])
def test_policy_check_and_serve_on_something_that_is_not_a_file(tmp_path: Path,
                                                                 kind: str) -> None:
    path = tmp_path / "policy.yaml"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dangling symlink":
        path.symlink_to(tmp_path / "nowhere")
    for args in (["policy", "check", str(path)],
                 ["serve", "--policy", str(path), "--port", str(free_port())]):
        result = subprocess.run([SWAPWISE, *args], capture_output=True, text=True,
                                timeout=30, cwd=tmp_path)
        assert result.returncode == 1
        assert "Traceback" not in result.stderr and "policy" in result.stderr


def _store(tmp_path: Path) -> tuple[PolicyStore, Metrics, Path]:
    path = tmp_path / "policy.yaml"
    path.write_bytes(GOOD)
    metrics = Metrics()
    return PolicyStore(path, metrics), metrics, path


def _count(metrics: Metrics, result: str) -> float:
    value = metrics.registry.get_sample_value("swapwise_policy_reloads_total",
                                              {"result": result})
    return value or 0.0


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_reload_refuses_counts_and_keeps_going(tmp_path: Path, name: str) -> None:
    store, metrics, path = _store(tmp_path)
    good = store.policy
    path.write_bytes(BAD_FILES[name])
    assert store.reload() is False
    assert store.policy is good
    assert _count(metrics, "failure") == 1
    path.write_bytes(policy(0.25, "next"))
    assert store.reload() is True
    assert sorted(store.policy.profiles) == ["next"]
    assert _count(metrics, "success") == 1


FS_EVENTS: dict[str, Callable[[Path], None]] = {
    "deleted": lambda p: p.unlink(),
    "replaced by a directory": lambda p: (p.unlink(), p.mkdir()),
    "replaced by a fifo": lambda p: (p.unlink(), os.mkfifo(p)),
    "dangling symlink": lambda p: (p.unlink(), p.symlink_to(p.parent / "gone")),
    "truncated": lambda p: p.write_bytes(b""),
}


@pytest.mark.parametrize("event", sorted(FS_EVENTS))
def test_reload_survives_file_system_events(tmp_path: Path, event: str) -> None:
    store, metrics, path = _store(tmp_path)
    FS_EVENTS[event](path)
    assert store.reload() is False
    assert _count(metrics, "failure") == 1
    if path.is_dir():
        path.rmdir()
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.write_bytes(policy(0.25, "back"))
    assert store.reload() is True
    assert sorted(store.policy.profiles) == ["back"]


def test_permission_denied_is_refused_and_recovered(tmp_path: Path) -> None:
    """As an unprivileged user (root reads any file): chmod 000, then readable again."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to nobody")
    for directory in [tmp_path, *tmp_path.parents]:
        if directory == directory.parent or directory.stat().st_mode & 0o005 == 0o005:
            break
        directory.chmod(directory.stat().st_mode | 0o755)
    workdir = tmp_path / "nobody"
    workdir.mkdir(mode=0o777)
    workdir.chmod(0o777)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            store, metrics, path = _store(workdir)
            path.chmod(0)
            assert store.reload() is False
            assert _count(metrics, "failure") == 1
            path.chmod(0o644)
            path.write_bytes(policy(0.25, "readable"))
            assert store.reload() is True
            assert sorted(store.policy.profiles) == ["readable"]
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_server_keeps_reloading_policy_and_certificate_after_odd_files(tmp_path: Path) -> None:
    """The issue's scenario on a real server: after odd files, a valid policy and a new
    certificate are still picked up, and each refusal is counted."""
    server = Server(tmp_path, GOOD, "--drain-seconds", "0").start()
    assert server.policy is not None
    try:
        for name in ("non-scalar key", "deep flow lists", "alias bomb"):
            failures = server.metric("swapwise_policy_reloads_total", result="failure")
            server.policy.update({"policy.yaml": BAD_FILES[name]})
            assert wait_until(lambda f=failures: server.metric(
                "swapwise_policy_reloads_total", result="failure") == f + 1, 20), name
        server.policy.update({"policy.yaml": policy(0.25, "after")})
        with server.client() as client:
            assert wait_until(lambda: client.get("/readyz").json()["profiles"] == ["after"],
                              20)
        server.tls.update(cert_files())  # a new CA too: trusted once the server serves it

        def rotated() -> bool:
            try:
                return server.metric("swapwise_certificate_reloads_total",
                                     result="success") == 1
            except httpx.HTTPError:
                return False

        assert wait_until(rotated, 20)
        assert "Traceback" not in server.logs()
    finally:
        server.stop()

"""A real ``swapwise serve`` process on loopback, with ConfigMap/Secret-style mounts.

Kubelet updates mounted ConfigMaps and Secrets by writing a new timestamped directory
and atomically renaming a ``..data`` symlink onto it; :class:`Mount` does the same, so
reload tests exercise the exact filesystem events a pod sees.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from webhook import certs

SWAPWISE = str(Path(sys.executable).with_name("swapwise"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Mount:
    """A directory updated the way the kubelet updates ConfigMap and Secret volumes."""

    def __init__(self, root: Path, files: dict[str, bytes]) -> None:
        self.root = root
        self.generation = 0
        root.mkdir(parents=True, exist_ok=True)
        self.update(files)
        for name in files:
            os.symlink(f"..data/{name}", root / name)

    def update(self, files: dict[str, bytes]) -> None:
        self.generation += 1
        target = self.root / f"..gen_{self.generation}"
        target.mkdir()
        for name, content in files.items():
            (target / name).write_bytes(content)
        tmp = self.root / "..data_tmp"
        os.symlink(target.name, tmp)
        old = (self.root / "..data").resolve() if (self.root / "..data").exists() else None
        os.replace(tmp, self.root / "..data")
        if old is not None:
            for child in old.iterdir():
                child.unlink()
            old.rmdir()


def cert_files(ip: str = "127.0.0.1") -> dict[str, bytes]:
    ca, cert, key = certs.generate(["localhost", *certs.service_names("swapwise", "default")],
                                   [ip])
    return {"ca.crt": ca, "tls.crt": cert, "tls.key": key}


class ServerProcess:
    def __init__(self, workdir: Path, policy: bytes | None = None, *extra: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.tls = Mount(workdir / "tls", cert_files())
        self.policy = Mount(workdir / "policy", {"policy.yaml": policy}) if policy else None
        self.log_path = workdir / "server.log"
        args = [SWAPWISE, "serve", "--cert-dir", str(self.tls.root), "--host", "127.0.0.1",
                "--port", str(self.port), *extra]
        if self.policy is not None:
            args += ["--policy", str(self.policy.root / "policy.yaml")]
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None
        # Output through a pipe, copied to the log file by a thread of this process, as a
        # container runtime reads a container's stdout and stderr (benchmarks).
        self.pipe_logs = False

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def ca_file(self) -> Path:
        return self.tls.root / "ca.crt"

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file()))

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, verify=self.ssl_context(), timeout=10, **kwargs)

    def start(self, timeout: float = 20) -> ServerProcess:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.args, stdout=subprocess.PIPE if self.pipe_logs else log,
            stderr=subprocess.STDOUT, cwd=self.workdir)
        if self.pipe_logs:
            threading.Thread(target=_copy, args=(self.process.stdout, log), daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"swapwise exited {self.process.returncode}:\n{self.logs()}")
            try:
                with self.client() as client:
                    if client.get("/readyz").status_code == 200:
                        return self
            except (httpx.HTTPError, ssl.SSLError, OSError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"swapwise not ready after {timeout}s:\n{self.logs()}")

    def stop(self, timeout: float = 30) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.terminate()
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def metric(self, name: str, **labels: str) -> float:
        """Current value of one sample from /metrics (0 when absent)."""
        with self.client() as client:
            text = client.get("/metrics").text
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            key, _, value = line.rpartition(" ")
            if "{" in key:
                metric, _, rest = key.partition("{")
                found = ",".join(sorted(rest.rstrip("}").split(",")))
            else:
                metric, found = key, ""
            if metric == name and found == wanted:
                return float(value)
        return 0.0


def _copy(source: Any, log: Any) -> None:
    while chunk := source.read1(1 << 16):
        log.write(chunk)
        log.flush()


def wait_until(predicate: Any, timeout: float = 10, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())

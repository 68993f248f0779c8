"""swapwise as users run it: the image of ``make image``, installed by the chart in its
normal Service mode, on the real node. Helpers of test_in_cluster.py.

- ``ImageFacts``: what the OCI archive says about the image (user, layers, size).
- ``Release``: a helm release of charts/swapwise with the image, and its rollout.
- ``PodLoad``: a client that keeps creating pods through the API server at a fixed rate and
  counts every failed admission, for "zero failures while ..." scenarios.
"""

from __future__ import annotations

import gzip
import http.client
import json
import subprocess
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.cluster import ClusterError, ControlPlane

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "swapwise"
IMAGE_ARCHIVE = REPO / "build" / "swapwise-image.tar"


@dataclass(frozen=True)
class ImageFacts:
    """The image's name, configured user and sizes, read from its OCI archive."""

    name: str
    user: str
    entrypoint: list[str]
    layers_bytes: int  # unpacked layers: what a node stores
    compressed_bytes: int  # the layers as pushed: what a registry stores and a node pulls

    @classmethod
    def read(cls, archive: Path) -> ImageFacts:
        with tarfile.open(archive) as tar:

            def blob(digest: str) -> Any:
                algo, hexdigest = digest.split(":", 1)
                member = tar.extractfile(f"blobs/{algo}/{hexdigest}")
                assert member is not None
                return json.load(member)

            index_file = tar.extractfile("index.json")
            assert index_file is not None
            (entry,) = json.load(index_file)["manifests"]
            manifest = blob(entry["digest"])
            config = blob(manifest["config"]["digest"])["config"]
            name = entry.get("annotations", {}).get("org.opencontainers.image.ref.name", "")
            unpacked = 0
            for layer in manifest["layers"]:
                algo, hexdigest = layer["digest"].split(":", 1)
                member = tar.extractfile(f"blobs/{algo}/{hexdigest}")
                assert member is not None
                compressed = layer["mediaType"].endswith("+gzip")
                with gzip.GzipFile(fileobj=member) if compressed else member as stream:
                    while chunk := stream.read(1 << 20):
                        unpacked += len(chunk)
        return cls(
            name=name,
            user=config.get("User", ""),
            entrypoint=config.get("Entrypoint") or [],
            layers_bytes=unpacked,
            compressed_bytes=sum(layer["size"] for layer in manifest["layers"]),
        )


class Release:
    """``helm upgrade --install`` of the chart in Service mode, with the image on the node."""

    def __init__(self, cp: ControlPlane, workdir: Path, name: str, namespace: str,
                 values: dict[str, Any]) -> None:
        self.cp = cp
        self.workdir = workdir
        self.name = name
        self.namespace = namespace
        self.fullname = f"{name}-swapwise"
        self.values = values

    def helm(self, *args: str, timeout: float = 300) -> str:
        argv = [str(self.cp.bin / "helm"), "--kubeconfig", str(self.cp.kubeconfig), *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise ClusterError(f"helm {' '.join(args)} failed:\n{proc.stderr}{proc.stdout}")
        return proc.stdout

    def upgrade(self, values: dict[str, Any] | None = None) -> None:
        """Install or upgrade with ``values`` merged over the current ones (one level)."""
        for key, value in (values or {}).items():
            if isinstance(value, dict) and isinstance(self.values.get(key), dict):
                self.values[key] = {**self.values[key], **value}
            else:
                self.values[key] = value
        values_file = self.workdir / "values.yaml"
        values_file.write_text(yaml.safe_dump(self.values))
        self.helm("upgrade", "--install", self.name, str(CHART), "--namespace", self.namespace,
                  "--create-namespace", "--values", str(values_file))

    def uninstall(self) -> None:
        self.helm("uninstall", self.name, "--namespace", self.namespace, "--wait",
                  "--timeout", "5m", timeout=400)

    def rollout_status(self, deployment: str, timeout: float = 900) -> None:
        """Wait as a user would: ``kubectl rollout status`` (old replicas gone, new ready)."""
        self.cp.kubectl("rollout", "status", f"deployment/{deployment}", "-n", self.namespace,
                        f"--timeout={int(timeout)}s", timeout=timeout + 30)

    def pods(self, component: str = "webhook") -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/instance={self.name},app.kubernetes.io/component={component}"
        items: list[dict[str, Any]] = self.cp.get_json(
            "pods", "-n", self.namespace, "-l", selector)["items"]
        return items

    def endpoints(self) -> list[tuple[str, int]]:
        """(address, port) of the webhook Service's ready endpoints (its EndpointSlices)."""
        slices = self.cp.get_json("endpointslices", "-n", self.namespace, "-l",
                                  f"kubernetes.io/service-name={self.fullname}")["items"]
        found = []
        for s in slices:
            ports = [p["port"] for p in s.get("ports") or []]
            for endpoint in s.get("endpoints") or []:
                if endpoint.get("conditions", {}).get("ready"):
                    found += [(address, port) for address in endpoint["addresses"]
                              for port in ports]
        return sorted(found)


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod["status"].get("conditions") or [])


def failure_message(text: str) -> str:
    """The API server's message from a Status body, whole: the end of a failed webhook
    call's message names the endpoint and the socket error (a 300-character cut of the
    raw body once lost both, failing a test on a failure it allows)."""
    try:
        message = json.loads(text)["message"]
    except (ValueError, KeyError, TypeError):
        return text[:2000]
    return str(message)[:2000]


@dataclass
class PodLoad:
    """Creates pods in ``namespace`` at ``rate`` per second until stopped, through the API
    server (HTTPS, as the admin), with ``workers`` clients in parallel so one slow admission
    does not lower the rate. Pods carry a scheduling gate: they are stored (admission ran)
    but never scheduled, so the node is not loaded by them."""

    cp: ControlPlane
    namespace: str
    rate: float = 6.0
    workers: int = 2
    memory: str = "256Mi"
    creates: int = 0
    failures: list[str] = field(default_factory=list)
    failed_at: list[float] = field(default_factory=list)  # time.monotonic() of each failure
    not_reshaped: int = 0
    requests: list[str] = field(default_factory=list)  # memory request of each created pod
    started: float = 0.0
    elapsed: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def body(self) -> bytes:
        resources = {"cpu": "10m", "memory": self.memory}
        return json.dumps({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "load-"},
            "spec": {
                "schedulingGates": [{"name": "swapwise.io/test-hold"}],
                "automountServiceAccountToken": False,
                "containers": [{"name": "app", "image": "localhost/swapwise/pause:v1",
                                "resources": {"requests": resources, "limits": resources}}],
            },
        }).encode()

    def __enter__(self) -> PodLoad:
        self.started = time.monotonic()
        for i in range(self.workers):
            thread = threading.Thread(target=self._run, args=(i,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)
        self.elapsed = time.monotonic() - self.started

    @property
    def achieved_rate(self) -> float:
        elapsed = self.elapsed or (time.monotonic() - self.started)
        return self.creates / elapsed if elapsed else 0.0

    def _run(self, worker: int) -> None:
        host, port = self.cp.server.removeprefix("https://").rsplit(":", 1)
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        body = self.body()
        interval = self.workers / self.rate
        next_at = time.monotonic() + worker * interval / self.workers
        conn: http.client.HTTPSConnection | None = None
        while not self._stop.is_set():
            delay = next_at - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                break
            next_at = max(next_at + interval, time.monotonic() - interval)
            if conn is None:
                conn = http.client.HTTPSConnection(host, int(port), timeout=60,
                                                   context=self.cp.admin_context())
            try:
                conn.request("POST", path, body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                text = response.read().decode(errors="replace")
                status = response.status
            except (OSError, http.client.HTTPException) as e:  # the API server itself
                conn.close()
                conn = None
                status, text = 0, f"client error: {e!r}"
            with self._lock:
                self.creates += 1
                if status != 201:
                    self.failures.append(f"{status}: {failure_message(text)}")
                    self.failed_at.append(time.monotonic())
                    continue
                container = json.loads(text)["spec"]["containers"][0]["resources"]
                self.requests.append(container["requests"]["memory"])
                if container["requests"]["memory"] == container["limits"]["memory"]:
                    self.not_reshaped += 1
        if conn is not None:
            conn.close()

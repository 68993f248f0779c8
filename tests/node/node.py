"""A real Kubernetes node with swap: kubelet + containerd on cgroup v2 in a QEMU guest.

Why a guest: the kubelet grants swap only on cgroup v2, and this machine's own memory
cgroups belong to its supervisor (never touched here). Why software emulation: /dev/kvm on
these machines cannot boot a stock kernel. So everything is slow and variable: every wait
polls with a generous deadline; nothing sleeps a fixed time.

The guest is built by ``build-node.sh`` (cached). Per run, it gets a copy-on-write overlay of
the cached root disk, a fresh swap disk, and a 9p share through which the host hands it the
kubelet's configuration and credentials and reads back its logs and ``status.json`` (the
guest's meminfo, vmstat and every container cgroup's memory and swap files).

Network: a tap device in the caller's own network namespace (see conftest.py), so nothing
leaves it. The namespace is 10.0.2.2, the guest 10.0.2.15, and the guest's pod network
10.244.0.0/24 (containerd's CNI bridge) is routed through the guest: the API server reaches
the kubelet and every pod directly, as on a real cluster's node network, and the guest
reaches the API server at 10.0.2.2. No kube-proxy runs: pods reach the API server through
the one DNAT rule kube-proxy would write for the ``kubernetes`` Service (node-init.sh).
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import itertools
import json
import math
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.cluster import SERVICE_CIDR, ClusterError, Component, ControlPlane, wait_for

NODE_DIR = Path(__file__).resolve().parent
BUILD_SCRIPT = NODE_DIR / "build-node.sh"
GVISOR_BUILD_SCRIPT = NODE_DIR / "build-gvisor.sh"
GVISOR_BINARIES = ("runsc", "containerd-shim-runsc-v1")
TAP = "swtap0"
HOST_IP = "10.0.2.2"  # the network namespace's end of the tap: the API server, for the guest
GUEST_IP = "10.0.2.15"  # the node's InternalIP
POD_CIDR = "10.244.0.0/24"  # the guest's CNI bridge (guest/cni.conflist)
KUBELET_PORT = 10250
MIB = 1024 * 1024


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True)


def network_to_guest() -> None:
    """In the caller's own network namespace: loopback up, the guest's tap, and a route to
    its pods. Idempotent (the tap outlives a guest; QEMU attaches to it)."""
    _ip("link", "set", "lo", "up")
    links = subprocess.run(["ip", "-o", "link", "show"], check=True, capture_output=True,
                           text=True).stdout
    if f" {TAP}:" not in links:
        _ip("tuntap", "add", "dev", TAP, "mode", "tap")
        _ip("addr", "add", f"{HOST_IP}/24", "dev", TAP)
        _ip("link", "set", TAP, "up")
        _ip("route", "add", POD_CIDR, "via", GUEST_IP, "dev", TAP)


def cache_dir() -> Path:
    return Path(os.environ.get("SWAPWISE_NODE_CACHE") or Path.home() / ".cache/swapwise/node")


def _build(script: Path, manifest: str) -> dict[str, Any]:
    """Run a build script (stamp-checked: a cached build does nothing) and read the manifest
    it writes into the node cache."""
    subprocess.run(["bash", str(script)], check=True)
    data: dict[str, Any] = json.loads((cache_dir() / manifest).read_text())
    return data


@dataclass(frozen=True)
class Artifacts:
    """What build-node.sh produced (its artifacts.json)."""

    kernel: Path
    initramfs: Path
    root_disk: Path
    kubelet_version: str

    @classmethod
    def build(cls) -> Artifacts:
        """Run build-node.sh (nothing is rebuilt when cached) and read what it made."""
        data = _build(BUILD_SCRIPT, "artifacts.json")
        return cls(Path(data["kernel"]), Path(data["initramfs"]), Path(data["root_disk"]),
                   data["kubelet_version"])


@dataclass(frozen=True)
class GVisor:
    """What build-gvisor.sh produced (its gvisor.json): runsc and its containerd shim."""

    directory: Path
    version: str

    @classmethod
    def build(cls) -> GVisor:
        """Run build-gvisor.sh (nothing is rebuilt when cached) and read what it made."""
        data = _build(GVISOR_BUILD_SCRIPT, "gvisor.json")
        return cls(Path(data["dir"]), data["version"])


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)  # no copy of a large file if it can
    except OSError:
        shutil.copy(source, target)


def kubelet_config(swap_behavior: str, eviction_memory: str = "100Mi") -> dict[str, Any]:
    """The KubeletConfiguration of a swap node (docs/nodes.md explains each field)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "failSwapOn": False,
        "memorySwap": {"swapBehavior": swap_behavior},
        # Requests are authenticated by client certificate and authorised by the API server,
        # as on a kubeadm node: the labeller's configz read goes through RBAC, not around it.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": "/etc/kubernetes/pki/ca.crt"},
        },
        "authorization": {"mode": "Webhook"},
        "resolvConf": "",
        # What the node's agents are protected with (node-init.sh: the kubelet's memory.min)
        # is not the pods' to have: without it the scheduler packed 7 Guaranteed sandboxes
        # whose memory cannot swap next to agents that held 550-800 MiB, and a CI run's
        # last ones never finished allocating (docs/nodes.md, "Keep the kubelet out of
        # reclaim").
        "kubeReserved": {"memory": "192Mi"},
        "evictionHard": {
            "memory.available": eviction_memory,
            "nodefs.available": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        # The CRI calls' deadline (2m by default). Under emulation on a loaded machine a
        # gVisor sandbox takes minutes to boot; past the deadline the kubelet cancels and
        # retries, so it would never start. A longer one changes nothing for runc's.
        "runtimeRequestTimeout": "15m",
        "nodeStatusUpdateFrequency": "10s",
    }


class RealNode:
    """One QEMU guest running a kubelet that joins ``cp`` as node ``name``."""

    def __init__(
        self,
        cp: ControlPlane,
        artifacts: Artifacts,
        name: str = "swap-node-1",
        memory_mib: int = 2048,
        swap_mib: int = 4096,
        cpus: int = 2,
        swap_behavior: str = "LimitedSwap",
        images: tuple[Path, ...] = (),
        gvisor: GVisor | None = None,
    ) -> None:
        """``images``: OCI archives the guest's containerd imports at boot, besides the test
        images on its disk (for example the swapwise image of ``make image``). ``gvisor``:
        runsc and its shim, installed at boot for containerd's ``runsc`` handler."""
        self.cp = cp
        self.artifacts = artifacts
        self.name = name
        self.memory_mib = memory_mib
        self.swap_mib = swap_mib
        self.cpus = cpus
        self.swap_behavior = swap_behavior
        self.images = images
        self.gvisor = gvisor
        self.workdir = cp.workdir / f"node-{name}"
        self.share = self.workdir / "share"
        self.qemu: Component | None = None

    # -- lifecycle

    def __enter__(self) -> RealNode:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, boot_timeout: float = 600.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_share()
        self._write_disks()
        self.qemu = Component("qemu", self._qemu_argv(), self.workdir / "qemu.log")
        self.qemu.start()
        self.wait_for(lambda: "kubelet started" in self.node_log(), boot_timeout,
                      what="the guest to boot and start the kubelet")
        self.wait_for(self.ready, boot_timeout, what=f"node {self.name} to register")

    def stop(self, timeout: float = 60.0) -> None:
        """Ask the guest to power off (it syncs and stops); kill QEMU if it does not."""
        if self.qemu is None:
            return
        if self.qemu.alive():
            (self.share / "poweroff").touch()
            with contextlib.suppress(subprocess.TimeoutExpired):
                assert self.qemu.proc is not None
                self.qemu.proc.wait(timeout=timeout)
        self.qemu.stop(grace=5)
        self.qemu = None
        # The disks are large and per run; the share (logs, status) stays with the work dir.
        for disk in ("root.qcow2", "swap.img"):
            (self.workdir / disk).unlink(missing_ok=True)

    def _write_share(self) -> None:
        share = self.share
        shutil.rmtree(share, ignore_errors=True)
        (share / "pki").mkdir(parents=True)
        (share / "hostname").write_text(self.name)
        shutil.copy(self.cp.pki / "ca.crt", share / "pki" / "ca.crt")
        crt, key = self.cp.issue_client_cert(
            f"kubelet-{self.name}", f"system:node:{self.name}", "system:nodes"
        )
        shutil.copy(crt, share / "pki" / "kubelet.crt")
        shutil.copy(key, share / "pki" / "kubelet.key")
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {
                "server": f"https://{HOST_IP}:{self.cp.api_port}",
                "certificate-authority": "/etc/kubernetes/pki/ca.crt",
                "tls-server-name": "localhost",  # a SAN of the API server's certificate
            }}],
            "users": [{"name": "kubelet", "user": {
                "client-certificate": "/etc/kubernetes/pki/kubelet.crt",
                "client-key": "/etc/kubernetes/pki/kubelet.key",
            }}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "kubelet"}}],
            "current-context": "local",
        }
        (share / "kubelet.kubeconfig").write_text(json.dumps(kubeconfig))
        # What node-init.sh needs for the `kubernetes` Service's DNAT rule.
        service_ip = ipaddress.ip_network(SERVICE_CIDR)[1]
        (share / "kubernetes-service").write_text(
            f"{service_ip} 443 {HOST_IP} {self.cp.api_port}\n"
        )
        images = share / "images"
        images.mkdir()
        for image in self.images:
            _link_or_copy(image, images / image.name)
        if self.gvisor is not None:
            (share / "gvisor").mkdir()
            for binary in GVISOR_BINARIES:
                _link_or_copy(self.gvisor.directory / binary, share / "gvisor" / binary)
        (share / "kubelet.flags").write_text(
            f"--hostname-override={self.name} --node-ip={GUEST_IP} --v=2\n"
        )
        self._write_kubelet_config()

    def _write_kubelet_config(self) -> None:
        config = kubelet_config(self.swap_behavior)
        (self.share / "kubelet.yaml").write_text(json.dumps(config, indent=1))  # JSON is YAML

    def _write_disks(self) -> None:
        root = self.workdir / "root.qcow2"
        root.unlink(missing_ok=True)
        subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw",
             "-b", str(self.artifacts.root_disk), str(root)],
            check=True,
        )
        swap = self.workdir / "swap.img"
        with swap.open("wb") as f:
            f.truncate(self.swap_mib * MIB)  # sparse: only what the guest swaps out takes disk
        subprocess.run(["mkswap", "-q", str(swap)], check=True)

    def _qemu_argv(self) -> list[str]:
        accel = ["-accel", "tcg,thread=multi", "-cpu", "max"]
        netdev = f"tap,id=n0,ifname={TAP},script=no,downscript=no"
        return [
            "qemu-system-x86_64", *accel, "-m", str(self.memory_mib), "-smp", str(self.cpus),
            "-no-reboot", "-display", "none", "-monitor", "none",
            "-serial", f"file:{self.workdir / 'console.log'}",
            "-kernel", str(self.artifacts.kernel), "-initrd", str(self.artifacts.initramfs),
            "-append", "console=ttyS0 panic=-1 quiet cgroup_no_v1=all",
            "-drive", f"file={self.workdir / 'root.qcow2'},if=virtio,format=qcow2",
            "-drive", f"file={self.workdir / 'swap.img'},if=virtio,format=raw",
            "-virtfs", f"local,path={self.share},mount_tag=share,security_model=none,id=share",
            "-netdev", netdev, "-device", "virtio-net-pci,netdev=n0",
        ]

    # -- observing

    def node_log(self) -> str:
        try:
            return (self.share / "node.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def logs(self, lines: int = 30) -> str:
        """Tails of what the guest wrote, for failure messages."""
        out = []
        for name in ("node.log", "kubelet.log", "containerd.log"):
            path = self.share / name
            text = path.read_text(errors="replace").splitlines() if path.exists() else []
            out.append(f"----- guest {name} (last {lines}) -----\n" + "\n".join(text[-lines:]))
        console = self.workdir / "console.log"
        if console.exists():
            text = console.read_text(errors="replace").splitlines()
            out.append(f"----- guest console (last {lines}) -----\n" + "\n".join(text[-lines:]))
        if self.qemu is not None:
            out.append(self.qemu.tail(lines))
        return "\n".join(out)

    def check_alive(self) -> None:
        if self.qemu is None or not self.qemu.alive():
            raise ClusterError(f"the QEMU guest of {self.name} is not running\n{self.logs()}")

    def wait_for(self, predicate: Any, timeout: float, what: str, interval: float = 2.0,
                 detail: Any = None) -> Any:
        """Poll ``predicate``; fail at once if QEMU died; logs of guest and cluster on timeout,
        after what ``detail()`` says of the state waited on, if given."""

        def check() -> Any:
            self.check_alive()
            return predicate()

        def report() -> str:
            said = ""
            if detail is not None:
                try:
                    said = f"{detail()}\n"
                except Exception as exc:  # the report must not hide the timeout
                    said = f"(no detail: {exc})\n"
            return f"{said}{self.logs()}\n{self.cp.logs(15)}"

        return wait_for(check, timeout, interval, what, on_timeout=report)

    def node(self) -> dict[str, Any]:
        node: dict[str, Any] = self.cp.get_json("node", self.name)
        return node

    def ready(self) -> bool:
        """Registered, with swap reported: the kubelet has done its first status update."""
        proc = self.cp.kubectl("get", "node", self.name, "-o", "json", check=False)
        if proc.returncode != 0:
            return False
        status = json.loads(proc.stdout).get("status", {})
        return bool(status.get("capacity", {}).get("memory")) and bool(status.get("nodeInfo"))

    def status(self) -> dict[str, Any]:
        """The guest's latest status.json (written every 2 s)."""
        data: dict[str, Any] = json.loads((self.share / "status.json").read_text())
        return data

    def fresh_status(self, timeout: float = 120.0) -> dict[str, Any]:
        """A status.json written after this call (so it reflects what just happened)."""
        since = self.status()["uptime_s"]

        def fresh() -> dict[str, Any] | None:
            status = self.status()
            return status if status["uptime_s"] > since else None

        result: dict[str, Any] = self.wait_for(fresh, timeout, what="a fresh status.json")
        return result

    @staticmethod
    def container_cgroup(
        status: dict[str, Any], pod_uid: str, container_id: str
    ) -> dict[str, Any] | None:
        """One container's memory files in ``status``, by pod UID and CRI container ID
        (cgroupfs layout: kubepods[/burstable|/besteffort]/pod<uid>/<container id>).

        Take ``status`` with :meth:`fresh_status` after the container is running: an older
        one may have caught its cgroup just created, before runc wrote the limits."""
        for path, files in status["cgroups"].items():
            if f"/pod{pod_uid}/" in f"/{path}" and path.endswith(f"/{container_id}"):
                found: dict[str, Any] = files
                return found
        return None

    def restart_kubelet(self, swap_behavior: str, timeout: float = 300.0) -> None:
        """Restart the guest's kubelet with another swapBehavior (same node, same swap)."""
        generation = self.status()["kubelet_generation"]
        self.swap_behavior = swap_behavior
        self._write_kubelet_config()
        (self.share / "restart-kubelet").touch()
        self.wait_for(lambda: self.status()["kubelet_generation"] > generation, timeout,
                      what=f"the kubelet to restart with swapBehavior {swap_behavior}")

    def move_swap_to_file(self, mib: int, timeout: float = 600.0) -> int:
        """Give the guest a ``mib`` swap file and turn the swap disk off (what an admin does
        who shrinks a node's swap); return the new SwapTotal in bytes. The kubelet reports
        the new capacity only once restarted (:meth:`restart_kubelet`)."""
        (self.share / "swap-file").write_text(f"{mib}\n")

        def moved() -> int | None:
            meminfo = self.fresh_status()["meminfo"]
            total = int(meminfo["SwapTotal"]) * 1024
            return total if not (self.share / "swap-file").exists() and total < (
                mib + 1) * MIB else None

        result: int = self.wait_for(moved, timeout, what=f"swap moved to a {mib} MiB file")
        return result

    def move_swap_to_zram(self, mib: int, timeout: float = 600.0) -> int:
        """Give the guest a ``mib`` zram device as its only swap (the swap disk off); return
        the new SwapTotal in bytes."""
        (self.share / "swap-zram").write_text(f"{mib}\n")

        def moved() -> int | None:
            total = int(self.fresh_status()["meminfo"]["SwapTotal"]) * 1024
            return total if not (self.share / "swap-zram").exists() and total <= (
                mib + 1) * MIB else None

        result: int = self.wait_for(moved, timeout, what=f"swap moved to a {mib} MiB zram")
        return result

    def move_swap_to_disk(self, timeout: float = 600.0) -> None:
        """The swap disk back on, zram off (after :meth:`move_swap_to_zram`)."""
        (self.share / "swap-disk").touch()
        self.wait_for(lambda: not (self.share / "swap-disk").exists() and int(
            self.fresh_status()["meminfo"]["SwapTotal"]) * 1024 > 3 * 1024 * MIB, timeout,
            what="swap back on the disk")

    def memory_pressure(self, status: dict[str, Any] | None = None) -> dict[str, float]:
        """The guest kernel's memory PSI (``/proc/pressure/memory``): some and full avg10."""
        psi = (status or self.status())["memory_pressure"]
        return {"some_avg10": float(psi["some"]["avg10"]),
                "full_avg10": float(psi["full"]["avg10"])}

    def kill_container(self, container_id: str, signal: str = "SIGKILL",
                       timeout: float = 60.0) -> None:
        """Signal one container's main process from the node, as its runtime does: SIGTERM
        to stop it (as ``crictl stop`` or a shutting-down node), SIGKILL as an OOM kill or
        a crash ends it. (From inside the container its PID 1 cannot be killed.)"""
        request = self.share / "kill-container"
        request.write_text(f"{container_id} {signal}\n")
        self.wait_for(lambda: not request.exists(), timeout,
                      what=f"{signal} to container {container_id}")

    def kubelet_get(self, path: str) -> str:
        """GET a kubelet endpoint through the API server's node proxy (as cluster admin)."""
        proc = self.cp.kubectl("get", "--raw", f"/api/v1/nodes/{self.name}/proxy{path}")
        return proc.stdout



@dataclass(frozen=True)
class PressureSample:
    """The guest kernel's PSI at one moment: ``at`` on the host's monotonic clock,
    ``epoch`` on the guest's own (what the node agent stamps its log with); memory some and
    full avg10 and the some counter (microseconds stalled since boot), CPU some avg10 and
    counter. The counters are None in a psi.log from before they were written."""

    at: float
    some: float
    full: float
    epoch: float | None = None
    memory_total: int | None = None
    cpu: float | None = None
    cpu_total: int | None = None


@dataclass
class PressureLog:
    """The node's pressure and the node agent's marks, for the whole session: the scenarios
    ask what they were over their own stretch of time.

    The PSI is the guest kernel's own, the ground truth the agent's marks are checked
    against: ``psi.log``, one line a second from a guest loop of shell
    builtins that keeps writing while the node thrashes (the status.json loop, which scans
    every container cgroup and writes through 9p, is slower and stalled there when it forked
    per file). Its lines carry the guest's uptime; they
    are placed on the host's clock by the smallest (host time of a read - uptime of the
    newest line read) seen, which is the offset plus at most the read interval. The mark is
    the node's labels, looked up through the API server every ``mark_interval`` seconds: a
    look is marked when any of ``labels`` is on the node."""

    node: RealNode
    labels: list[str]
    interval: float = 1.0
    mark_interval: float = 5.0
    marks: list[tuple[float, bool]] = field(default_factory=list)
    _lines: list[tuple[float, PressureSample]] = field(default_factory=list)  # uptime, sample
    _offset: float = math.inf
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> PressureLog:
        for target, name in ((self._read_psi, "psi-log"), (self._read_marks, "mark-log")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _read_psi(self) -> None:
        path, position, partial = self.node.share / "psi.log", 0, ""
        while not self._stop.wait(self.interval):
            with contextlib.suppress(OSError):
                with path.open() as f:
                    if os.fstat(f.fileno()).st_size < position:
                        position, partial = 0, ""  # a new guest truncated it
                    f.seek(position)
                    chunk = f.read()
                    position = f.tell()
                now = time.monotonic()
                *complete, partial = (partial + chunk).split("\n")
                for line in complete:
                    with contextlib.suppress(ValueError, IndexError):
                        self._lines.append(_psi_line(line))
                if complete and self._lines:
                    self._offset = min(self._offset, now - self._lines[-1][0])

    def _read_marks(self) -> None:
        while not self._stop.wait(self.mark_interval):
            with contextlib.suppress(Exception):  # a slow kubectl: next time
                labels = self.node.node()["metadata"].get("labels", {})
                self.marks.append((time.monotonic(), any(k in labels for k in self.labels)))

    def since(self, start: float, end: float | None = None) -> list[PressureSample]:
        offset = self._offset
        if offset == math.inf:
            return []  # no line read yet
        samples = (dataclasses.replace(sample, at=uptime + offset)
                   for uptime, sample in list(self._lines))
        return [s for s in samples if s.at >= start and (end is None or s.at <= end)]

    def max_some(self, start: float, end: float | None = None) -> float:
        return max((s.some for s in self.since(start, end)), default=0.0)

    def looks(self, start: float, end: float | None = None) -> list[tuple[float, bool]]:
        """The looks at the node in the stretch: when, and whether it carried the mark."""
        return [(at, m) for at, m in list(self.marks)
                if at >= start and (end is None or at <= end)]

    def marked_between(self, start: float, end: float | None = None) -> bool | None:
        """Whether any look at the node in the stretch saw the mark (None: no look)."""
        seen = [m for _, m in self.looks(start, end)]
        return any(seen) if seen else None

    def marked_again(self, start: float, end: float | None = None) -> bool:
        """Whether a look in the stretch saw the mark set after a look that saw it clear: a
        new mark, not one held over from before ``start`` until the agent's window cleared it."""
        seen = [m for _, m in self.looks(start, end)]
        return any(later and not earlier for earlier, later in itertools.pairwise(seen))

    def first(self, start: float, predicate: Any) -> PressureSample | None:
        return next((s for s in self.since(start) if predicate(s)), None)

    def recent_run(self, end: float, predicate: Any, lag: float
                   ) -> tuple[PressureSample, PressureSample] | None:
        """First and last sample of the latest uninterrupted run of samples meeting
        ``predicate`` that was still going ``lag`` seconds before ``end`` (None if there is
        none): what the guard saw when it acted at ``end``. The guard reads the kubelet,
        whose figures lag the kernel's (cadvisor's housekeeping, the read interval), so the
        run may have ended a little before the action. A pressure that rises, dips under the
        threshold and rises again restarts the guard's window, so latency is measured from
        the start of the last rise."""
        samples = self.since(0.0, end)
        last = next((i for i in range(len(samples) - 1, -1, -1) if predicate(samples[i])), None)
        if last is None or samples[last].at < end - lag:
            return None
        first = last
        while first > 0 and predicate(samples[first - 1]):
            first -= 1
        return samples[first], samples[last]

    def spacing(self, start: float, end: float) -> float:
        """The median time between two samples over a stretch: the resolution of the
        latencies measured from them."""
        times = [s.at for s in self.since(start, end)]
        gaps = sorted(b - a for a, b in itertools.pairwise(times))
        return gaps[len(gaps) // 2] if gaps else 0.0

    def describe(self, start: float, end: float | None = None, every: float = 5.0) -> str:
        """The stretch for a failure message: one sample per ``every`` seconds, the marks."""
        shown, last = [], -math.inf
        for s in self.since(start, end):
            if s.at - last >= every:
                shown.append(f"{s.at - start:.0f}s:{s.some:g}")
                last = s.at
        marks = [f"{at - start:.0f}s:{int(m)}" for at, m in self.looks(start, end)]
        return f"guest some avg10 {' '.join(shown) or 'no samples'}; marks {' '.join(marks)}"


def _psi_line(line: str) -> tuple[float, PressureSample]:
    """One psi.log line (node-init.sh): its uptime, and the sample (``at`` still 0)."""
    fields = line.split()
    uptime, some, full = (float(v) for v in fields[:3])
    if len(fields) < 12:
        return uptime, PressureSample(0.0, some, full)
    return uptime, PressureSample(0.0, some, full, float(fields[8]), int(fields[9]),
                                  float(fields[10]), int(fields[11]))


def stall_share(samples: list[PressureSample], end: int, window: float,
                counter: str = "memory_total") -> float | None:
    """Percent of the ``window`` seconds before sample ``end`` the kernel counted as stalled
    (the rise of its some counter over the stretch, on the guest's clock); None where the
    samples do not reach back that far."""
    last = samples[end]
    for start in range(end - 1, -1, -1):
        first = samples[start]
        if first.epoch is None or last.epoch is None:
            return None
        if last.epoch - first.epoch >= window:
            a, b = getattr(first, counter), getattr(last, counter)
            if a is None or b is None:
                return None
            return min(100.0, 100.0 * (b - a) / ((last.epoch - first.epoch) * 1e6))
    return None


def main() -> None:
    """``unshare --net -- python -m tests.node.node``: a control plane and one real swap node,
    until Ctrl-C (with gVisor's runsc handler when SWAPWISE_NODE_GVISOR=1). Reach them from
    another shell with ``nsenter --net=/proc/PID/ns/net``."""
    from tests.e2e.cluster import BASE_LINE, ensure_binaries

    network_to_guest()
    artifacts = Artifacts.build()
    gvisor = GVisor.build() if os.environ.get("SWAPWISE_NODE_GVISOR") == "1" else None
    with (ControlPlane(ensure_binaries(BASE_LINE), keep=True, bind_address="0.0.0.0") as cp,
          RealNode(cp, artifacts, gvisor=gvisor) as node):
        print(f"node {node.name} registered; guest files in {node.share}; pid {os.getpid()}")
        cp.run_until_interrupted()


if __name__ == "__main__":
    main()

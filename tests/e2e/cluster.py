"""A real, local Kubernetes control plane (and swapwise) for end-to-end tests.

Why: a mutating webhook is only proven by the client that really calls it, kube-apiserver.
This starts etcd, kube-apiserver, kube-scheduler and kube-controller-manager (built from Go
modules by build-control-plane.sh) on loopback with random ports, with fake Nodes instead of
kubelets. Usable from pytest (see conftest.py) and by hand:

    from tests.e2e.cluster import ControlPlane    # from the repo root
    with ControlPlane() as cp:
        cp.create_node("swap-1", memory="32Gi", cpu="8", labels={SWAP_LABEL: "true"})
        print(cp.kubectl("get", "nodes").stdout)

or `python -m tests.e2e.cluster` for a cluster to poke at with kubectl until Ctrl-C.
Only the standard library and `cryptography` are needed.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# SWAPWISE_HELM (3 or 4), read once, where the chart tests read it; re-exported for tests/e2e.
from tests.chart.chartlib import HELM_MAJOR as HELM_MAJOR
from tests.chart.chartlib import HELM_NAME as HELM_NAME
from webhook.engine.backing import PERMILLE_LABEL, node_permille
from webhook.engine.nodes import BEHAVIOR_LABEL

E2E_DIR = Path(__file__).resolve().parent


BASE_LINE = "1.34"  # helper module gomod/kubernetes; another line L has gomod/kubernetes-L
LINES = ("1.34", "1.37")  # make test runs the whole e2e suite on 1.34, make e2e-1.37 on 1.37


def _setting(variable: str, default: str, allowed: Iterable[str]) -> str:
    value = os.environ.get(variable) or default
    if value not in allowed:
        raise RuntimeError(f"{variable}={value}: expected one of {', '.join(allowed)}")
    return value


# The Kubernetes line every e2e test runs on unless it asks for another:
# SWAPWISE_K8S_VERSION=1.34 (default) or 1.37, the same setting build-control-plane.sh reads.
DEFAULT_LINE = _setting("SWAPWISE_K8S_VERSION", BASE_LINE, LINES)


def _module_dir(line: str) -> Path:
    """The helper Go module of a Kubernetes line (as build-control-plane.sh picks it)."""
    name = "kubernetes" if line == BASE_LINE else f"kubernetes-{line}"
    return E2E_DIR / "gomod" / name


def k8s_version(line: str = DEFAULT_LINE) -> str:
    """The release the helper module of ``line`` builds (single source of truth: go.mod)."""
    go_mod = (_module_dir(line) / "go.mod").read_text()
    match = re.search(r"^require k8s\.io/kubernetes (v\S+)$", go_mod, re.MULTILINE)
    if not match:
        raise RuntimeError(f"no `require k8s.io/kubernetes` line in {_module_dir(line)}/go.mod")
    return match.group(1)


K8S_VERSION = k8s_version()  # e.g. v1.34.4, or v1.37.2 with SWAPWISE_K8S_VERSION=1.37
SWAP_LABEL = "swapwise.io/swap-node"
PROFILE_LABEL = "swapwise.io/profile"
SERVICE_CIDR = "10.96.0.0/24"
BUILD_SCRIPT = E2E_DIR / "build-control-plane.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl")
ALL_BINARIES = (*BINARIES, HELM_NAME)  # what the e2e tests need of build-control-plane.sh

T = TypeVar("T")


def swap_node_labels(swap: int, memory: int) -> dict[str, str]:
    """A swap node as a cluster with swapwise has it: the swap-node label, the LimitedSwap its
    admin declares (docs/node-agent.md) and the swap per-mille, as the node agent writes
    them (no agent runs on these fake nodes: tests/e2e/test_node_agent.py runs one)."""
    return {SWAP_LABEL: "true", BEHAVIOR_LABEL: "LimitedSwap",
            PERMILLE_LABEL: str(node_permille(swap, memory))}


class ClusterError(RuntimeError):
    """A component failed; the message carries what it printed so CI logs explain why."""


def bin_dir(line: str = DEFAULT_LINE) -> Path:
    """Where build-control-plane.sh puts the binaries of a Kubernetes line.

    SWAPWISE_K8S_BIN overrides the selected line's directory (DEFAULT_LINE, from
    SWAPWISE_K8S_VERSION); SWAPWISE_K8S_BIN_1_37 (dots as underscores) another line's.
    """
    default = Path.home() / ".cache" / "swapwise" / "k8s" / k8s_version(line) / "bin"
    variable = "SWAPWISE_K8S_BIN" if line == DEFAULT_LINE else \
        f"SWAPWISE_K8S_BIN_{line.replace('.', '_')}"
    return Path(os.environ.get(variable) or default)


def missing_binaries(directory: Path | None = None, names: Iterable[str] = BINARIES) -> list[str]:
    """Names of binaries not built yet."""
    directory = directory or bin_dir()
    return [b for b in names if not os.access(directory / b, os.X_OK)]


def skip_unless_e2e() -> None:
    """Skip the calling test or fixture when SWAPWISE_SKIP_E2E=1 (no control plane wanted)."""
    if os.environ.get("SWAPWISE_SKIP_E2E") == "1":
        pytest.skip("SWAPWISE_SKIP_E2E=1: end-to-end tests against a local control plane skipped")


def ensure_binaries(line: str = DEFAULT_LINE, names: Iterable[str] = ALL_BINARIES) -> Path:
    """Build the binaries of a Kubernetes line if any is missing (~10 minutes cold on 2
    cores, nothing when cached)."""
    names = tuple(names)
    directory = bin_dir(line)
    if missing_binaries(directory, names):
        env = {**os.environ, "SWAPWISE_K8S_BIN": str(directory), "SWAPWISE_K8S_VERSION": line}
        subprocess.run(["bash", str(BUILD_SCRIPT), *names], check=True, env=env)
    return directory


_ISSUED: set[int] = set()  # ports free_port handed out in this process


def free_port() -> int:
    """A free loopback TCP port (the kernel picks it; the tiny reuse race with other
    processes is acceptable), never one this process was given before: nothing holds a port
    between this call and its user's bind, and in a fresh network namespace the kernel gave
    etcd's client and peer ports as the same number twice in a row."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _ISSUED:
            _ISSUED.add(port)
            return port


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float = 60.0,
    interval: float = 0.25,
    what: str = "condition",
    on_timeout: Callable[[], str] | None = None,
) -> T:
    """Poll `predicate` until it returns something truthy and return that.

    Exceptions from the predicate count as "not yet"; the last one is reported on timeout,
    together with `on_timeout()` (e.g. component logs) so a failure explains itself.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
            if result:
                return result
        except ClusterError:
            raise  # a component died: waiting longer cannot help
        except Exception as e:  # polled again until the deadline
            last_error = e
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            extra = f"\n{on_timeout()}" if on_timeout else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}{extra}")
        time.sleep(interval)


# --------------------------------------------------------------------------- certificates


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass
class _CA:
    """A throwaway CA: signs the API server's serving cert and the admin client cert."""

    key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1())
    )
    cert: x509.Certificate = field(init=False)

    def __post_init__(self) -> None:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "swapwise-e2e-ca")])
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )

    def issue(
        self,
        common_name: str,
        *,
        organizations: Iterable[str] = (),
        dns: Iterable[str] = (),
        ips: Iterable[str] = (),
        server: bool = False,
    ) -> tuple[bytes, bytes]:
        """Return (cert PEM, key PEM) for a serving (server=True) or client certificate."""
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return _pem_cert(builder.sign(self.key, hashes.SHA256())), _pem_key(key)


# --------------------------------------------------------------------------- processes


def _die_with_parent() -> None:
    """In the child: get SIGKILL if the test process dies, so no orphan holds ports or etcd."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Component:
    """One child process with its own log file and process group."""

    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    def start(self, env: Mapping[str, str] | None = None) -> None:
        self._log = self.log_path.open("ab")
        self._log.write(f"$ {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: teardown kills the whole tree
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            env=dict(env) if env is not None else None,
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        """Raise with the log tail when the process has exited (fail fast, not by timeout)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ClusterError(
                f"{self.name} exited with code {self.proc.returncode}\n{self.tail()}"
            )

    def stop(self, grace: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, sig)
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return f"----- {self.name}: no log -----"
        body = "\n".join(text[-lines:])
        shown = min(lines, len(text))
        return f"----- {self.name} (last {shown} lines of {self.log_path}) -----\n{body}"


def _https_get(url: str, context: ssl.SSLContext, timeout: float = 3.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as r:
            return int(r.status), r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode(errors="replace")


def _insecure_context() -> ssl.SSLContext:
    """For scheduler/controller-manager healthz: they serve a self-signed cert of their own."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


# --------------------------------------------------------------------------- control plane


class ControlPlane:
    """etcd + kube-apiserver + kube-scheduler + kube-controller-manager on loopback.

    No kubelets: Nodes are API objects (`create_node`), pods get bound but stay Pending,
    which is all admission and scheduling tests need.
    """

    def __init__(
        self,
        binaries: Path | None = None,
        workdir: Path | None = None,
        keep: bool | None = None,
        start_timeout: float = 90.0,
        bind_address: str = "127.0.0.1",
        apiserver_args: Iterable[str] = (),
        apiserver: Path | None = None,
    ) -> None:
        """``bind_address``: where kube-apiserver listens. Loopback, unless the caller runs
        in a network namespace of its own whose guests must reach it (tests/node).
        ``apiserver_args``: extra kube-apiserver flags (e.g. feature gates), appended.
        ``apiserver``: a kube-apiserver binary of another line than ``binaries`` (the
        rest of the control plane may be up to three minors older)."""
        self.bin = binaries or bin_dir()
        self.apiserver_args = list(apiserver_args)
        self.apiserver = apiserver or self.bin / "kube-apiserver"
        self.bind_address = bind_address
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="swapwise-e2e-"))
        self.keep = keep if keep is not None else os.environ.get("SWAPWISE_E2E_KEEP") == "1"
        self.start_timeout = start_timeout
        self.components: list[Component] = []
        self.api_port = 0
        self.server = ""
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.pki = self.workdir / "pki"
        self.etcd_url = ""
        self._ssl: ssl.SSLContext | None = None
        self._ca: _CA | None = None

    # -- lifecycle

    def __enter__(self) -> ControlPlane:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        missing = missing_binaries(self.bin)
        if missing:
            raise ClusterError(f"missing {', '.join(missing)} in {self.bin}; run {BUILD_SCRIPT}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_pki()
        self._start_etcd()
        self._start_apiserver()
        self._start_controllers()

    def stop(self) -> None:
        """Stop every component (newest first) and remove the work dir unless kept."""
        for c in reversed(self.components):
            c.stop()
        self.components.clear()
        if self._own_workdir and not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- setup steps

    def _write_pki(self) -> None:
        """CA, API server serving cert, admin client cert, service-account signing key."""
        pki = self.pki
        pki.mkdir(exist_ok=True)
        ca = self._ca = _CA()
        (pki / "ca.crt").write_bytes(_pem_cert(ca.cert))
        (pki / "ca.key").write_bytes(_pem_key(ca.key))
        crt, key = ca.issue(
            "kube-apiserver",
            dns=[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            ips=["127.0.0.1", str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))],
            server=True,
        )
        (pki / "apiserver.crt").write_bytes(crt)
        (pki / "apiserver.key").write_bytes(key)
        # system:masters: full access without RBAC objects; scheduler and KCM use it too.
        crt, key = ca.issue("swapwise-e2e-admin", organizations=["system:masters"])
        (pki / "admin.crt").write_bytes(crt)
        (pki / "admin.key").write_bytes(key)
        sa = ec.generate_private_key(ec.SECP256R1())
        (pki / "sa.key").write_bytes(_pem_key(sa))
        (pki / "sa.pub").write_bytes(
            sa.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(pki / "admin.crt", pki / "admin.key")
        self._ssl = ctx

    def issue_client_cert(self, name: str, common_name: str, *groups: str) -> tuple[Path, Path]:
        """A client certificate from the cluster CA (e.g. a kubelet's ``system:node:N``)."""
        if self._ca is None:
            raise ClusterError("the control plane has not been started")
        crt, key = self._ca.issue(common_name, organizations=groups)
        paths = self.pki / f"{name}.crt", self.pki / f"{name}.key"
        paths[0].write_bytes(crt)
        paths[1].write_bytes(key)
        return paths

    def issue_serving_cert(self, name: str, dns: str, ip: str) -> tuple[Path, Path]:
        """A serving certificate from the cluster CA (e.g. for a stand-in kubelet)."""
        if self._ca is None:
            raise ClusterError("the control plane has not been started")
        crt, key = self._ca.issue(dns, dns=[dns], ips=[ip], server=True)
        paths = self.pki / f"{name}.crt", self.pki / f"{name}.key"
        paths[0].write_bytes(crt)
        paths[1].write_bytes(key)
        return paths

    def _component(self, name: str, argv: list[str]) -> Component:
        c = Component(name, argv, self.workdir / f"{name}.log")
        c.start()
        self.components.append(c)
        return c

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        etcd = self._component(
            "etcd",
            [
                str(self.bin / "etcd"),
                "--name=e2e",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=e2e=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",  # throwaway data: speed over durability
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            etcd.check_alive()
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as r:
                return bool(json.load(r).get("health") == "true")

        wait_for(healthy, self.start_timeout, what="etcd /health", on_timeout=etcd.tail)

    def _start_apiserver(self) -> None:
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        pki = self.pki
        api = self._component(
            "kube-apiserver",
            [
                str(self.apiserver),
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={self.bind_address}",
                "--advertise-address=127.0.0.1",
                # Webhooks referenced by Service are dialled at one of its ready endpoints,
                # as kube-proxy-less API servers (most managed control planes) do; this
                # control plane has no kube-proxy to route a ClusterIP.
                "--enable-aggregator-routing=true",
                f"--secure-port={self.api_port}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # The `kubernetes` Service endpoints would be 127.0.0.1, which Endpoints
                # validation rejects (loopback); nothing here needs them.
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                # TaintNodesByCondition taints every new Node not-ready:NoSchedule and only
                # the node lifecycle controller (off, see below) would lift it again.
                "--disable-admission-plugins=TaintNodesByCondition",
                # Default admission plugins already include MutatingAdmissionWebhook,
                # LimitRanger, ResourceQuota, ServiceAccount, Priority, ...
                # Real kubelets (tests/node) serve logs, configz and metrics; reach them by
                # InternalIP (a node's hostname resolves nowhere here) as a cluster admin.
                f"--kubelet-client-certificate={pki / 'admin.crt'}",
                f"--kubelet-client-key={pki / 'admin.key'}",
                "--kubelet-preferred-address-types=InternalIP",
                *self.apiserver_args,
            ],
        )
        self._write_kubeconfig()
        assert self._ssl is not None
        ctx = self._ssl

        def ready() -> bool:
            api.check_alive()
            return _https_get(f"{self.server}/readyz", ctx)[0] == 200

        wait_for(ready, self.start_timeout, what="kube-apiserver /readyz", on_timeout=self.logs)

    def _write_kubeconfig(self) -> None:
        def b64(p: Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": b64(self.pki / "ca.crt"),
                    },
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {
                        "client-certificate-data": b64(self.pki / "admin.crt"),
                        "client-key-data": b64(self.pki / "admin.key"),
                    },
                }
            ],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
            "current-context": "e2e",
        }
        self.kubeconfig.write_text(json.dumps(config, indent=2))  # JSON is valid YAML
        self.kubeconfig.chmod(0o600)

    def _start_controllers(self) -> None:
        kc = str(self.kubeconfig)
        common = [
            f"--kubeconfig={kc}",
            # No --authentication/authorization-kubeconfig: their serving port only answers
            # /healthz (always allowed), and the delegation would look up a front-proxy CA
            # this cluster does not have, logging an error every few seconds.
            "--bind-address=127.0.0.1",
            "--leader-elect=false",  # one instance: no lease wait at start
        ]
        sched_port, kcm_port = free_port(), free_port()
        sched = self._component(
            "kube-scheduler",
            [
                str(self.bin / "kube-scheduler"),
                *common,
                f"--secure-port={sched_port}",
                f"--cert-dir={self.workdir / 'scheduler-certs'}",
            ],
        )
        kcm = self._component(
            "kube-controller-manager",
            [
                str(self.bin / "kube-controller-manager"),
                *common,
                f"--secure-port={kcm_port}",
                f"--cert-dir={self.workdir / 'kcm-certs'}",
                # Fake nodes send no heartbeats; the node lifecycle controller would taint
                # them unreachable and the scheduler would then skip them.
                "--controllers=*,-node-lifecycle-controller",
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                f"--root-ca-file={self.pki / 'ca.crt'}",
                "--use-service-account-credentials=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
            ],
        )
        insecure = _insecure_context()
        for comp, port in ((sched, sched_port), (kcm, kcm_port)):

            def healthy(comp: Component = comp, port: int = port) -> bool:
                comp.check_alive()
                return _https_get(f"https://127.0.0.1:{port}/healthz", insecure)[0] == 200

            what = f"{comp.name} /healthz"
            wait_for(healthy, self.start_timeout, what=what, on_timeout=self.logs)
        # The service-account controller works once `default` exists in `default`.
        wait_for(
            lambda: (
                self.kubectl(
                    "get", "serviceaccount", "default", "-n", "default", check=False
                ).returncode
                == 0
            ),
            self.start_timeout,
            what="serviceaccount default/default",
            on_timeout=self.logs,
        )

    # -- using it

    def logs(self, lines: int = 40) -> str:
        """Tail of every component log, for failure messages."""
        return "\n".join(c.tail(lines) for c in self.components)

    def check_alive(self) -> None:
        """Raise (with logs) if any component has died."""
        for c in self.components:
            if not c.alive():
                raise ClusterError(f"{c.name} is not running\n{self.logs()}")

    @property
    def helm(self) -> Path:
        """The helm this session installs with (SWAPWISE_HELM: `helm` 3 or `helm4`)."""
        return self.bin / HELM_NAME

    def kubectl(
        self,
        *args: str,
        input: str | None = None,  # mirrors subprocess.run
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; on failure raise with stderr (check=True)."""
        argv = [str(self.bin / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise ClusterError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}):\n"
                f"{proc.stderr.strip()}\n{proc.stdout.strip()}"
            )
        return proc

    def admin_context(self) -> ssl.SSLContext:
        """TLS context of the cluster admin, for clients that talk HTTPS to the API directly."""
        if self._ssl is None:
            raise ClusterError("the control plane has not been started")
        return self._ssl

    def get_json(self, *args: str) -> Any:
        """`kubectl get ... -o json`, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, manifest: str, *args: str) -> subprocess.CompletedProcess[str]:
        """`kubectl apply -f -` of YAML or JSON text; extra args e.g. `--dry-run=server`."""
        return self.kubectl("apply", "-f", "-", *args, input=manifest)

    def create_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        """Create a namespace and wait for its `default` service account.

        Why wait: the ServiceAccount admission plugin rejects pods until the controller has
        created the account, a short race right after the namespace appears.
        """
        ns = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": dict(labels or {})},
        }
        self.apply(json.dumps(ns))
        wait_for(
            lambda: (
                self.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode
                == 0
            ),
            30,
            what=f"serviceaccount {name}/default",
            on_timeout=self.logs,
        )

    def create_node(
        self,
        name: str,
        memory: str,
        cpu: str,
        labels: Mapping[str, str] | None = None,
        pods: int = 110,
        swap_capacity: int | None = None,
        allocatable: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Create a fake Node with capacity (and allocatable, default = capacity) and labels.

        Create keeps `status` for Nodes (later edits need the /status subresource).
        `swap_capacity` (bytes) fills `status.nodeInfo.swap.capacity`, as kubelets report it
        since 1.33.
        """
        capacity = {"cpu": cpu, "memory": memory, "pods": str(pods)}
        node_info: dict[str, Any] = {
            "architecture": "amd64",
            "operatingSystem": "linux",
            "kubeletVersion": K8S_VERSION,
            "kubeProxyVersion": "",
            "containerRuntimeVersion": "fake://0",
            "kernelVersion": "6.0.0",
            "osImage": "swapwise e2e fake node",
            "bootID": "",
            "machineID": "",
            "systemUUID": "",
        }
        if swap_capacity is not None:
            node_info["swap"] = {"capacity": swap_capacity}
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **dict(labels or {}),
                },
            },
            "spec": {},
            "status": {
                "capacity": capacity,
                "allocatable": {**capacity, **dict(allocatable or {})},
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "FakeNode",
                        "message": "swapwise e2e fake node",
                    }
                ],
                "nodeInfo": node_info,
            },
        }
        created: dict[str, Any] = json.loads(
            self.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(node)).stdout
        )
        return created

    def run_until_interrupted(self) -> None:
        """Print how to reach this cluster by hand, then keep it up until Ctrl-C."""
        print(f"export KUBECONFIG={self.kubeconfig}\nexport PATH={self.bin}:$PATH")
        print(f"component logs: {self.workdir}/*.log; Ctrl-C stops everything")
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(1)
                self.check_alive()

    def wait_for(
        self,
        predicate: Callable[[], T | None],
        timeout: float = 60.0,
        interval: float = 0.25,
        what: str = "condition",
    ) -> T:
        """`wait_for` that appends the component logs to the timeout message."""
        return wait_for(predicate, timeout, interval, what, on_timeout=self.logs)

    def bound_when_settled(self, namespace: str, total: int, timeout: float = 120.0) -> int:
        """Pods of `namespace` bound once the scheduler has tried all `total` of them (the
        rest are Unschedulable): how many the nodes hold."""

        def settled() -> int | None:
            pods = self.get_json("pods", "-n", namespace)["items"]
            if len(pods) < total:
                return None
            bound = 0
            for p in pods:
                if p["spec"].get("nodeName"):
                    bound += 1
                    continue
                conditions = {c["type"]: c for c in p["status"].get("conditions", [])}
                if conditions.get("PodScheduled", {}).get("reason") != "Unschedulable":
                    return None
            return bound

        return self.wait_for(settled, timeout, what=f"scheduler to settle {namespace}")

    def density(self, namespace: str, manifest: str, total: int) -> int:
        """Apply `total` pods, count how many the nodes hold once scheduling settles, then
        force-delete them all so the next namespace starts on empty nodes."""
        self.apply(manifest)
        bound = self.bound_when_settled(namespace, total)
        self.kubectl(
            "delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force", "--wait=true"
        )
        return bound


# --------------------------------------------------------------------------- swapwise


def swapwise_executable() -> str:
    """The `swapwise` console script of the venv running the tests (next to sys.executable)."""
    candidate = Path(sys.executable).parent / "swapwise"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("swapwise")
    if not found:
        raise ClusterError(
            f"no swapwise console script next to {sys.executable} or on PATH; "
            "pip install -e . in the test venv"
        )
    return found


class Swapwise:
    """`swapwise serve` over TLS on 127.0.0.1, with certificates from `swapwise certs`.

    The API server reaches it through `clientConfig.url` (no kube-proxy, so Services lead
    nowhere); the serving cert therefore carries IP SAN 127.0.0.1.
    """

    def __init__(
        self,
        workdir: Path,
        policy: Path | None = None,
        port: int | None = None,
        cert_dir: Path | None = None,
    ) -> None:
        """``cert_dir`` holding tls.crt/tls.key (e.g. the chart's Secret) is used as is;
        without it, certificates are made with ``swapwise certs``."""
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cert_dir = cert_dir or workdir / "certs"
        self.policy = policy
        self.port = port or free_port()
        self.exe = swapwise_executable()
        self.component: Component | None = None
        if cert_dir is None:
            self._make_certs()

    @property
    def url_base(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_bundle(self) -> bytes:
        """PEM of the CA that signed the serving certificate (for `caBundle`)."""
        return (self.cert_dir / "ca.crt").read_bytes()

    def _make_certs(self) -> None:
        argv = [
            self.exe,
            "certs",
            "--service",
            "swapwise",
            "--namespace",
            "swapwise",
            "--out",
            str(self.cert_dir),
            "--ip",
            "127.0.0.1",
            "--dns",
            "localhost",
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} failed:\n{proc.stderr}{proc.stdout}")
        for f in ("ca.crt", "tls.crt", "tls.key"):
            if not (self.cert_dir / f).exists():
                raise ClusterError(f"swapwise certs did not write {self.cert_dir / f}")

    def start(self, timeout: float = 30.0) -> None:
        """Start serving and wait until /readyz answers 200 over verified TLS."""
        argv = [
            self.exe,
            "serve",
            "--cert-dir",
            str(self.cert_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        if self.policy is not None:
            argv += ["--policy", str(self.policy)]
        self.component = Component("swapwise", argv, self.workdir / "swapwise.log")
        self.component.start()
        ctx = ssl.create_default_context(cafile=str(self.cert_dir / "ca.crt"))
        comp = self.component

        def ready() -> bool:
            comp.check_alive()
            return _https_get(f"{self.url_base}/readyz", ctx, timeout=2)[0] == 200

        wait_for(ready, timeout, what="swapwise /readyz", on_timeout=comp.tail)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `grace` s; swapwise drains ~5 s, so pass 0 to just kill."""
        if self.component is not None:
            self.component.stop(grace)
            self.component = None

    def logs(self, lines: int = 40) -> str:
        return self.component.tail(lines) if self.component else "swapwise: not running"

    def __enter__(self) -> Swapwise:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def webhook_configuration(
    url_base: str,
    ca_bundle_pem: bytes,
    profiles: Iterable[str],
    failure_policy: str = "Ignore",
    reinvocation: str = "IfNeeded",
    name: str = "swapwise",
    timeout_seconds: int = 5,
) -> dict[str, Any]:
    """The chart's MutatingWebhookConfiguration, with `url` instead of a Service."""
    ca = base64.b64encode(ca_bundle_pem).decode()
    hooks = []
    for profile in profiles:
        hooks.append(
            {
                "name": f"{profile}.swapwise.io",
                "clientConfig": {"url": f"{url_base}/mutate/{profile}", "caBundle": ca},
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": PROFILE_LABEL, "operator": "In", "values": [profile]},
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": ["swapwise", "kube-system", "kube-node-lease"],
                        },
                    ]
                },
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": failure_policy,
                "reinvocationPolicy": reinvocation,
                "timeoutSeconds": timeout_seconds,
                "matchPolicy": "Equivalent",
            }
        )
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": hooks,
    }


def register_webhook(
    cp: ControlPlane,
    url_base: str,
    ca_bundle_pem: bytes,
    profiles: Iterable[str],
    failure_policy: str = "Ignore",
    reinvocation: str = "IfNeeded",
    name: str = "swapwise",
) -> dict[str, Any]:
    """Apply the MutatingWebhookConfiguration (one webhook per profile) and return it.

    The API server picks it up through an informer, usually within a second; use
    `wait_for_mutation` before asserting on mutated pods.
    """
    config = webhook_configuration(
        url_base, ca_bundle_pem, profiles, failure_policy, reinvocation, name
    )
    cp.apply(json.dumps(config))
    return config


def wait_for_mutation(cp: ControlPlane, namespace: str, timeout: float = 30.0) -> None:
    """Wait until a server-side dry-run pod in `namespace` comes back annotated by swapwise."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "swapwise-probe", "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "probe",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"memory": "1Gi"}},
                }
            ]
        },
    }

    def mutated() -> bool:
        out = cp.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(pod)
        ).stdout
        annotations = json.loads(out)["metadata"].get("annotations") or {}
        return PROFILE_LABEL in annotations

    cp.wait_for(mutated, timeout, what=f"swapwise to mutate pods in namespace {namespace}")


def main() -> None:
    """`python -m tests.e2e.cluster`: a control plane with three fake nodes, until Ctrl-C."""
    with ControlPlane(ensure_binaries()) as cp:
        for name in ("swap-1", "swap-2"):
            cp.create_node(name, "16Gi", "8", swap_node_labels(32 << 30, 16 << 30),
                           swap_capacity=32 << 30)
        cp.create_node("plain-1", "16Gi", "8")
        cp.run_until_interrupted()


if __name__ == "__main__":
    main()

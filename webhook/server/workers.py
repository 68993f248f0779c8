"""``swapwise serve --workers N``: one listening socket, N forked worker processes.

Python runs one admission at a time per process, so one process uses one core. On a
node with more cores, N workers share the socket the parent bound (the kernel spreads
accepted connections between them); each worker has its own event loop, file watchers
and reloads, exactly as a single process does. Scaling replicas instead gives the same
throughput plus availability across nodes, so prefer replicas; use workers when the pod
has more than one core to use (see BENCHMARKS.md, "replicas or workers").

The parent only supervises: it forwards SIGTERM/SIGINT to every worker (each then drains
as a single process would), restarts a worker that dies unexpectedly, and keeps the
metrics directory that makes /metrics the sum over all workers (see metrics.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

import uvloop
from prometheus_client import multiprocess

from webhook.base.logs import get_logger
from webhook.policy import PolicyError, load_policy
from webhook.server import asynclog
from webhook.server.options import ServeOptions
from webhook.server.process import Fallback, build, serve_socket
from webhook.server.tls import CertificateError
from webhook.server.tls import load as load_certificate

log = get_logger("workers")

RESTART_WINDOW = 60.0  # this many seconds...
MAX_RESTARTS = 5  # ...with this many unexpected worker exits: give up (crash loop)
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Linux: a worker gets SIGTERM if the supervisor is killed, instead of living on."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Supervisor:
    def __init__(self, options: ServeOptions, sock: socket.socket) -> None:
        self.options = options
        self.sock = sock
        self.workers: dict[int, int] = {}  # pid -> worker index
        self.stopping = False
        self.failed = False
        self.exits: list[float] = []
        self.metrics_dir = Path(tempfile.mkdtemp(prefix="swapwise-metrics-"))
        # Refuses a bad policy or certificate before forking anything.
        _, state, certificates = build(options)
        self.fallback = Fallback(state.policies.policy, certificates.current)

    def _refresh_fallback(self) -> None:
        """Before restarting a worker: what it serves if the files are bad right now."""
        policy, certificate = self.fallback.policy, self.fallback.certificate
        if self.options.policy is not None:
            with contextlib.suppress(PolicyError):
                policy = load_policy(self.options.policy)
        with contextlib.suppress(CertificateError):
            certificate = load_certificate(self.options.cert, self.options.key,
                                           self.options.client_ca)
        self.fallback = Fallback(policy, certificate)

    def run(self) -> None:
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            for index in range(self.options.workers):
                self._spawn(index)
            log.info("workers started", extra={"workers": self.options.workers,
                                               "pids": sorted(self.workers)})
            self._supervise()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
        if self.failed:
            raise OSError("workers kept crashing; see the log above")

    def _spawn(self, index: int) -> None:
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                _die_with_parent()
                # Worker 0 alone counts reloads: every worker reloads each change.
                uvloop.run(serve_socket(self.options, self.sock, self.metrics_dir,
                                        counting=index == 0, fallback=self.fallback))
                code = 0
            except BaseException:
                log.exception("worker failed", extra={"worker": index})
            finally:
                asynclog.stop()  # os._exit skips atexit: write out queued log lines
                os._exit(code)
        self.workers[pid] = index

    def _on_signal(self, sig: int, _frame: FrameType | None) -> None:
        if not self.stopping:
            log.info("stopping workers", extra={"signal": signal.Signals(sig).name})
        self.stopping = True
        # The parent's copy of the listener must go too, or the port would keep
        # accepting (into a backlog nobody serves) after the workers closed theirs.
        self.sock.close()
        for pid in list(self.workers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)  # a second signal makes workers stop at once

    def _supervise(self) -> None:
        while self.workers:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            index = self.workers.pop(pid, None)
            if index is None:
                continue
            multiprocess.mark_process_dead(pid, str(self.metrics_dir))  # type: ignore[no-untyped-call]
            code = os.waitstatus_to_exitcode(status)
            if self.stopping:
                log.info("worker stopped", extra={"worker": index, "pid": pid, "code": code})
                continue
            log.error("worker exited unexpectedly; restarting",
                      extra={"worker": index, "pid": pid, "code": code})
            now = time.monotonic()
            self.exits = [t for t in self.exits if now - t < RESTART_WINDOW] + [now]
            if len(self.exits) > MAX_RESTARTS:
                self.failed = True
                self._on_signal(signal.SIGTERM, None)
                continue
            time.sleep(min(1.0, 0.1 * len(self.exits)))
            if not self.stopping:
                self._refresh_fallback()
                self._spawn(index)

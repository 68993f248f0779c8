"""Hot reload of the policy and the serving certificate.

Kubernetes updates mounted ConfigMaps and Secrets by swapping a ``..data`` symlink, so
the *directories* holding the files are watched (a watch on the file itself would stay
on the old inode). Every event re-reads the files and compares content, which makes
spurious events harmless; a slow periodic re-check covers filesystems without inotify.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path

import watchfiles

from webhook.policy import Policy, PolicyError, default_policy, load_policy
from webhook.server.logs import get_logger
from webhook.server.metrics import Metrics
from webhook.server.tls import CertificateError, CertificateStore

log = get_logger("reload")


class PolicyStore:
    """The policy in use. Swapping one reference keeps in-flight requests consistent."""

    def __init__(self, path: Path | None, metrics: Metrics) -> None:
        self.path = path
        self.metrics = metrics
        self._digest = ""
        self.policy: Policy = default_policy() if path is None else self._read()
        metrics.policy_profiles.set(len(self.policy.profiles))

    def _read(self) -> Policy:
        assert self.path is not None
        data = self.path.read_bytes() if self.path.exists() else b""
        policy = load_policy(self.path)
        self._digest = hashlib.sha256(data).hexdigest()
        return policy

    def reload(self) -> bool:
        """Re-read the file if it changed; a bad file keeps the last good policy."""
        if self.path is None:
            return False
        try:
            digest = hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError as exc:
            digest = f"unreadable: {exc}"
        if digest == self._digest:
            return False
        try:
            policy = load_policy(self.path)
        except PolicyError as exc:
            self._digest = digest  # report a bad file once, not on every event
            self.metrics.policy_reloads.labels("failure").inc()
            log.error("policy reload refused, keeping the last good policy",
                      extra={"path": str(self.path), "errors": exc.errors})
            return False
        self._digest = digest
        self.policy = policy
        self.metrics.policy_reloads.labels("success").inc()
        self.metrics.policy_profiles.set(len(policy.profiles))
        log.info("policy reloaded", extra={"path": str(self.path),
                                            "profiles": sorted(policy.profiles)})
        return True


def reload_certificate(store: CertificateStore, metrics: Metrics) -> bool:
    """Serve changed certificate files; unusable ones are refused and reported once."""
    failing = store.failing
    try:
        changed = store.reload()
    except CertificateError as exc:
        if not failing:
            metrics.certificate_reloads.labels("failure").inc()
            log.error("certificate reload refused, keeping the current one",
                      extra={"error": str(exc)})
        return False
    if changed:
        metrics.certificate_reloads.labels("success").inc()
        metrics.certificate_expiry.set(store.current.not_after.timestamp())
        log.info("certificate reloaded",
                 extra={"cert": str(store.cert_path),
                        "not_after": store.current.not_after.isoformat()})
    return changed


async def watch(
    paths: list[Path], on_change: Callable[[], None], stop: asyncio.Event,
    poll_seconds: float = 30.0,
) -> None:
    """Call ``on_change`` when anything in the directories of ``paths`` changes."""
    # The mount directory, not the symlink target: the target is replaced on update.
    directories = sorted({str(path.absolute().parent) for path in paths})

    async def poll() -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), poll_seconds)
            except TimeoutError:
                on_change()

    poller = asyncio.create_task(poll())
    try:
        async for _changes in watchfiles.awatch(
            *directories, stop_event=stop, debounce=50, step=20, recursive=False
        ):
            on_change()
    finally:
        poller.cancel()

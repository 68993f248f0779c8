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

from webhook.policy import Policy, PolicyError, default_policy, parse_policy_bytes
from webhook.server.logs import get_logger
from webhook.server.metrics import Metrics
from webhook.server.tls import CertificateError, CertificateStore

log = get_logger("reload")


class PolicyStore:
    """The policy in use. Swapping one reference keeps in-flight requests consistent.

    Each load reads the file once and parses those same bytes, so the digest that
    decides "changed?" always belongs to the policy it describes.
    """

    def __init__(self, path: Path | None, metrics: Metrics) -> None:
        self.path = path
        self.metrics = metrics
        self._digest = ""
        self.policy: Policy = default_policy()
        if path is not None:  # a bad file at start-up is an error (PolicyError)
            self._digest, data = self._read()
            self.policy = self._parse(self._digest, data)
        metrics.policy_profiles.set(len(self.policy.profiles))

    def _read(self) -> tuple[str, bytes | None]:
        """(digest, content); an unreadable file has a digest of its error and no content."""
        assert self.path is not None
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            return f"unreadable: {exc}", None
        return hashlib.sha256(data).hexdigest(), data

    def _parse(self, digest: str, data: bytes | None) -> Policy:
        if data is None:
            raise PolicyError(str(self.path), [f"(file): {digest}"])
        return parse_policy_bytes(data, str(self.path))

    def reload(self) -> bool:
        """Re-read the file if it changed; a bad file keeps the last good policy."""
        if self.path is None:
            return False
        digest, data = self._read()
        if digest == self._digest:
            return False
        self._digest = digest  # report a bad file once, not on every event
        try:
            policy = self._parse(digest, data)
        except PolicyError as exc:
            self.metrics.policy_reloads.labels("failure").inc()
            log.error("policy reload refused, keeping the last good policy",
                      extra={"path": str(self.path), "errors": exc.errors})
            return False
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

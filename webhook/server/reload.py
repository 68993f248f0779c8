"""Hot reload of the policy, the serving certificate and the client CA.

Kubernetes updates mounted ConfigMaps and Secrets by swapping a ``..data`` symlink, so
the *directories* holding the files are watched (a watch on the file itself would stay
on the old inode). Only events that can change what a watched path reads wake the
reload: the watched names themselves, the ``..data`` swap, and the directory itself
(deleted or replaced). Anything else written in the directory (a log file, another
tool's state) is filtered out where the events arrive and never reaches it. A reload then
reads the files and compares their raw bytes with those in use before it parses anything,
which makes a spurious event cost a few small reads; a slow periodic re-check covers
filesystems without inotify.

The rule (README "Operations"): whatever appears at a watched path (bad content, a
partial write, a deleted or replaced directory, a FIFO, an unreadable file), the file is
refused, logged and counted, the last good policy or certificate stays in use, and
watching goes on. A watcher that still fails unexpectedly is restarted by
:func:`supervise`, which logs and counts it (``swapwise_watcher_restarts_total``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import watchfiles

from webhook.base.files import read_regular
from webhook.base.logs import get_logger
from webhook.policy import (
    MAX_FILE_BYTES,
    Policy,
    PolicyError,
    default_policy,
    parse_policy_bytes,
)
from webhook.server.metrics import Metrics
from webhook.server.tls import CertificateError, CertificateStore

log = get_logger("reload")


class PolicyStore:
    """The policy in use. Swapping one reference keeps in-flight requests consistent.

    Each load reads the file once, compares its raw bytes with those of the policy in use
    and parses them only if they differ, so what decides "changed?" always belongs to the
    policy it describes. ``counting`` is False
    in all but one of ``--workers`` processes, so that one change counts once.
    ``fallback``: start with this policy (and report the file) instead of failing when
    the file is bad at start-up; a restarted worker gets the last policy its supervisor
    could load.
    """

    def __init__(self, path: Path | None, metrics: Metrics, *, counting: bool = True,
                 fallback: Policy | None = None) -> None:
        self.path = path
        self.metrics = metrics
        self.counting = counting
        self._seen: bytes | str = ""  # the bytes last read, or why they could not be
        self.policy: Policy = default_policy()
        if path is not None:  # a bad file at start-up is an error (PolicyError)
            self._seen = self._read()
            try:
                self.policy = self._parse(self._seen)
            except PolicyError as exc:
                if fallback is None:
                    raise
                self.policy = fallback
                self._refused(exc)
        metrics.policy_profiles.set(len(self.policy.profiles))

    def _read(self) -> bytes | str:
        """The file's bytes; for an unreadable file, why (a string)."""
        assert self.path is not None
        try:
            return read_regular(self.path, MAX_FILE_BYTES)
        except OSError as exc:
            return f"unreadable: {exc}"

    def _parse(self, seen: bytes | str) -> Policy:
        if isinstance(seen, str):
            raise PolicyError(str(self.path), [f"(file): {seen}"])
        return parse_policy_bytes(seen, str(self.path))

    def _refused(self, exc: PolicyError) -> None:
        if self.counting:
            self.metrics.policy_reloads.labels("failure").inc()
        log.error("policy reload refused, keeping the last good policy",
                  extra={"path": str(self.path), "errors": exc.errors,
                         "policy": self.policy.source})

    def reload(self) -> bool:
        """Re-read the file if it changed; a bad file keeps the last good policy.

        Never raises: whatever is at the path is either a policy or a refusal.
        """
        if self.path is None:
            return False
        seen = self._read()
        if seen == self._seen:  # raw bytes (or the same error): nothing parsed
            return False
        self._seen = seen  # report a bad file once, not on every event
        try:
            policy = self._parse(seen)
        except PolicyError as exc:
            self._refused(exc)
            return False
        except Exception as exc:  # parse_policy raises only PolicyError; a bug must not
            self._refused(PolicyError(str(self.path), [f"(bug) {exc!r}"]))  # stop reloads
            log.exception("unexpected error reading the policy")
            return False
        self.policy = policy
        if self.counting:
            self.metrics.policy_reloads.labels("success").inc()
        self.metrics.policy_profiles.set(len(policy.profiles))
        log.info("policy reloaded", extra={"path": str(self.path),
                                            "profiles": sorted(policy.profiles)})
        return True


def reload_certificate(store: CertificateStore, metrics: Metrics, counting: bool = True) -> bool:
    """Serve changed certificate files; unusable ones are refused and reported once.

    Never raises: an unexpected error is a refusal too.
    """
    failing = store.failing
    try:
        changed = store.reload()
    except Exception as exc:
        store.failing = True
        if not failing:
            if counting:
                metrics.certificate_reloads.labels("failure").inc()
            log.error("certificate reload refused, keeping the current one",
                      extra={"error": str(exc), "bug": not isinstance(exc, CertificateError),
                             "not_after": store.current.not_after.isoformat()})
        return False
    if changed:
        if counting:
            metrics.certificate_reloads.labels("success").inc()
        metrics.certificate_expiry.set(store.current.not_after.timestamp())
        log.info("certificate reloaded",
                 extra={"cert": str(store.cert_path),
                        "not_after": store.current.not_after.isoformat()})
    return changed


def _identity(directory: str) -> tuple[int, int] | None:
    """(device, inode) of a directory; None when it is missing or not a directory."""
    try:
        info = os.stat(directory)
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if os.path.isdir(directory) else None


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def watch(
    paths: list[Path], on_change: Callable[[], None], stop: asyncio.Event,
    poll_seconds: float = 30.0, missing_poll_seconds: float = 1.0,
) -> None:
    """Call ``on_change`` when one of ``paths`` may have changed (see the top), and every
    ``poll_seconds`` regardless.

    A watch is tied to a directory's inode: when a watched directory is deleted,
    recreated or replaced by a file, the watch is set up again, and while it is
    missing the files are polled every ``missing_poll_seconds``.
    """
    # The mount directory, not the symlink target: the target is replaced on update.
    directories = sorted({str(path.absolute().parent) for path in paths})
    relevant = {str(path.absolute()) for path in paths} | set(directories)
    relevant |= {os.path.join(directory, "..data") for directory in directories}

    def may_change(_change: watchfiles.Change, path: str) -> bool:
        return path in relevant

    while not stop.is_set():
        identities = [_identity(d) for d in directories]
        if None in identities:
            on_change()  # reports the missing files (once) and keeps the last good ones
            await _sleep(stop, missing_poll_seconds)
            continue
        if identities != [_identity(d) for d in directories]:
            continue
        on_change()  # what changed while no watch was set up (harmless otherwise: digests)
        async for _changes in watchfiles.awatch(
            *directories, watch_filter=may_change, stop_event=stop, debounce=50, step=20,
            recursive=False,
            rust_timeout=int(poll_seconds * 1000), yield_on_timeout=True,
        ):
            on_change()  # an empty set of changes is the periodic re-check
            if [_identity(d) for d in directories] != identities:
                break  # a directory went away or was replaced: watch the new one


async def supervise(
    name: str, start: Callable[[], Awaitable[None]], stop: asyncio.Event, metrics: Metrics,
    max_backoff: float = 5.0,
) -> None:
    """Run ``start()`` until ``stop`` is set; restart it (logged and counted) when it fails
    or ends early, with a growing pause so that a persistent fault does not spin."""
    backoff = 0.1
    while not stop.is_set():
        try:
            await start()
            if stop.is_set():
                return
            raise RuntimeError(f"{name} watcher ended unexpectedly")
        except asyncio.CancelledError:
            raise
        except Exception:
            metrics.watcher_restarts.labels(name).inc()
            log.exception("watcher failed; restarting it", extra={"watcher": name,
                                                                 "in_seconds": backoff})
        await _sleep(stop, backoff)
        backoff = min(max_backoff, backoff * 2)

"""When to ask a kubelet for its configuration again, and what it last answered.

``--swap-behavior-source kubelet`` reads each swap node's ``swapBehavior`` through the API
server's node proxy (``/configz``). That is a request through to every kubelet, so answers
are cached per node and read again only when they may have changed: on every resync, after
``--kubelet-config-ttl`` seconds, and when the Node shows signs of a restarted kubelet or
machine. A failed read is retried with backoff, not on every node event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.labeller.labels import as_mapping

Fingerprint = tuple[str, ...]


def fingerprint(node: Mapping[str, Any]) -> Fingerprint:
    """Node fields that change when its kubelet (or machine) restarts, read for free.

    The kubelet configuration is only re-read at kubelet start, so a change in these says
    "ask again": the boot ID (reboot), the kubelet version (upgrade), the swap capacity,
    and the Ready condition's transition time (a kubelet that was down and came back).
    A quick restart that keeps Ready true shows in none of them: the TTL and the resync
    catch that.
    """
    status = as_mapping(node.get("status"))
    info = as_mapping(status.get("nodeInfo"))
    conditions = status.get("conditions")
    ready: Mapping[str, Any] = next(
        (as_mapping(c) for c in conditions if as_mapping(c).get("type") == "Ready"), {}
    ) if isinstance(conditions, list) else {}
    return (
        str(info.get("bootID", "")),
        str(info.get("kubeletVersion", "")),
        str(as_mapping(info.get("swap")).get("capacity", "")),
        str(ready.get("lastTransitionTime", "")),
    )


@dataclass
class _Entry:
    behavior: str | None  # None: the last read failed
    error: str
    fingerprint: Fingerprint
    read_at: float
    failures: int = 0
    retry_at: float = 0.0
    stale: bool = False


class KubeletConfigCache:
    """Per node: the last ``swapBehavior`` read (or the error), and whether it is due again."""

    def __init__(self, ttl: float, backoff_min: float = 1.0, backoff_max: float = 60.0) -> None:
        self.ttl = ttl
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self._entries: dict[str, _Entry] = {}

    def due(self, name: str, node: Mapping[str, Any], now: float) -> bool:
        """Must the kubelet of ``node`` be asked (again) before judging it?"""
        entry = self._entries.get(name)
        if entry is None or entry.fingerprint != fingerprint(node):
            return True
        if entry.behavior is None:  # failed: wait out the backoff, resync or not
            return now >= entry.retry_at
        return entry.stale or now - entry.read_at >= self.ttl

    def answered(self, name: str, node: Mapping[str, Any], behavior: str, now: float) -> None:
        self._entries[name] = _Entry(behavior, "", fingerprint(node), now)

    def failed(self, name: str, node: Mapping[str, Any], error: str, now: float) -> float:
        """Record a failed read; return the seconds until the next try."""
        old = self._entries.get(name)
        failures = (old.failures if old is not None else 0) + 1
        delay = min(self.backoff_min * 2.0 ** min(failures - 1, 30), self.backoff_max)
        self._entries[name] = _Entry(None, error, fingerprint(node), now, failures, now + delay)
        return delay

    def known(self, name: str) -> tuple[str | None, str]:
        """The behaviour last read (None if never read or the last read failed) and the error."""
        entry = self._entries.get(name)
        if entry is None:
            return None, "not read yet"
        return entry.behavior, entry.error

    def expire_all(self) -> None:
        """Resync: every answer is read again the next time its node is judged."""
        for entry in self._entries.values():
            entry.stale = True

    def retain(self, names: set[str]) -> None:
        """Forget nodes that are gone (after a fresh list)."""
        for name in set(self._entries) - names:
            del self._entries[name]

    def forget(self, name: str) -> None:
        """A node was deleted."""
        self._entries.pop(name, None)

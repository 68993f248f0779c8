"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go does it.

Two replicas must never both patch Nodes. The rules, kept pure in :func:`claim` and
:class:`Observation`:

- a candidate may take the Lease when nobody holds it, or when the holder's record has
  not changed for ``leaseDurationSeconds`` *as measured on the candidate's own monotonic
  clock* from the moment it first saw that record (so clock skew between machines does
  not matter, only clock rate);
- writes carry the ``resourceVersion`` they were based on, so of two candidates racing
  for the same record exactly one wins (the other gets 409 Conflict);
- a leader that has not renewed for ``renew_deadline`` (< lease duration) stops acting
  at once, before anyone else can have seen its Lease expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Protocol

from webhook.base.logs import get_logger

log = get_logger("labeller.lease")


class Conflict(Exception):
    """The Lease changed (or appeared) since it was read: another candidate wrote first."""


@dataclass(frozen=True)
class Timing:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration"
            )


@dataclass(frozen=True)
class LeaseRecord:
    holder: str  # "" once released
    duration: int  # leaseDurationSeconds
    acquire_time: dt.datetime | None
    renew_time: dt.datetime | None
    transitions: int
    resource_version: str | None = None  # of the object it was read from

    def same_as(self, other: LeaseRecord) -> bool:
        """Same holder state, whatever resourceVersion: did the holder renew?"""
        return replace(self, resource_version=None) == replace(other, resource_version=None)


def micro_now() -> dt.datetime:
    """Now, as a Lease MicroTime can carry it.

    The API server parses MicroTime with exactly six fractional digits; a datetime with
    microsecond 0 serializes without them and would be refused.
    """
    now = dt.datetime.now(dt.UTC)
    return now if now.microsecond else now.replace(microsecond=1)


def claim(
    current: LeaseRecord | None, identity: str, now: dt.datetime, duration: int, expired: bool
) -> LeaseRecord | None:
    """The record to write to hold the Lease, or None while someone else validly holds it."""
    if current is None:
        return LeaseRecord(identity, duration, now, now, 0)
    if current.holder and current.holder != identity and not expired:
        return None
    if current.holder == identity:
        return replace(current, duration=duration, renew_time=now)
    return LeaseRecord(identity, duration, now, now, current.transitions + 1,
                       current.resource_version)


def released(current: LeaseRecord, now: dt.datetime) -> LeaseRecord:
    """The record a leader writes on shutdown so a successor need not wait for expiry."""
    return LeaseRecord("", 1, now, now, current.transitions, current.resource_version)


@dataclass
class Observation:
    """The last Lease record seen and when (monotonic), to judge expiry locally."""

    record: LeaseRecord | None = None
    seen_at: float = 0.0

    def observe(self, record: LeaseRecord, now: float) -> None:
        if self.record is None or not self.record.same_as(record):
            self.seen_at = now
        self.record = record

    def expired(self, now: float) -> bool:
        if self.record is None:
            return True
        return now > self.seen_at + self.record.duration


class LeaseStore(Protocol):
    """The Lease object, read and written with optimistic concurrency."""

    async def get(self) -> LeaseRecord | None: ...

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        """Raises :class:`Conflict` when it already exists."""
        ...

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        """Write based on ``record.resource_version``; raises :class:`Conflict` if stale."""
        ...


class Attempt(Enum):
    HELD = "held"  # we hold the Lease now
    OTHER = "other"  # someone else validly holds it
    FAILED = "failed"  # could not tell: API error or lost a race


@dataclass
class Elector:
    """Acquires and renews the Lease; ``leading()`` says whether to act right now."""

    store: LeaseStore
    identity: str
    timing: Timing
    on_change: Callable[[bool], None] = lambda _leading: None
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], dt.datetime] = micro_now
    observation: Observation = field(default_factory=Observation)
    renewed_at: float | None = None  # monotonic time of our last successful write
    _leader: bool = field(default=False, init=False)

    def leading(self) -> bool:
        """True only while our last renewal is younger than the renew deadline."""
        return (
            self._leader
            and self.renewed_at is not None
            and self.clock() - self.renewed_at < self.timing.renew_deadline
        )

    async def attempt(self) -> Attempt:
        """One try to acquire or renew."""
        try:
            current = await self.store.get()
            now = self.clock()
            if current is not None:
                self.observation.observe(current, now)
            record = claim(current, self.identity, self.wall(),
                           max(1, round(self.timing.lease_duration)),
                           self.observation.expired(now))
            if record is None:
                return Attempt.OTHER
            if current is None:
                written = await self.store.create(record)
            else:
                written = await self.store.update(record)
        except Conflict:
            return Attempt.FAILED
        except Exception as exc:  # the API server is down or refuses: retried next period
            log.warning("lease attempt failed", extra={"error": str(exc)})
            return Attempt.FAILED
        self.renewed_at = self.clock()
        self.observation.observe(written, self.renewed_at)
        return Attempt.HELD

    def _set(self, leader: bool) -> None:
        if leader != self._leader:
            self._leader = leader
            log.info("became leader" if leader else "stopped leading",
                     extra={"identity": self.identity})
            self.on_change(leader)

    async def step(self) -> None:
        """One period of the loop: try, then update leadership."""
        result = await self.attempt()
        if result is Attempt.HELD:
            self._set(True)
        elif result is Attempt.OTHER or not self.leading():
            self._set(False)

    async def run(self, stop: asyncio.Event) -> None:
        """Try every retry period until ``stop``; then release the Lease if we hold it."""
        while not stop.is_set():
            await self.step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.timing.retry_period)
        await self.release()

    async def release(self) -> None:
        was_leading = self.leading()
        self._set(False)
        record = self.observation.record
        if not was_leading or record is None or record.holder != self.identity:
            return
        try:
            await self.store.update(released(record, self.wall()))
            log.info("released lease", extra={"identity": self.identity})
        except Exception as exc:  # the successor then waits for expiry: slower, still safe
            log.warning("could not release lease", extra={"error": str(exc)})

"""Safety rules for what swapwise *calls*: the Kubernetes API, Prometheus, a kubelet.

Those upstreams misbehave in ways a client must survive without help: an answer that drips
one byte every few seconds, a list whose ``continue`` token never changes, a gzip bomb, an
API server that closes every request at once while it shuts down. They also carry strings
that anyone who can create a pod chooses (annotations, label values, error messages).

Each rule is one small piece here, free of any HTTP or Kubernetes client, so ``audit``,
``tune`` and the node agent apply the same ones:

- :class:`Deadline`: one time limit for a whole operation (every request, retry and page of
  it), not for each socket read: a drip never times out a read, so only a whole-operation
  limit binds.
- :class:`Backoff`: the delay before a retry, growing with each failure and reset only after
  progress, and a report of what is retried and why. Thousands of clients retrying at once
  is a denial of service on the API server; a retry loop that resets on every success (or
  never waits) becomes one.
- :class:`Pages`: a list's pages, stopped on a ``continue`` token seen before or past a cap.
- :class:`BodyLimit`: the bytes of a body counted as they stream, after decompression, so a
  small compressed answer cannot grow past the limit in memory before it is judged.
- :func:`shown` and :func:`comment`: an outside string made safe for a terminal (no escape
  sequence, no line break, bounded length) and for a YAML comment (it can never end the
  comment and become live YAML).
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import AsyncIterable, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")
LOG = logging.getLogger("swapwise.upstream")


# ----------------------------------------------------------------------------- deadline


class DeadlineExceeded(Exception):
    """The whole operation ran out of time (the message names it and the limit)."""


@dataclass
class Deadline:
    """A time limit for a whole operation, on the monotonic clock.

    Every step of the operation asks :meth:`remaining` (and waits at most that long), so the
    limit binds however the time is spent: connecting, a read that drips, retries, pages.
    """

    seconds: float
    what: str = "the operation"
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=-1.0)

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ValueError(f"a deadline must be positive, not {self.seconds!r}")
        if self.started < 0:
            self.started = self.clock()

    def remaining(self) -> float:
        """Seconds left, never below 0."""
        return max(0.0, self.started + self.seconds - self.clock())

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0

    def error(self, doing: str | None = None) -> DeadlineExceeded:
        """The exception to raise when the limit is reached, saying what was being done."""
        where = f" ({doing})" if doing else ""
        return DeadlineExceeded(f"{self.what} did not finish within {self.seconds:g} s{where}")

    def check(self, doing: str | None = None) -> None:
        if self.expired:
            raise self.error(doing)

    async def run(self, awaitable: Awaitable[T], doing: str | None = None) -> T:
        """``awaitable``, cancelled when the deadline passes (then :class:`DeadlineExceeded`).

        Cancelling is what makes the limit bind on a read that receives a byte now and then:
        no per-read timeout of an HTTP client would ever fire on it.
        """
        try:
            async with asyncio.timeout(self.remaining()):
                return await awaitable
        except TimeoutError:
            raise self.error(doing) from None


# ----------------------------------------------------------------------------- backoff


@dataclass
class Backoff:
    """Delays between retries: ``initial`` doubled per failure up to ``maximum``, with jitter.

    Only :meth:`progressed` resets it, and callers call that when something was gained (a
    page read, an event received), not when a request merely succeeded: a watch that the
    server answers and closes at once "succeeds" every time and must still slow down. Each
    retry is reported (``report``, a log line by default) with what is retried and why, so a
    loop is never silent.
    """

    initial: float = 0.5
    maximum: float = 30.0
    jitter: float = 0.2  # each delay is spread by up to this share, so clients do not align
    report: Callable[[str], None] = LOG.warning
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0

    def delay(self) -> float:
        """The delay after the failures so far, before jitter."""
        if self.failures <= 0:
            return 0.0
        return float(min(self.maximum, self.initial * 2 ** min(self.failures - 1, 62)))

    def failed(self, what: str, why: str, at_least: float = 0.0) -> float:
        """Count a failure of ``what`` and report it; returns the seconds to wait before
        retrying (``at_least``: a server's Retry-After, still capped by ``maximum``)."""
        self.failures += 1
        base = max(self.delay(), min(max(at_least, 0.0), self.maximum))
        wait = base * (1 + self.jitter * (2 * self.rng.random() - 1))
        self.report(f"retrying {shown(what)} in {wait:.1f} s (failure {self.failures} in a "
                    f"row): {shown(why)}")
        return wait

    def progressed(self) -> None:
        """Something was gained since the last failure: the next one starts from ``initial``."""
        self.failures = 0


# ----------------------------------------------------------------------------- pages


class PagingError(Exception):
    """A paged list that would not end: a token repeated, or more pages than the cap."""


@dataclass
class Pages:
    """The ``continue`` tokens of one paged list.

    A server (or a proxy caching one answer) that returns the same token again would make a
    client page forever; so would one that never stops handing out new ones. A token seen
    before and the page cap both end the list with :class:`PagingError`.
    """

    what: str
    limit: int = 1000
    count: int = 0
    seen: set[str] = field(default_factory=set)

    def next(self, token: str | None) -> str | None:
        """After a page: the token to ask the next page with, or None when the list is
        complete (no token)."""
        self.count += 1
        if not token:
            return None
        if token in self.seen:
            raise PagingError(f"{self.what}: the server returned a continue token it had "
                              f"returned before (page {self.count}): it would never end")
        if self.count >= self.limit:
            raise PagingError(f"{self.what}: more than {self.limit} pages: stopped")
        self.seen.add(token)
        return token

    def restart(self) -> None:
        """The list starts again from its first page (an expired token): the pages read so
        far still count toward the cap, so restarts cannot go on forever either."""
        self.seen.clear()


# ----------------------------------------------------------------------------- bodies


class BodyTooLarge(Exception):
    """A body grew past its limit while it was read."""


@dataclass
class BodyLimit:
    """Counts a body's bytes as they arrive, after decompression.

    A limit checked on the whole body is checked too late: a 512 KiB gzip answer is 1 GB in
    memory once decompressed. Fed the decoded chunks one by one (an HTTP client decodes in
    bounded pieces), this stops the read at the limit.
    """

    limit: int
    what: str = "the answer"
    received: int = 0

    def count(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self.received > self.limit:
            raise BodyTooLarge(f"{self.what} is larger than {readable_size(self.limit)}")

    async def read(self, chunks: AsyncIterable[bytes]) -> bytes:
        """Every chunk of ``chunks`` joined, stopping at the limit."""
        body = bytearray()
        async for chunk in chunks:
            self.count(chunk)
            body += chunk
        return bytes(body)


def readable_size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} bytes"


# ----------------------------------------------------------------------------- strings

# What a terminal acts on or a reader cannot see: C0 controls (escape sequences start with
# ESC; a newline starts a line that looks like ours), DEL, C1 controls (0x9b is a one-byte
# CSI on some terminals, 0x85 a YAML line break), the Unicode line and paragraph separators
# (line breaks to YAML too), and the bidirectional overrides that reorder what is shown.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# The line breaks YAML (1.1, as PyYAML reads it) knows: none may be in a comment.
YAML_BREAKS = "\r\n\x85\u2028\u2029"
SHOWN_CHARACTERS = 300  # enough for any name the API server accepts, and a long message


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: object, limit: int = SHOWN_CHARACTERS) -> str:
    """``text`` (any value, as ``str()`` of it) safe to print on a terminal: every control
    character escaped as ``\\xNN`` or ``\\uNNNN``, so it is one line that moves no cursor, sets
    no title and clears nothing; and at most ``limit`` characters, with how many were left
    out (an annotation may hold 256 KiB)."""
    value = text if isinstance(text, str) else _str(text)
    cut = ""
    if len(value) > limit:
        cut = f"...({len(value) - limit} more characters)"
        value = value[:limit]
    return _UNSAFE.sub(_escape, value) + cut


def _str(value: object) -> str:
    try:
        return str(value)
    except (RecursionError, ValueError):  # a deep structure; an int past str()'s digit limit
        return f"<a {type(value).__name__} that cannot be shown>"


def comment(text: object, limit: int = 2000) -> str:
    """``text`` as one YAML comment line (``# ...``): it can never end the comment, so what a
    pod annotation carries never becomes live YAML in a file users are told to merge."""
    line = "# " + shown(text, limit)
    if any(c in line for c in YAML_BREAKS):  # shown() escapes them all: a guard, not a path
        raise ValueError("a YAML comment with a line break")
    return line

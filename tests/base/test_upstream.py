"""webhook.base.upstream: the rules every call to an upstream follows, each on its own."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest
import yaml

from webhook.base.upstream import (
    Backoff,
    BodyLimit,
    BodyTooLarge,
    Deadline,
    DeadlineExceeded,
    Pages,
    PagingError,
    comment,
    shown,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_deadline_counts_from_its_start_and_names_what_ran_out() -> None:
    clock = Clock()
    deadline = Deadline(10, "listing Pods", clock=clock)
    clock.now += 4
    assert deadline.remaining() == 6 and not deadline.expired
    clock.now += 7
    assert deadline.remaining() == 0 and deadline.expired
    with pytest.raises(DeadlineExceeded, match=r"listing Pods did not finish within 10 s "
                                               r"\(page 3\)"):
        deadline.check("page 3")
    with pytest.raises(ValueError):
        Deadline(0)


def test_a_deadline_cancels_an_awaitable_that_keeps_receiving_something() -> None:
    """A drip: each step is quick, so only a limit on the whole binds."""
    steps = 0

    async def drip() -> None:
        nonlocal steps
        while True:
            steps += 1
            await asyncio.sleep(0.01)

    async def main() -> None:
        await Deadline(0.3, "reading").run(drip(), "a drip")

    with pytest.raises(DeadlineExceeded, match=r"reading did not finish within 0.3 s"):
        asyncio.run(main())
    assert steps > 1


def test_backoff_grows_reports_each_retry_and_resets_only_after_progress() -> None:
    said: list[str] = []
    backoff = Backoff(initial=0.5, maximum=4, jitter=0, report=said.append)
    waits = [backoff.failed("list Pods", "HTTP 503") for _ in range(6)]
    assert waits == [0.5, 1, 2, 4, 4, 4]
    assert said[0] == "retrying list Pods in 0.5 s (failure 1 in a row): HTTP 503"
    assert len(said) == 6
    backoff.progressed()
    assert backoff.failed("list Pods", "again") == 0.5
    # A Retry-After longer than the backoff is honoured, within the maximum.
    assert backoff.failed("x", "429", at_least=3) == 3
    assert backoff.failed("x", "429", at_least=3600) == 4


def test_backoff_jitter_stays_within_its_share() -> None:
    backoff = Backoff(initial=1, maximum=1, jitter=0.2, report=lambda _: None,
                      rng=random.Random(7))
    waits = [backoff.failed("x", "y") for _ in range(200)]
    assert min(waits) >= 0.8 and max(waits) <= 1.2 and len(set(waits)) > 100


def test_backoff_reports_outside_strings_escaped() -> None:
    said: list[str] = []
    Backoff(jitter=0, report=said.append).failed("list", "\x1b[2Jgone\nfake line")
    assert said == ["retrying list in 0.5 s (failure 1 in a row): \\x1b[2Jgone\\x0afake line"]


def test_pages_end_on_a_repeated_token_and_at_the_cap() -> None:
    pages = Pages("Pods", limit=100)
    assert pages.next("a") == "a"
    assert pages.next("b") == "b"
    with pytest.raises(PagingError, match="continue token it had returned before"):
        pages.next("a")
    capped = Pages("Nodes", limit=3)
    assert capped.next("1") == "1" and capped.next("2") == "2"
    with pytest.raises(PagingError, match="more than 3 pages"):
        capped.next("3")
    done = Pages("x")
    assert done.next(None) is None and done.next("") is None


def test_pages_restarted_still_count_toward_the_cap() -> None:
    pages = Pages("Pods", limit=4)
    pages.next("a")
    pages.next("b")
    pages.restart()
    assert pages.next("a") == "a"  # the first token of the new listing is not a repeat
    with pytest.raises(PagingError, match="more than 4 pages"):
        pages.next("c")


def test_a_body_is_stopped_at_its_limit_as_it_streams() -> None:
    received: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(1000):
            received.append(1)
            yield b"x" * 1024

    async def main() -> bytes:
        return await BodyLimit(10 * 1024, "Prometheus' answer").read(chunks())

    with pytest.raises(BodyTooLarge, match="Prometheus' answer is larger than 10 KiB"):
        asyncio.run(main())
    assert len(received) == 11  # it stopped reading at the chunk that crossed the limit
    limit = BodyLimit(3)
    limit.count(b"abc")
    assert limit.received == 3


@pytest.mark.parametrize(("text", "expected"), [
    ("plain-name", "plain-name"),
    ("\x1b]0;pwned\x07\x1b[2J", "\\x1b]0;pwned\\x07\\x1b[2J"),
    ("a\nb\rc\td", "a\\x0ab\\x0dc\\x09d"),
    ("\x9b31m \x85 \u2028 \u2029", "\\x9b31m \\x85 \\u2028 \\u2029"),
    ("abc\u202edcba", "abc\\u202edcba"),
    ("ünïcödé ✓", "ünïcödé ✓"),
])
def test_shown_escapes_every_control_character(text: str, expected: str) -> None:
    assert shown(text) == expected


def test_shown_bounds_length_and_shows_anything() -> None:
    assert shown("x" * 400, 10) == "x" * 10 + "...(390 more characters)"
    deep: list[object] = []
    for _ in range(100000):
        deep = [deep]
    assert shown(deep) == "<a list that cannot be shown>"
    assert shown(42) == "42"


def test_a_comment_never_ends_early() -> None:
    evil = "calm\nprofiles: {default: {swapRatio: 50}}\n\x85x: 1\u2028y: 2"
    text = "profiles: {}\n" + comment(evil) + "\n"
    assert yaml.safe_load(text) == {"profiles": {}}
    assert len(text.splitlines()) == 2

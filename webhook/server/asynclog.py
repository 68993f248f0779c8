"""Log lines leave the event loop through a queue; a thread writes them, in batches.

Every admission logs one JSON line. Written from the event loop, each line is a
``write(2)`` that usually takes microseconds, but blocks for milliseconds whenever the
file or pipe behind stderr stalls (page-cache writeback, a slow log collector): every
request queued behind it waits too. At a high admission rate on one worker, that decided
the p99 (the figures with lines written in the loop and queued: BENCHMARKS.md).

The writer thread should not wake per line either. It used to (a ``QueueListener``
blocked on the queue): every admission woke it, it then waited for the GIL, got it the
next time the event loop released it (in ``SSLObject.write``, sending the response) and
formatted the record while the loop waited to get the GIL back. That hand-off was over a
third of what ``SSLObject.write`` cost under load (BENCHMARKS.md). Now the admission line
is formatted on the loop (:func:`info`, a few microseconds: no LogRecord, no handler
calls) and held in a deque there; a loop timer moves what gathered to the queue every
:data:`BATCH_SECONDS`, so the thread wakes once per batch and holds the GIL only to join
and write. Other records go to the queue at once, as before, after any lines held: the
output keeps the order in which things were logged. (Measured on a quiet machine, p99 at a
fixed 1,000 admissions/s did not get worse; on a CPU shared with busy processes the server
waited longer for it: BENCHMARKS.md.)

At low rates even that hand-off is most of what a line costs: a batch of one or two lines
still woke the writer thread (a futex, two context switches, a GIL hand-off). So when there
is little to write, the event loop writes the lines itself, in one ``write(2)``, from a
loop timer :data:`DIRECT_SECONDS` after the first of them: when the writer thread has
nothing queued (so the order holds), at most :data:`DIRECT_BYTES` gathered, the output is
a pipe with room for them or something else whose last direct write did not stall, and no
direct write stalled (took over :data:`STALL_SECONDS`) in the last :data:`STALL_BACKOFF`
seconds. A pipe with room cannot block a write; a file in the page cache rarely does, and
one that did sends the lines through the thread for a while. Otherwise, batches go to the
thread as above. Writing once per pass of the loop instead cost one ``write(2)`` per
admission at the rates an API server sends (a pass holds one), a sixth of the loop's time
behind kube-apiserver; gathered, it is one per batch. At a very low rate a batch is one
line and the timer wakes the loop once more for it, which costs less than the write it
would have shared. (Measured behind kube-apiserver: BENCHMARKS.md.)

The queue is bounded (the loop holds at most one batch): if the writer
cannot keep up, lines are dropped (and counted on stderr) rather than admissions delayed.
Enqueueing is reentrant, so logging from a signal handler cannot deadlock against an
interrupted log call. Forking (``serve --workers``) is handled: the writer thread stops
before a fork and a fresh one starts in the parent and in each child. Exit flushes what is
queued.
"""

from __future__ import annotations

import asyncio
import atexit
import fcntl
import logging
import logging.handlers
import os
import queue
import stat
import sys
import termios
import threading
import time
from collections import deque
from typing import Any, ClassVar

from webhook.base.logs import json_line

QUEUE_SIZE = 10_000
# How long admission lines gather on the event loop before they go to the writer: the
# most a line waits before it is written (stop() writes everything at once).
BATCH_SECONDS = 0.02
# Written by the event loop itself (see the top): what gathered over this long after a line,
DIRECT_SECONDS = 0.1
# at most this much,
DIRECT_BYTES = 16 * 1024
# and not for STALL_BACKOFF seconds after a direct write took longer than STALL_SECONDS.
STALL_SECONDS = 0.005
STALL_BACKOFF = 10.0

Item = logging.LogRecord | str | None  # a record, a formatted line, or None: stop


class _Enqueue(logging.handlers.QueueHandler):
    """QueueHandler that defers formatting to the writer thread and never blocks."""

    dropped = 0

    def __init__(self, records: queue.SimpleQueue[Item]) -> None:
        super().__init__(records)
        self.records = records

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record  # formatted by the real handler, in the writer thread

    def emit(self, record: logging.LogRecord) -> None:
        if _Held.lines:
            _release()  # lines logged before this record are written before it
        super().emit(record)

    def enqueue(self, record: logging.LogRecord | str) -> None:
        # SimpleQueue.put is reentrant: a signal handler that logs (SIGTERM starts the
        # drain) may interrupt a put on the same thread; queue.Queue would deadlock on
        # its own lock there. qsize() is approximate, which is all the bound needs.
        if self.records.qsize() >= QUEUE_SIZE:
            _Enqueue.dropped += 1
        else:
            _State.enqueued += 1  # before the put: the writer's count never runs ahead
            self.records.put_nowait(record)


def _write(handlers: list[logging.Handler], batch: list[Item]) -> None:
    """Write a batch in order: runs of formatted lines in one write per handler."""
    lines: list[str] = []
    for item in batch:
        if isinstance(item, str):
            lines.append(item)
            continue
        if lines:
            _write_lines(handlers, lines)
            lines = []
        if item is not None:
            for handler in handlers:
                if item.levelno >= handler.level:
                    handler.handle(item)
    if lines:
        _write_lines(handlers, lines)


def _write_lines(handlers: list[logging.Handler], lines: list[str]) -> None:
    text = "\n".join(lines) + "\n"
    for handler in handlers:
        if not isinstance(handler, logging.StreamHandler) or handler.level > logging.INFO:
            continue
        handler.acquire()
        try:
            handler.stream.write(text)
            handler.flush()
        except Exception:  # as logging does: a failed write is no crash
            _Enqueue.dropped += len(lines)
        finally:
            handler.release()


def _writer(records: queue.SimpleQueue[Item], handlers: list[logging.Handler]) -> None:
    while True:
        batch = [records.get()]
        try:
            while True:
                batch.append(records.get_nowait())
        except queue.Empty:
            pass
        _write(handlers, batch)
        _State.written += len(batch)  # only this thread writes it
        if None in batch:
            return


class _Held:
    """Admission lines held on the event loop until the next batch (see the top)."""

    lines: ClassVar[deque[str]] = deque()
    timer: ClassVar[asyncio.Handle | None] = None
    loop: ClassVar[asyncio.AbstractEventLoop | None] = None


def _outputs(handlers: list[logging.Handler]) -> tuple[bool, list[tuple[int, int]]]:
    """Whether the loop may write to ``handlers`` at all (every one a file descriptor),
    and (fd, pipe size) of those that are pipes."""
    pipes = []
    for handler in handlers:
        if not isinstance(handler, logging.StreamHandler):
            continue
        try:
            fd = handler.stream.fileno()
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                pipes.append((fd, fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)))
        except (AttributeError, OSError, ValueError):
            return False, []  # not a file descriptor: the thread writes it
    return True, pipes


def _pipes_have_room(size: int) -> bool:
    unread = bytearray(4)
    for fd, capacity in _State.pipes:
        try:
            fcntl.ioctl(fd, termios.FIONREAD, unread)
        except OSError:
            return False
        if capacity - int.from_bytes(unread, sys.byteorder) < size:
            return False
    return True


def _direct_ok(size: int) -> bool:
    """May the loop write ``size`` bytes of lines itself (see the top), as far as can be
    told without a syscall?"""
    return _State.direct and size <= DIRECT_BYTES and _State.enqueued <= _State.written \
        and time.monotonic() >= _State.stalled_until


def _write_pass() -> None:
    """Write what gathered: here if little, else through the thread."""
    _Held.timer = None
    lines = _Held.lines
    size = sum(map(len, lines)) + len(lines)
    if not lines or not _direct_ok(size) or not _pipes_have_room(size):
        _release()
        return
    batch = []
    while lines:  # popleft: a logging signal handler may take the rest to the queue
        batch.append(lines.popleft())
    started = time.monotonic()
    _write_lines(_State.handlers, batch)
    # A pipe with room does not block (a slow write there was the CPU being taken away);
    # anything else that was slow gets the thread for a while.
    if time.monotonic() - started > STALL_SECONDS and not _State.only_pipes:
        _State.stalled_until = time.monotonic() + STALL_BACKOFF


def _release() -> None:
    """Move the held lines to the queue, oldest first.

    ``popleft`` one by one: if a signal handler that logs interrupts this, each line still
    goes to the queue exactly once.
    """
    _Held.timer = None
    enqueue = _State.enqueue
    lines = _Held.lines
    while lines:
        line = lines.popleft()
        if enqueue is not None:
            enqueue.enqueue(line)


class _State:
    handlers: ClassVar[list[logging.Handler]] = []
    thread: ClassVar[threading.Thread | None] = None
    enqueue: ClassVar[_Enqueue | None] = None
    # Set while the writer runs and every handler formats with logs.JsonFormatter, so a
    # line formatted on the loop is the line the handler would have written.
    lines: ClassVar[bool] = False
    # Items put on the queue and items the writer wrote: equal when it has nothing left.
    enqueued: ClassVar[int] = 0
    written: ClassVar[int] = 0
    stalled_until: ClassVar[float] = 0.0  # no direct writes before this (monotonic)
    direct: ClassVar[bool] = False  # every handler writes to a file descriptor
    pipes: ClassVar[list[tuple[int, int]]] = []  # (fd, capacity) of the pipes among them
    only_pipes: ClassVar[bool] = False


def start() -> None:
    """Put the root logger's handlers behind a queue (idempotent)."""
    if _State.thread is not None:
        return
    root = logging.getLogger()
    if _State.enqueue is None:
        _State.handlers = [h for h in root.handlers if not isinstance(h, _Enqueue)]
        atexit.register(stop)
        os.register_at_fork(before=stop, after_in_parent=start, after_in_child=start)
    log_queue: queue.SimpleQueue[Item] = queue.SimpleQueue()
    _State.enqueued = _State.written = 0
    _State.enqueue = _Enqueue(log_queue)
    root.handlers[:] = [_State.enqueue]
    from webhook.base.logs import JsonFormatter

    _State.lines = all(isinstance(h, logging.StreamHandler)
                       and isinstance(h.formatter, JsonFormatter) for h in _State.handlers)
    _State.direct, _State.pipes = _outputs(_State.handlers)
    streams = [h for h in _State.handlers if isinstance(h, logging.StreamHandler)]
    _State.only_pipes = len(_State.pipes) == len(streams)
    _State.thread = threading.Thread(target=_writer, args=(log_queue, _State.handlers),
                                     name="swapwise-log-writer", daemon=True)
    _State.thread.start()


def stop() -> None:
    """Write out everything queued and stop the writer thread."""
    _release()
    thread, _State.thread = _State.thread, None
    _State.lines = False
    if thread is not None and _State.enqueue is not None:
        _State.enqueue.records.put_nowait(None)
        thread.join()
    if _Enqueue.dropped:
        print(f"swapwise: {_Enqueue.dropped} log lines dropped (log output too slow)",
              file=sys.stderr)
        _Enqueue.dropped = 0
    sys.stderr.flush()


def info(logger: logging.Logger, msg: str, fields: dict[str, Any]) -> None:
    """``logger.info(msg, extra=fields)``, the same line, for a fraction of the cost.

    With the writer running, the line is formatted here (logs.json_line) and queued as
    text: no LogRecord, no handler calls on the event loop. Otherwise (tests, the
    in-process benchmark's ``--log-in-loop``), it is an ordinary logging call.
    """
    if not logger.isEnabledFor(logging.INFO):
        return
    if not _State.lines:
        logger.info(msg, extra=fields)
        return
    line = json_line(time.time(), "info", logger.name, msg, fields)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not on the event loop: straight to the queue
        _release()
        assert _State.enqueue is not None
        _State.enqueue.enqueue(line)
        return
    _Held.lines.append(line)
    if _Held.timer is None or _Held.loop is not loop:  # (a new loop: the old timer is dead)
        _Held.loop = loop
        if _direct_ok(len(line) + 1):  # little to write: gathered, then written here
            _Held.timer = loop.call_later(DIRECT_SECONDS, _write_pass)
        else:
            _Held.timer = loop.call_later(BATCH_SECONDS, _release)

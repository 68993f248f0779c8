"""Log lines leave the event loop through a queue; a thread formats and writes them.

Every admission logs one JSON line. Written from the event loop, each line is a
``write(2)`` that usually takes microseconds, but blocks for milliseconds whenever the
file or pipe behind stderr stalls (page-cache writeback, a slow log collector): every
request queued behind it waits too. Measured at 2,000 admissions/s on one worker, that
was the p99 (24 ms with lines written in the loop, 2-3 ms with them queued; see
BENCHMARKS.md). The queue is bounded: if the writer cannot keep up, lines are dropped
(and counted on stderr) rather than admissions delayed. Enqueueing is reentrant, so
logging from a signal handler cannot deadlock against an interrupted log call.

Forking (``serve --workers``) is handled: the writer thread stops before a fork and a
fresh one starts in the parent and in each child. Exit flushes what is queued.
"""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import os
import queue
import sys
from typing import ClassVar

QUEUE_SIZE = 10_000


class _Enqueue(logging.handlers.QueueHandler):
    """QueueHandler that defers formatting to the writer thread and never blocks."""

    dropped = 0

    def __init__(self, records: queue.SimpleQueue[logging.LogRecord]) -> None:
        super().__init__(records)
        self.records = records

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record  # formatted by the real handler, in the writer thread

    def enqueue(self, record: logging.LogRecord) -> None:
        # SimpleQueue.put is reentrant: a signal handler that logs (SIGTERM starts the
        # drain) may interrupt a put on the same thread; queue.Queue would deadlock on
        # its own lock there. qsize() is approximate, which is all the bound needs.
        if self.records.qsize() >= QUEUE_SIZE:
            _Enqueue.dropped += 1
        else:
            self.records.put_nowait(record)


class _State:
    handlers: ClassVar[list[logging.Handler]] = []
    listener: ClassVar[logging.handlers.QueueListener | None] = None
    enqueue: ClassVar[_Enqueue | None] = None


def start() -> None:
    """Put the root logger's handlers behind a queue (idempotent)."""
    if _State.listener is not None:
        return
    root = logging.getLogger()
    if _State.enqueue is None:
        _State.handlers = [h for h in root.handlers if not isinstance(h, _Enqueue)]
        atexit.register(stop)
        os.register_at_fork(before=stop, after_in_parent=start, after_in_child=start)
    log_queue: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    _State.enqueue = _Enqueue(log_queue)
    root.handlers[:] = [_State.enqueue]
    _State.listener = logging.handlers.QueueListener(
        log_queue, *_State.handlers, respect_handler_level=True)
    _State.listener.start()


def stop() -> None:
    """Write out everything queued and stop the writer thread."""
    listener, _State.listener = _State.listener, None
    if listener is not None:
        listener.stop()
    if _Enqueue.dropped:
        print(f"swapwise: {_Enqueue.dropped} log lines dropped (log output too slow)",
              file=sys.stderr)
        _Enqueue.dropped = 0
    sys.stderr.flush()

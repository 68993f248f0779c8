"""Logging from a signal handler never deadlocks against an interrupted log call.

SIGTERM starts the drain and logs; it can land while the main thread is inside a log
call. With a lock-based queue that deadlocked the worker (seen as a hung shutdown).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import logging, os, signal, threading, time
    from webhook.server import asynclog
    from webhook.logs import configure, get_logger

    configure("info")
    logging.getLogger().handlers[0].stream = open(os.devnull, "w")
    asynclog.start()
    log = get_logger("test")
    signal.signal(signal.SIGUSR1, lambda *_: log.info("from the handler"))
    done = threading.Event()

    def pester() -> None:
        while not done.is_set():
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.0001)

    threading.Thread(target=pester, daemon=True).start()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        log.info("from the main thread", extra={"n": 1})
    done.set()
    print("finished")
    """
)


def test_signal_handler_logging_does_not_deadlock() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "finished"

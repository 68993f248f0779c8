"""Logging from a signal handler never deadlocks against an interrupted log call.

SIGTERM starts the drain and logs; it can land while the main thread is inside a log
call. With a lock-based queue that deadlocked the worker (seen as a hung shutdown).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import logging, os, signal, threading, time
    from webhook.server import asynclog
    from webhook.base.logs import configure, get_logger

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


LOW_RATE = textwrap.dedent(
    """
    import asyncio, json, logging, sys, threading, time
    from webhook.server import asynclog
    from webhook.base.logs import configure, get_logger

    configure("info")  # JSON lines on stderr: a pipe to the test, as in a container
    asynclog.start()
    log = get_logger("test")
    loop_writes = 0
    write_lines = asynclog._write_lines

    def counted(handlers, lines):
        global loop_writes
        if threading.current_thread() is threading.main_thread():
            loop_writes += 1
        write_lines(handlers, lines)

    asynclog._write_lines = counted

    async def main() -> None:
        started = time.monotonic()
        for n in range(200):  # a low rate: one admission line per pass of the loop
            asynclog.info(log, "admission", {"n": n})
            await asyncio.sleep(0.002)
        await asyncio.sleep(asynclog.DIRECT_SECONDS * 2)  # the last batch is written
        direct = asynclog._State.written
        batches = {"loop_writes": loop_writes,
                   "periods": (time.monotonic() - started) / asynclog.DIRECT_SECONDS}
        for n in range(200, 260):  # an ordinary record now and then: order still holds
            asynclog.info(log, "admission", {"n": n})
            if n % 20 == 0:
                log.warning("warned", extra={"n": n})
            await asyncio.sleep(0)
        print(json.dumps({"thread_wrote": direct} | batches), flush=True)

    asyncio.run(main())
    asynclog.stop()
    """
)


def test_low_rates_are_written_by_the_loop_itself_in_order() -> None:
    proc = subprocess.run([sys.executable, "-c", LOW_RATE], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    # 200 lines at a low rate, and the writer thread woke for none of them; the loop
    # wrote them gathered: at most one write(2) per DIRECT_SECONDS, not one per line.
    report = json.loads(proc.stdout)
    assert report["thread_wrote"] == 0
    assert 1 <= report["loop_writes"] <= report["periods"] + 1
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    assert [line["n"] for line in lines] == [
        n for k in range(260) for n in ([k, k] if k >= 200 and k % 20 == 0 else [k])]
    assert [line["msg"] for line in lines if line["n"] == 220] == ["admission", "warned"]

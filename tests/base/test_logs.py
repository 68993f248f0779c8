"""The JSON log lines: the admission line formatted on the event loop is the line logging
would have written, and the batched writer keeps every line, in order."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import time

import pytest

from webhook.base.logs import JsonFormatter, json_line

FIELDS = [
    {"uid": "7b1c", "profile": "sandbox", "namespace": "apps", "outcome": "mutated",
     "reason": None, "containers_changed": 4, "warnings": 0, "duration_ms": 0.123},
    {"uid": 'q"uo\\te\n', "profile": "prøfil-☃", "namespace": None, "outcome": "skipped",
     "reason": "critical pod", "containers_changed": 0, "warnings": 2, "duration_ms": 12.5},
    {"uid": "x", "profile": "p", "namespace": "n", "outcome": "unchanged", "reason": "\x00",
     "containers_changed": 0, "warnings": 0, "duration_ms": 1e-05},
    # Not scalars of the exact types, or names the head uses: the encoder writes them.
    {"flag": True, "off": False, "big": 10**30, "neg": -1.5e300},
    {"items": [1, "a"], "nested": {"k": None}, "nan": float("nan"), "inf": float("inf")},
    {"level": "shadowed", "ts": 1, "logger": None},
    {"path": __import__("pathlib").Path("/x")},
]


@pytest.mark.parametrize("fields", FIELDS)
def test_json_line_is_the_formatters_line(fields: dict[str, object]) -> None:
    logger = logging.getLogger("swapwise.admission")
    record = logger.makeRecord(logger.name, logging.INFO, __file__, 1, "admission", (), None,
                               extra=fields)
    expected = JsonFormatter().format(record)
    assert json_line(record.created, "info", logger.name, "admission", fields) == expected
    if "uid" in fields:
        assert json.loads(expected)["uid"] == fields["uid"]


def test_json_line_timestamps_across_seconds() -> None:
    for created in (1_700_000_000.0, 1_700_000_000.999, 1_700_000_001.0005, time.time()):
        record = logging.makeLogRecord({"created": created, "msecs": int(
            (created - int(created)) * 1000) + 0.0, "levelname": "INFO", "name": "n",
            "msg": "m"})
        assert json_line(created, "info", "n", "m", {}) == JsonFormatter().format(record)


WRITER = textwrap.dedent(
    """
    import asyncio, logging, sys
    from webhook.base.logs import configure, get_logger
    from webhook.server import asynclog

    configure(sys.argv[1])
    asynclog.start()
    admission, other = get_logger("admission"), get_logger("server")

    async def log(pause):
        for i in range(3000):
            if i % 1000 == 0:
                other.info("record", extra={"i": i})
            asynclog.info(admission, "admission", {"uid": str(i), "n": i})
            if i % 100 == 0 and pause:
                await asyncio.sleep(0.005)  # some batches go out on the timer
        other.warning("last")

    mode = sys.argv[2]
    if mode == "plain":  # off the event loop: lines go straight to the queue
        try:
            log(False).send(None)
        except StopIteration:
            pass
    else:
        asyncio.run(log(mode == "loop"))
    """
)


def run_writer(level: str, mode: str = "loop") -> list[dict[str, object]]:
    proc = subprocess.run([sys.executable, "-c", WRITER, level, mode], capture_output=True,
                          text=True, timeout=60, check=True)
    return [json.loads(line) for line in proc.stderr.splitlines()]


@pytest.mark.parametrize("mode", ["loop", "held", "plain"])
def test_batched_writer_keeps_every_line_in_order(mode: str) -> None:
    """On the loop with batches released by the timer, held until a record or the exit
    ("held"), and off the loop ("plain"): every line, in the order logged."""
    entries = run_writer("info", mode)
    admissions = [e for e in entries if e["msg"] == "admission"]
    assert [e["uid"] for e in admissions] == [str(i) for i in range(3000)]
    assert all(e["logger"] == "swapwise.admission" and e["level"] == "info"
               for e in admissions)
    order = [(e["msg"], e.get("i", e.get("n"))) for e in entries if e["msg"] != "admission"
             or e["n"] in (0, 999, 1000, 2999)]
    assert order == [("record", 0), ("admission", 0), ("admission", 999), ("record", 1000),
                     ("admission", 1000), ("record", 2000), ("admission", 2999),
                     ("last", None)]


def test_admission_lines_follow_the_log_level() -> None:
    assert [e["msg"] for e in run_writer("warning")] == ["last"]

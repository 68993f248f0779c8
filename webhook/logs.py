"""Structured JSON logs: one line per event, machine-parseable, no pod contents."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

LOGGER = "swapwise"
_RESERVED = {*vars(logging.makeLogRecord({})), "color_message"}  # uvicorn adds color_message
# One encoder for every line: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(default=str)


class JsonFormatter(logging.Formatter):
    _second = -1
    _stamp = ""

    def _timestamp(self, created: float, msecs: float) -> str:
        second = int(created)
        if second != self._second:  # strftime once a second, not once a line
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return f"{self._stamp}.{int(msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self._timestamp(record.created, record.msecs),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _RESERVED})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return _ENCODER.encode(entry)


def configure(level: str = "info") -> None:
    # The JSON lines carry no source file or line, so skip the stack walk that finds them
    # (logging's documented switch; it was a tenth of an admission's cost).
    logging._srcfile = None
    logging.logMultiprocessing = logging.logProcesses = logging.logThreads = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "watchfiles", "watchfiles.main"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("watchfiles").setLevel(logging.WARNING)


def get_logger(name: str = "") -> logging.Logger:
    return logging.getLogger(f"{LOGGER}.{name}" if name else LOGGER)

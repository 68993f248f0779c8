"""Structured JSON logs: one line per event, machine-parseable, no pod contents."""

from __future__ import annotations

import json
import logging
import sys
import time
from _json import make_encoder
from json.encoder import encode_basestring_ascii
from typing import Any

LOGGER = "swapwise"
_RESERVED = {*vars(logging.makeLogRecord({})), "color_message"}  # uvicorn adds color_message
# One encoder for every line: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(default=str)
# The C encoder that _ENCODER.encode builds anew on every call (JSONEncoder.iterencode),
# with _ENCODER's settings, built once for json_line: a fifth of that call's cost. Without
# the circular-reference check (markers None): a log line's fields never contain themselves.
_ENCODE = make_encoder(None, _ENCODER.default, encode_basestring_ascii, None,
                       _ENCODER.key_separator, _ENCODER.item_separator, _ENCODER.sort_keys,
                       _ENCODER.skipkeys, _ENCODER.allow_nan)


class _Clock:
    """ISO timestamps, with strftime once a second rather than once a line. One tuple,
    replaced whole: the event loop and the log writer thread both read it."""

    cached: tuple[int, str] = (-1, "")


def timestamp(created: float, msecs: float | None = None) -> str:
    """``created`` (time.time()) as the lines show it: UTC, milliseconds, ``Z``.

    ``msecs``: a LogRecord's; without one, computed as Python 3.11's LogRecord does
    (truncated, not rounded).
    """
    second = int(created)
    cached_second, stamp = _Clock.cached
    if second != cached_second:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _Clock.cached = (second, stamp)
    if msecs is None:
        msecs = (created - second) * 1000
    return f"{stamp}.{int(msecs):03d}Z"


def json_line(created: float, level: str, logger: str, msg: str, fields: dict[str, Any]
              ) -> str:
    """The line :class:`JsonFormatter` writes for such a record, without the record.

    (Writing the scalars piece by piece with the encoder's string escaping was measured:
    no cheaper than this one C encoder call.)
    """
    return "".join(_ENCODE({"ts": timestamp(created), "level": level, "logger": logger,
                            "msg": msg, **fields}, 0))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": timestamp(record.created, record.msecs),
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

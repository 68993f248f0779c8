"""Reading watched files safely: whatever sits at the path, the answer is bytes or an OSError.

A mounted ConfigMap or Secret can be replaced by anything while swapwise runs: a
directory, a FIFO (reading one would block the event loop forever), a device, or a huge
file. Only a regular file of at most ``limit`` bytes is read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


class FileTooLarge(OSError):
    pass


def read_regular(path: Path, limit: int) -> bytes:
    """The content of the regular file at ``path``; OSError for anything else."""
    # O_NONBLOCK: opening a FIFO with no writer must not block; regular files ignore it.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path}: not a regular file")
        if info.st_size > limit:
            raise FileTooLarge(f"{path}: larger than {limit} bytes")
        return _read_at_most(lambda size: os.read(fd, size), limit, str(path))  # it may grow
    finally:
        os.close(fd)


def read_stream(stream: BinaryIO, limit: int, name: str) -> bytes:
    """All of ``stream`` (stdin, a pipe, a device), refused past ``limit`` bytes: reading
    ``/dev/zero`` stops there. Unlike :func:`read_regular`, this blocks until the writer is
    done, which is what a command reading its input wants."""
    return _read_at_most(stream.read, limit, name)


def _read_at_most(read: Callable[[int], bytes], limit: int, name: str) -> bytes:
    chunks = []
    size = 0
    while True:
        chunk = read(1 << 16)
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            raise FileTooLarge(f"{name}: larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)

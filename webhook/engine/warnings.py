"""Admission warnings: short, prefixed, and within the API server's length budget."""

from __future__ import annotations

MAX_WARNING = 120  # kube-apiserver truncates longer ones; keep ours readable whole


class CutWarning(str):
    """A warning cut to :data:`MAX_WARNING` characters for the API server, which keeps the
    whole text in ``whole`` for the command line (``preview`` and ``plan`` print it)."""

    whole: str


def warning(text: str) -> str:
    message = f"swapwise: {text}"
    if len(message) > MAX_WARNING:
        cut = CutWarning(message[: MAX_WARNING - 3] + "...")
        cut.whole = message
        return cut
    return message


def whole(message: str) -> str:
    """The whole text of a warning, however long (see :class:`CutWarning`)."""
    return message.whole if isinstance(message, CutWarning) else message

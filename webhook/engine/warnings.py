"""Admission warnings: short, prefixed, and within the API server's length budget."""

from __future__ import annotations

MAX_WARNING = 120  # kube-apiserver truncates longer ones; keep ours readable whole


def warning(text: str) -> str:
    message = f"swapwise: {text}"
    if len(message) > MAX_WARNING:
        message = message[: MAX_WARNING - 3] + "..."
    return message

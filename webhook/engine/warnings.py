"""Admission warnings: short, prefixed, and within the API server's length budget.

The texts of the per-container and VPA warnings are templates here, once: the engine fills
them with ``str.format``, the rendered warning policy (webhook/render) with
:func:`cel_format`, which gives the same words as CEL string concatenation.
"""

from __future__ import annotations

import string

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


LIMIT_ADDED = "{name} memory limit {limit} (defaultLimit), request {request}"
LIMIT_RAISED = ("{name} memory limit {limit} -> {raised} (request {request} kept: "
                "a VerticalPodAutoscaler sets it)")
REQUEST_LOWERED = "{name} memory request {before} -> {request} (limit {limit})"
REQUEST_NOT_BELOW = ("{name} memory left unchanged: request {request} would not be below "
                     "limit {limit}")
LIMIT_NOT_ABOVE = ("{name} memory left unchanged: limit {limit} would not be above "
                   "request {request}")
VPA_RAN_AFTER = ("VerticalPodAutoscaler ran after swapwise reshaped this pod; its memory "
                 "requests are the VPA's (docs/vpa.md)")
VPA_SKIP = "pod left unchanged: a VerticalPodAutoscaler manages its memory (vpaPods: skip)"


def cel_format(template: str, **fields: str) -> str:
    """``template`` as a CEL string expression: its text as single-quoted literals, each
    ``{field}`` the CEL expression given for it, joined with ``+``."""
    parts = []
    for literal, field, _spec, _conversion in string.Formatter().parse(template):
        if literal:
            parts.append("'" + literal.replace("\\", "\\\\").replace("'", "\\'") + "'")
        if field is not None:
            parts.append(fields[field])
    return " + ".join(parts)

"""Label keys and values as the API server checks them.

One check for the label keys and values a user gives swapwise: the policy's node selectors
and tolerations (the keys swapwise writes itself are constants). Matched whole (``fullmatch``: ``$``
would let a trailing newline through).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# apimachinery's IsQualifiedName (name part) and DNS-1123 subdomain (prefix).
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class LabelError(ValueError):
    """A label the API server would refuse."""


def label_key_problem(key: str) -> str | None:
    """Why the API server would refuse ``key`` as a label key (``[prefix/]name``), if so."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _PREFIX.fullmatch(prefix)):
        return "the key prefix must be a DNS subdomain"
    if not _NAME.fullmatch(name):
        return ("the key name must be 1-63 characters [A-Za-z0-9-_.], starting and ending "
                "alphanumeric")
    return None


def label_value_problem(value: str) -> str | None:
    """Why the API server would refuse ``value`` as a label value, if so."""
    if value and not _NAME.fullmatch(value):
        return ("the value must be empty or 1-63 characters [A-Za-z0-9-_.], starting and "
                "ending alphanumeric")
    return None


@dataclass(frozen=True)
class Label:
    key: str
    value: str

    @classmethod
    def parse(cls, text: str) -> Label:
        """``key=value``, both checked like the API server checks label keys and values."""
        key, sep, value = text.partition("=")
        if not sep:
            raise LabelError(f"{text!r}: expected key=value")
        problem = label_key_problem(key) or label_value_problem(value)
        if problem is not None:
            raise LabelError(f"{text!r}: {problem}")
        return cls(key, value)

    def __str__(self) -> str:
        return f"{self.key}={self.value}"

"""Helpers shared by subcommands: loading a policy with readable errors."""

from __future__ import annotations

import sys
from pathlib import Path

from webhook.policy import Policy, PolicyError, default_policy, load_policy


class CommandError(Exception):
    """A user error: printed as ``swapwise: <message>`` with exit status 1."""


def policy_from(path: str | None) -> Policy:
    if path is None:
        return default_policy()
    try:
        return load_policy(Path(path))
    except PolicyError as exc:
        raise CommandError(str(exc)) from None


def fail(message: str) -> int:
    print(f"swapwise: {message}", file=sys.stderr)
    return 1

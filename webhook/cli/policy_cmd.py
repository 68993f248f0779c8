"""``swapwise policy check FILE|-``: validate a policy before it reaches a cluster."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from webhook.base.files import FileTooLarge, read_stream
from webhook.policy import (
    MAX_FILE_BYTES,
    Policy,
    PolicyError,
    load_policy,
    parse_policy_bytes,
)

STDIN = "<stdin>"


def register(subcommands: Any) -> None:
    parser = subcommands.add_parser("policy", help="work with policy files")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser("check", help="validate a policy file (exit 1 on errors)")
    check.add_argument("file", help="policy YAML file, or - for stdin (as preview and plan "
                                    "read -f -)")
    check.set_defaults(func=run_check)


def _load(file: str) -> tuple[Policy, str]:
    """The policy ``file`` names (``-``: stdin, at most a policy file's size), and its name."""
    if file != "-":
        return load_policy(file), file
    try:
        data = read_stream(sys.stdin.buffer, MAX_FILE_BYTES, STDIN)
    except FileTooLarge:
        raise PolicyError(STDIN, [f"(file): larger than {MAX_FILE_BYTES // (1024 * 1024)} "
                                  "MiB, the most a policy may be"]) from None
    except OSError as exc:
        raise PolicyError(STDIN, [f"(file): {exc.strerror or exc}"], unreadable=True) from None
    return parse_policy_bytes(data, STDIN), STDIN


def run_check(args: argparse.Namespace) -> int:
    try:
        policy, name = _load(args.file)
    except PolicyError as exc:
        print(exc.text().replace(": invalid policy:\n", ": invalid policy\n", 1),
              file=sys.stderr)
        return 1
    overrides = sorted({namespace for _, namespace in policy.overrides})
    print(f"{name}: valid; profiles: {', '.join(sorted(policy.profiles))}"
          + (f"; namespace overrides: {', '.join(overrides)}" if overrides else ""))
    return 0

"""``swapwise policy check FILE``: validate a policy before it reaches a cluster."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from webhook.policy import PolicyError, load_policy


def register(subcommands: Any) -> None:
    parser = subcommands.add_parser("policy", help="work with policy files")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser("check", help="validate a policy file (exit 1 on errors)")
    check.add_argument("file", help="policy YAML file")
    check.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.file)
    except PolicyError as exc:
        print(exc.text().replace(": invalid policy:\n", ": invalid policy\n", 1),
              file=sys.stderr)
        return 1
    overrides = sorted({namespace for _, namespace in policy.overrides})
    print(f"{args.file}: valid; profiles: {', '.join(sorted(policy.profiles))}"
          + (f"; namespace overrides: {', '.join(overrides)}" if overrides else ""))
    return 0

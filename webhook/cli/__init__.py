"""The ``swapwise`` command line: each subcommand lives in its own module."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from webhook import __version__
from webhook.cli import (
    audit,
    certs_cmd,
    label_nodes,
    plan,
    policy_cmd,
    preview,
    render_cmd,
    serve,
)

COMMANDS = (serve, preview, plan, audit, policy_cmd, render_cmd, certs_cmd, label_nodes)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swapwise",
        description="Reshape Kubernetes pods so LimitedSwap lets them use node swap.",
    )
    parser.add_argument("--version", action="version", version=f"swapwise {__version__}")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(subcommands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

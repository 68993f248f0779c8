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
    tune,
)

COMMANDS = (serve, preview, plan, audit, policy_cmd, render_cmd, certs_cmd, label_nodes,
            tune)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swapwise",
        description="Reshape Kubernetes pods so LimitedSwap lets them use node swap.",
    )
    parser.add_argument("--version", action="version", version=f"swapwise {__version__}")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(subcommands)
    _describe(parser)
    return parser


def _describe(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand without a description of its own its one-line help as one, so
    ``swapwise COMMAND --help`` always says what the command does."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help for choice in action._choices_actions}
        for name, sub in action.choices.items():
            text = helps.get(name)
            if sub.description is None and text:
                sub.description = text[0].upper() + text[1:] + "."
            _describe(sub)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

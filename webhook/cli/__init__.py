"""The ``swapwise`` command line: each subcommand lives in its own module."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import import_module

from webhook import __version__

# Each subcommand, in the order --help lists them. Its module is named for it:
# ``webhook/cli/<command>_cmd.py`` (``-`` read as ``_``), a suffix no other module in webhook/
# has, so ``audit_cmd`` (the command) never reads like ``analysis/audit`` (its decisions).
# Every module is imported when the parser is built, but a LIGHT command imports only its
# own: node-agent runs on every node, and the other commands' imports (the policy model,
# pydantic) would double its memory.
COMMANDS = ("serve", "preview", "plan", "audit", "policy", "render", "certs", "node-agent",
            "tune")
LIGHT = frozenset({"node-agent"})


def command_module(command: str) -> str:
    """The module that registers ``command``."""
    return f"webhook.cli.{command.replace('-', '_')}_cmd"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``only`` one command's parser and nothing else
    imported."""
    parser = argparse.ArgumentParser(
        prog="swapwise",
        description="Reshape Kubernetes pods so LimitedSwap lets them use node swap.",
    )
    parser.add_argument("--version", action="version", version=f"swapwise {__version__}")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in (only,) if only else COMMANDS:
        import_module(command_module(command)).register(subcommands)
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
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv[0] if argv and argv[0] in LIGHT else None).parse_args(argv)
    try:
        result: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

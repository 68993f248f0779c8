"""The ``swapwise`` command line: each subcommand lives in its own module."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import import_module

from webhook import __version__

# Each subcommand's module, in the order --help lists them. Imported when the parser is
# built, and only the one asked for when that is node-agent: the agent runs on every node,
# and the other commands' imports (the policy model, pydantic) would double its memory.
COMMANDS = ("serve", "preview", "plan", "audit", "policy_cmd", "render_cmd", "certs_cmd",
            "node_agent", "tune")
LIGHT = {"node-agent": "node_agent"}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swapwise",
        description="Reshape Kubernetes pods so LimitedSwap lets them use node swap.",
    )
    parser.add_argument("--version", action="version", version=f"swapwise {__version__}")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in (only,) if only else COMMANDS:
        import_module(f"webhook.cli.{name}").register(subcommands)
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
    args = build_parser(LIGHT.get(argv[0]) if argv else None).parse_args(argv)
    try:
        result: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

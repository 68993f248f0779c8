"""Helpers shared by subcommands: loading a policy and choosing its profile with readable
errors, reading manifests."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from webhook.policy import Policy, PolicyError, default_policy, load_policy
from webhook.profile import Profile


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


def choose_profile(policy: Policy, name: str | None, namespace: str | None) -> Profile:
    if name is None:
        if len(policy.profiles) != 1:
            raise CommandError(
                f"--profile is required: the policy has {len(policy.profiles)} profiles "
                f"({', '.join(sorted(policy.profiles))})"
            )
        name = next(iter(policy.profiles))
    profile = policy.resolve(name, namespace)
    if profile is None:
        raise CommandError(
            f"unknown profile {name!r}; the policy has: {', '.join(sorted(policy.profiles))}"
        )
    return profile


def read_documents(filename: str) -> list[Any]:
    try:
        if filename == "-":
            text = sys.stdin.read()
        else:
            with open(filename, encoding="utf-8") as handle:
                text = handle.read()
        return list(yaml.safe_load_all(text))
    except OSError as exc:
        raise CommandError(f"cannot read {filename}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise CommandError(f"{filename} is not valid YAML: {exc}") from None

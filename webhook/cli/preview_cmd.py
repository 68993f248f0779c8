"""``swapwise preview``: what the webhook would do, offline, on your manifests.

The same engine the server runs is applied to Pods and to the pod templates of
workload objects; the result is printed, warnings go to stderr like kubectl's.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from typing import Any, TextIO

import yaml

from webhook.analysis.hpa import manifest_warnings
from webhook.analysis.workloads import find_workload, iter_objects
from webhook.cli.common import (
    NO_WORKLOAD,
    CommandError,
    fail,
    policy_for_workloads,
    read_documents,
    reshape_workloads,
)
from webhook.engine import Mutation, Reshape
from webhook.engine.mutate import VPA_SKIPPED
from webhook.engine.pod import PROFILE_ANNOTATION, PodView
from webhook.engine.pressure import MARKS
from webhook.engine.warnings import whole
from webhook.policy import Policy
from webhook.profile import Profile


def register(subcommands: Any) -> None:
    parser = subcommands.add_parser("preview", help="apply the mutation offline to manifests")
    parser.add_argument("-f", "--filename", required=True,
                        help="YAML or JSON file, - for stdin, or a directory (its .yaml, .yml "
                             "and .json files); at most 16 MiB")
    parser.add_argument("--policy", help="policy file (default: built-in policy)")
    parser.add_argument("--profile", help="profile (may be omitted with a one-profile policy)")
    parser.add_argument("--namespace", "-n", help="namespace, for per-namespace overrides")
    parser.add_argument("-o", "--output", choices=["yaml", "json", "diff"], default="yaml")
    parser.set_defaults(func=run)


def _dump(obj: Any) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)


def preview(
    documents: list[Any], policy: Policy, profile_name: str | None, namespace: str | None,
    warnings_out: TextIO,
) -> list[tuple[Any, Any]]:
    """(before, after) for every object; objects without pods pass through unchanged."""
    results: list[tuple[Any, Any]] = []
    objects = list(iter_objects(documents))
    workloads = 0
    for obj, case in reshape_workloads(objects, policy, profile_name, namespace):
        if case is None:
            results.append((obj, obj))
            continue
        workloads += 1
        workload, reshaped = case.workload, case.reshaped
        for message in reshaped.mutation.warnings:
            print(f"Warning: {workload.ref}: {whole(message)}", file=warnings_out)
        note = placement_note(reshaped)
        if note is not None:
            print(f"Note: {workload.ref}: {note}", file=warnings_out)
        if not reshaped.changed:
            reason = why_unchanged(reshaped.pod, reshaped.profile, reshaped.mutation,
                                   workload.daemonset)
            if reason is not None:
                print(f"Note: {workload.ref}: left unchanged: {reason}", file=warnings_out)
            results.append((obj, obj))
            continue
        stored = case.stored
        for hpa in manifest_warnings(objects, workload.kind, workload.name,
                                     workload.namespace, case.written, stored):
            print(f"Warning: {workload.ref}: {hpa.message()}", file=warnings_out)
        results.append((obj, workload.with_pod(stored)))
    if not workloads:
        raise CommandError(NO_WORKLOAD)
    return results


def placement_note(reshaped: Reshape) -> str | None:
    """What placement the engine added to a pod whose memory it left alone, and what that
    costs; None when it changed some container's memory (its warnings say so) or added no
    placement. Such a pod already gets swap, so the change is easy to miss in a diff, and a
    required affinity can keep it Pending (a StatefulSet whose volumes are in one zone)."""
    mutation = reshaped.mutation
    if not reshaped.changed or mutation.changes or not any(
            op.get("path", "").startswith(("/spec/affinity", "/spec/tolerations"))
            for op in mutation.patch):
        return None
    profile = reshaped.profile
    placement = profile.placement
    nodes = " and ".join(f"{key}={value}" for key, value in placement.node_selector)
    where = f"placement.mode: {placement.mode} of profile {profile.name}"
    head = "no container's memory changes (each already gets swap), but swapwise adds "
    if placement.mode == "preferred":
        return (head + f"a preferred node affinity term ({where}, weight {placement.weight})"
                + (f": the scheduler favours nodes with {nodes}" if nodes else ""))
    if placement.mode != "required":
        return head + f"tolerations ({where})"
    marks = " or ".join(mark.key for mark in MARKS)
    runs = (f"it runs only on nodes with {nodes}, and not on one marked {marks}"
            if nodes else f"it does not run on a node marked {marks}")
    return (head + f"a required node affinity ({where}): {runs}; a workload whose volumes "
            "are bound to a zone without such a node stays Pending (placement.mode: "
            "preferred or none in the profile, or podSelector, leaves it out)")


def why_unchanged(pod: dict[str, Any], profile: Profile, mutation: Mutation,
                  daemonset: bool = False) -> str | None:
    """Why the engine gave ``pod`` no patch, as ``plan`` says it; None when a warning
    already says it (a malformed or too large pod, a VPA's with ``vpaPods: skip``)."""
    if mutation.skipped in ("malformed", "too large", VPA_SKIPPED):
        return None
    if mutation.skipped == "podSelector does not match":
        return (f"profile {profile.name}'s podSelector does not select it (it reshapes only "
                "the pods it selects)")
    if mutation.skipped is not None:
        return f"{mutation.skipped} (never reshaped)"
    view = PodView.parse(pod)  # the engine parsed it: it has the shape of a pod
    if all(c.memory_request is None and c.memory_limit is None for c in view.containers):
        return ("no container has a memory request or limit, so none can get swap; set "
                "defaultLimit in the profile to give them one" if profile.default_limit is None
                else "no container has a memory request or limit")
    if view.annotations.get(PROFILE_ANNOTATION) is not None:
        return f"already in the shape profile {profile.name} gives (reshaped before)"
    if mutation.warnings:
        return "no container's memory changes (the warnings above say why)"
    if profile.placement.mode == "none":
        placement = "the profile adds no placement (placement.mode: none)"
    elif view.spec.get("nodeName"):
        placement = "spec.nodeName is set, so it gets no placement"
    elif daemonset or view.owned_by_daemonset():
        placement = "a DaemonSet's pod gets no placement"
    else:
        placement = "it already has the profile's placement"
    return ("every container with memory already has a request below its limit (it already "
            f"gets swap), and {placement}")


def render(results: list[tuple[Any, Any]], output: str) -> str:
    if output == "json":
        items = [after for _, after in results]
        if len(items) == 1:
            return json.dumps(items[0], indent=2) + "\n"
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2) + "\n"
    if output == "diff":
        chunks: list[str] = []
        for before, after in results:
            if before == after:
                continue
            workload = find_workload(before)
            name = workload.ref if workload else "object"
            chunks.extend(difflib.unified_diff(
                _dump(before).splitlines(keepends=True), _dump(after).splitlines(keepends=True),
                fromfile=f"{name} (original)", tofile=f"{name} (swapwise)",
            ))
        return "".join(chunks)
    return "---\n".join(_dump(after) for _, after in results)


def run(args: argparse.Namespace) -> int:
    try:
        policy = policy_for_workloads(args.policy, args.profile)
        results = preview(
            read_documents(args.filename), policy, args.profile, args.namespace, sys.stderr
        )
    except CommandError as exc:
        return fail(str(exc))
    sys.stdout.write(render(results, args.output))
    return 0

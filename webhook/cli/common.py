"""Helpers shared by subcommands: loading a policy and choosing its profile with readable
errors, reading manifests within bounds, and the one loop that reshapes the workloads of
an input as admission would (``preview`` and ``plan`` both walk it)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from webhook.analysis.vpa_manifests import as_admitted, managing_vpa, without_admission_marks
from webhook.analysis.workloads import Workload, find_workload
from webhook.base.documents import MAX_VALUES, DocumentError, decode, load
from webhook.base.files import FileTooLarge, read_regular, read_stream
from webhook.engine import Reshape, reshape
from webhook.policy import Policy, PolicyError, default_policy, load_policy
from webhook.profile import Profile


class CommandError(Exception):
    """A user error: printed as ``swapwise: <message>`` with exit status 1."""


# preview and plan refuse input without a workload alike: an empty file, a mistyped path to
# a ConfigMap, YAML that is no manifest.
NO_WORKLOAD = ("no Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job or CronJob found "
               "in the input")


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


@dataclass(frozen=True)
class WorkloadReshape:
    """One workload of an input, its pod (template) reshaped as admission would.

    With a VPA of the same input managing the workload, the engine decides on the pod as
    that VPA's webhook would hand it over (:func:`~webhook.analysis.vpa_manifests.as_admitted`).
    """

    workload: Workload
    written: dict[str, Any]  # the pod (template) as written
    vpa: dict[str, Any] | None
    reshaped: Reshape  # of the pod as admitted

    @property
    def stored(self) -> dict[str, Any]:
        """The reshaped pod as the input would then say it: without the VPA's marks."""
        after: dict[str, Any] = self.reshaped.after
        return without_admission_marks(after, self.written) if self.vpa is not None else after


def reshape_workloads(
    objects: list[Any], policy: Policy, profile_name: str | None, namespace: str | None,
) -> Iterator[tuple[Any, WorkloadReshape | None]]:
    """Every object of ``objects`` (an input, ``kind: List`` flattened), with its reshape
    when it holds a pod; the profile is chosen per workload (``namespace`` or its own)."""
    for obj in objects:
        workload = find_workload(obj)
        if workload is None:
            yield obj, None
            continue
        profile = choose_profile(policy, profile_name, namespace or workload.namespace)
        written = workload.pod()
        assert written is not None  # find_workload only returns workloads with a pod
        vpa = managing_vpa(objects, workload.kind, workload.name, workload.namespace)
        admitted = as_admitted(written, vpa) if vpa is not None else written
        reshaped = reshape(admitted, profile, daemonset=workload.daemonset or None)
        yield obj, WorkloadReshape(workload, written, vpa, reshaped)


def policy_for_workloads(policy_path: str | None, profile_name: str | None) -> Policy:
    """The policy for ``preview`` and ``plan``; a ``--profile`` it lacks is an error before
    any input is read (the profile is chosen again per workload, by namespace)."""
    policy = policy_from(policy_path)
    if profile_name is not None:
        choose_profile(policy, profile_name, None)
    return policy


# Manifests: at most this much input in all (a file, stdin, or a directory's files). A
# policy is one small object (1 MiB, a ConfigMap's limit); a manifest stream may be a whole
# `helm template`. Each file is then held to webhook.base.documents' bounds: nested at most
# MAX_DEPTH levels, and at most MAX_VALUES values or as many as it has bytes, whichever is
# more, so YAML aliases cannot make a file of a few hundred bytes a billion values.
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MANIFEST_SUFFIXES = (".json", ".yaml", ".yml")  # what kubectl -f DIR reads


def _inputs(filename: str) -> list[tuple[str, bytes]]:
    """(name, content) of each file ``-f`` names: stdin, a file (a pipe or a device too),
    or the .json/.yaml/.yml files of a directory, in name order (not its subdirectories),
    as ``kubectl -f DIR`` reads them."""
    if filename == "-":
        return [("<stdin>", read_stream(sys.stdin.buffer, MAX_MANIFEST_BYTES, "<stdin>"))]
    path = Path(filename)
    if not path.is_dir():
        if path.is_file():
            return [(filename, read_regular(path, MAX_MANIFEST_BYTES))]
        with path.open("rb") as stream:  # a FIFO (-f <(helm template ...)), a device
            return [(filename, read_stream(stream, MAX_MANIFEST_BYTES, filename))]
    files = sorted(p for p in path.iterdir() if p.suffix in MANIFEST_SUFFIXES and p.is_file())
    if not files:
        raise CommandError(f"{filename}: a directory without .json, .yaml or .yml files")
    found = []
    left = MAX_MANIFEST_BYTES
    for file in files:
        data = read_regular(file, left)  # FileTooLarge: the directory's files, in all
        left -= len(data)
        found.append((str(file), data))
    return found


def read_documents(filename: str) -> list[Any]:
    """Every YAML document ``-f`` names (see :func:`_inputs`), each file within the
    bounds above, duplicate keys refused (two manifests joined without ``---`` would
    otherwise lose the first silently)."""
    try:
        inputs = _inputs(filename)
    except FileTooLarge:
        name = "<stdin>" if filename == "-" else filename
        raise CommandError(f"{name}: larger than {MAX_MANIFEST_BYTES // (1024 * 1024)} MiB, "
                           "the most manifests are read") from None
    except OSError as exc:
        raise CommandError(f"cannot read {filename}: {exc.strerror or exc}") from None
    documents: list[Any] = []
    for source, data in inputs:
        try:
            documents += load(decode(data, source), source, every=True,
                              max_values=max(MAX_VALUES, len(data)))
        except DocumentError as exc:
            raise CommandError(str(exc)) from None
    return documents

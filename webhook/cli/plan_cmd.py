"""``swapwise plan``: what will swapwise do to my density, on this node shape?

Reads manifests like ``preview`` (same profile choice, same engine), then prints per
workload the memory before/after, each container's swap share and whether its cold
memory fits it, the pod overhead of its RuntimeClass, pods per node by memory, CPU and
max pods, before and after, and swap backing: the pod's need against the node's
per-mille (a node that does not back the pod, where placement requires backing, fits 0).
The math lives in :mod:`webhook.analysis.planner` and :mod:`webhook.analysis.overhead`;
this module only reads input and formats output.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TextIO

from webhook.analysis.hpa import HpaWarning, manifest_warnings
from webhook.analysis.overhead import (
    Overhead,
    OverheadError,
    RuntimeClass,
    collect_runtime_classes,
    is_runtime_class,
)
from webhook.analysis.planner import (
    DEFAULT_MAX_PODS,
    Backing,
    ContainerPlan,
    Density,
    Node,
    PlanError,
    PodPlan,
)
from webhook.analysis.planner import plan_pod as plan_one_pod
from webhook.analysis.workloads import Workload, iter_objects
from webhook.base.quantity import (
    QuantityError,
    parse_bytes,
    parse_quantity,
    readable_bytes,
    readable_ratio,
)
from webhook.cli.common import (
    NO_WORKLOAD,
    CommandError,
    fail,
    policy_for_workloads,
    read_documents,
    reshape_workloads,
)
from webhook.engine.backing import PERMILLE_LABEL
from webhook.engine.pod import MalformedPod
from webhook.engine.warnings import whole
from webhook.policy import Policy

REPLICATED = ("Deployment", "StatefulSet", "ReplicaSet")


def register(subcommands: Any) -> None:
    parser = subcommands.add_parser(
        "plan", help="pods per node before and after reshaping, on a given node shape"
    )
    parser.add_argument("-f", "--filename", required=True,
                        help="YAML or JSON file, - for stdin, or a directory (its .yaml, .yml "
                             "and .json files); at most 16 MiB")
    parser.add_argument("--node-memory", required=True,
                        help="node memory capacity, e.g. 30Gi (swap shares divide by it)")
    parser.add_argument("--node-swap", required=True, help="node swap capacity, e.g. 375Gi")
    parser.add_argument("--node-cpu", required=True, help="node allocatable CPU, e.g. 8 or 7910m")
    parser.add_argument("--allocatable-memory",
                        help="memory the scheduler may hand out (default: --node-memory)")
    parser.add_argument("--max-pods", type=int, default=DEFAULT_MAX_PODS,
                        help=f"kubelet maxPods (default {DEFAULT_MAX_PODS})")
    parser.add_argument("--policy", help="policy file (default: built-in policy)")
    parser.add_argument("--profile", help="profile (may be omitted with a one-profile policy)")
    parser.add_argument("--namespace", "-n", help="namespace, for per-namespace overrides")
    parser.add_argument("--runtime-class-file", metavar="FILE",
                        help="RuntimeClass manifests, for the pod overhead of pods that name "
                             "one in runtimeClassName (RuntimeClasses in -f count too)")
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table")
    parser.set_defaults(func=run)


@dataclass(frozen=True)
class WorkloadPlan:
    workload: Workload
    profile: str
    pod: PodPlan
    hpa: tuple[HpaWarning, ...] = ()  # HPAs of the input whose memory utilisation rises

    @property
    def replicas(self) -> int | None:
        """Pods a replicated workload asks for; None for the others (a DaemonSet runs one
        per node, a Pod or Job is not planned in nodes)."""
        if self.workload.kind in REPLICATED:
            return self.workload.replicas
        return None


def _quantity(flag: str, value: str, parse: Any) -> Any:
    try:
        return parse(value)
    except QuantityError as exc:
        raise CommandError(f"{flag}: {exc}") from None


def node_from(args: argparse.Namespace) -> Node:
    allocatable = args.allocatable_memory
    try:
        return Node(
            memory=_quantity("--node-memory", args.node_memory, parse_bytes),
            swap=_quantity("--node-swap", args.node_swap, parse_bytes),
            cpu=_quantity("--node-cpu", args.node_cpu, parse_quantity),
            allocatable_memory=(
                _quantity("--allocatable-memory", allocatable, parse_bytes)
                if allocatable is not None else None
            ),
            max_pods=args.max_pods,
        )
    except PlanError as exc:
        raise CommandError(str(exc)) from None


def runtime_classes_from(
    documents: list[Any], extra: list[Any] | None = None
) -> dict[str, RuntimeClass]:
    """RuntimeClasses of the input and of ``--runtime-class-file`` (which holds nothing else)."""
    objects = list(iter_objects(documents))
    if extra is not None:
        extra_objects = list(iter_objects(extra))
        for obj in extra_objects:
            if not is_runtime_class(obj):
                kind = obj.get("kind") if isinstance(obj, dict) else type(obj).__name__
                raise CommandError(f"--runtime-class-file: {kind} is not a RuntimeClass")
        if not extra_objects:
            raise CommandError("--runtime-class-file: no RuntimeClass in the file")
        objects += extra_objects
    try:
        return collect_runtime_classes(objects)
    except OverheadError as exc:
        raise CommandError(str(exc)) from None


def plan(
    documents: list[Any], policy: Policy, profile_name: str | None, namespace: str | None,
    node: Node, runtime_classes: dict[str, RuntimeClass] | None = None,
) -> list[WorkloadPlan]:
    if runtime_classes is None:
        runtime_classes = runtime_classes_from(documents)
    plans: list[WorkloadPlan] = []
    objects = list(iter_objects(documents))
    for _obj, case in reshape_workloads(objects, policy, profile_name, namespace):
        if case is None:
            continue
        workload, reshaped = case.workload, case.reshaped
        try:
            result = plan_one_pod(reshaped, node, runtime_classes=runtime_classes)
        except (MalformedPod, OverheadError) as exc:
            raise CommandError(f"{workload.ref}: {exc}") from None
        hpa: list[HpaWarning] = []
        if reshaped.changed:  # as admitted, before and after (the VPA's marks count)
            hpa = manifest_warnings(objects, workload.kind, workload.name, workload.namespace,
                                    reshaped.pod, reshaped.after)
        plans.append(WorkloadPlan(workload, reshaped.profile.name, result, tuple(hpa)))
    if not plans:
        raise CommandError(NO_WORKLOAD)
    return plans


# ------------------------------------------------------------------------------ table


def _size(value: int | None) -> str:
    return "-" if value is None else readable_bytes(value)


def _ratio(value: Fraction | None) -> str:
    return "-" if value is None else readable_ratio(value)


def _cores(value: Fraction) -> str:
    return _ratio(value) if value >= 1 or not value else f"{math.ceil(value * 1000)}m"


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _align(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in rows]


def _change(before: int | None, after: int | None) -> str:
    return _size(after) if before == after else f"{_size(before)} -> {_size(after)}"


def _fits(container: ContainerPlan) -> str:
    if not container.swap_eligible:
        return "no swap"
    if container.fits is None:
        return "no limit"
    if container.fits:
        return "yes"
    return f"no (needs request >= {_size(container.fit_request)})"


def _density_row(label: str, density: Density, replicas: int | None) -> list[str]:
    nodes = density.nodes_for(replicas) if replicas is not None else None
    return [
        label, _size(density.memory_request), _cores(density.cpu_request),
        _count(density.by_memory), _count(density.by_cpu), str(density.by_pods),
        str(density.per_node), ",".join(density.binds),
        _count(nodes) if replicas is not None else "-",
    ]


def _overhead_line(overhead: Overhead) -> str:
    if not overhead:
        return f"pod overhead: none ({overhead.source} declares none)"
    return (f"pod overhead ({overhead.source}): memory {_size(overhead.memory)}, cpu "
            f"{_cores(overhead.cpu)}; included in MEMORY and CPU below, covered by no "
            "container's swap share")


def _verdict(result: PodPlan) -> str:
    node = f"swapRatio: node {_ratio(result.swap_ratio)}"
    needed = result.needed_swap_ratio
    if needed is None:
        return f"{node}; no container uses swap on this node"
    if result.fits:
        return f"{node}, needed {_ratio(needed)}: cold memory fits in swap"
    return (f"{node}, needed {_ratio(needed)}: cold memory does NOT fit; raise the requests "
            "marked above, or use a node with more swap")


def backing_line(backing: Backing) -> str:
    """One line: the pod's need, the node's per-mille, and what the scheduler does with them."""
    figures = (f"pod needs {PERMILLE_LABEL} >= {backing.need}, node has "
               f"{backing.node_permille}")
    if backing.applies and backing.backed:
        return f"backing: {figures}: backed"
    if backing.applies:
        return (f"backing: {figures}: NOT backed: placement requires backing, so the scheduler "
                "puts none of these pods on such a node (fits 0); give the node swap of at "
                f"least {backing.need} per mille of its memory, or lower the profile's swapRatio")
    verdict = "would be backed" if backing.backed else "would NOT be backed"
    return (f"backing: off ({backing.off}): {figures}: {verdict}, not enforced by the "
            "scheduler (pods per node counted on resources alone)")


def render_table(node: Node, plans: list[WorkloadPlan]) -> str:
    lines = [
        f"node: memory {_size(node.memory)} (schedulable {_size(node.schedulable_memory)}), "
        f"swap {_size(node.swap)}, cpu {_cores(node.cpu)}, max pods {node.max_pods}; "
        f"swap/RAM {_ratio(node.swap_ratio)}; {PERMILLE_LABEL} {node.permille}",
    ]
    for item in plans:
        result = item.pod
        head = f"{item.workload.ref}"
        if item.workload.namespace:
            head += f" -n {item.workload.namespace}"
        head += f"  profile {item.profile}"
        if item.replicas is not None:
            head += f"  replicas {item.replicas}"
        if result.skipped:
            head += f"  (left unchanged: {result.skipped})"
        lines += ["", head]
        rows = [["CONTAINER", "KIND", "MEMORY REQUEST", "LIMIT", "SWAP SHARE", "COLD", "FITS"]]
        for c in result.containers:
            rows.append([
                c.name, c.kind, _change(c.request_before, c.request_after),
                _change(c.limit_before, c.limit_after), _size(c.swap_share) if c.swap_share
                else "-", _size(c.cold), _fits(c),
            ])
        lines += _align(rows)
        if result.overhead.source is not None:
            lines.append(f"  {_overhead_line(result.overhead)}")
        rows = [["PODS/NODE", "MEMORY", "CPU", "BY MEMORY", "BY CPU", "BY PODS", "PER NODE",
                 "BINDS", "NODES"]]
        rows.append(_density_row("before", result.before, item.replicas))
        rows.append(_density_row("after", result.after, item.replicas))
        lines += ["", *_align(rows)]
        lines.append(f"  {_verdict(result)}")
        lines.append(f"  {backing_line(result.backing)}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------- json


def _density_json(density: Density, replicas: int | None) -> dict[str, Any]:
    return {
        "memoryRequest": density.memory_request,
        "cpuRequest": float(density.cpu_request),
        "overheadMemory": density.overhead_memory,
        "overheadCpu": float(density.overhead_cpu),
        "byMemory": density.by_memory,
        "byCpu": density.by_cpu,
        "byPods": density.by_pods,
        "perNode": density.per_node,
        "binds": list(density.binds),
        "nodesNeeded": density.nodes_for(replicas) if replicas is not None else None,
    }


def _float(value: Fraction | None) -> float | None:
    return None if value is None else float(value)


def render_json(node: Node, plans: list[WorkloadPlan]) -> str:
    """Bytes as integers, CPU in cores, ratios as floats: for scripts."""
    workloads = []
    for item in plans:
        result = item.pod
        workloads.append({
            "kind": item.workload.kind,
            "name": item.workload.name,
            "namespace": item.workload.namespace,
            "profile": item.profile,
            "replicas": item.replicas,
            "skipped": result.skipped,
            "warnings": [whole(message) for message in result.warnings],
            "containers": [
                {
                    "name": c.name,
                    "kind": c.kind,
                    "before": {"request": c.request_before, "limit": c.limit_before},
                    "after": {"request": c.request_after, "limit": c.limit_after},
                    "changed": c.changed,
                    "swapEligible": c.swap_eligible,
                    "swapShare": c.swap_share,
                    "coldMemory": c.cold,
                    "fits": c.fits,
                    "fitRequest": c.fit_request,
                    "neededSwapRatio": _float(c.needed_swap_ratio),
                }
                for c in result.containers
            ],
            "overhead": {
                "memory": result.overhead.memory,
                "cpu": float(result.overhead.cpu),
                "source": result.overhead.source,
            },
            "hpa": [warning.to_json() for warning in item.hpa],
            "before": _density_json(result.before, item.replicas),
            "after": _density_json(result.after, item.replicas),
            "swapRatio": {
                "node": float(result.swap_ratio),
                "needed": _float(result.needed_swap_ratio),
                "fits": result.fits,
            },
            # after.perNode is 0 when the node does not back the pod and backing applies.
            "backing": {
                "need": result.backing.need,
                "nodePermille": result.backing.node_permille,
                "backed": result.backing.backed,
                "applies": result.backing.applies,
                "off": result.backing.off,
            },
        })
    document = {
        "node": {
            "memory": node.memory,
            "allocatableMemory": node.schedulable_memory,
            "swap": node.swap,
            "cpu": float(node.cpu),
            "maxPods": node.max_pods,
            "swapRatio": float(node.swap_ratio),
            "swapPermille": node.permille,
        },
        "workloads": workloads,
    }
    return json.dumps(document, indent=2) + "\n"


def _print_warnings(plans: list[WorkloadPlan], out: TextIO) -> None:
    for item in plans:
        for message in item.pod.warnings:
            print(f"Warning: {item.workload.ref}: {whole(message)}", file=out)
        for warning in item.hpa:
            print(f"Warning: {item.workload.ref}: {warning.message()}", file=out)


def run(args: argparse.Namespace) -> int:
    try:
        node = node_from(args)
        policy = policy_for_workloads(args.policy, args.profile)
        documents = read_documents(args.filename)
        extra = (read_documents(args.runtime_class_file)
                 if args.runtime_class_file is not None else None)
        runtime_classes = runtime_classes_from(documents, extra)
        plans = plan(documents, policy, args.profile, args.namespace, node, runtime_classes)
    except CommandError as exc:
        return fail(str(exc))
    _print_warnings(plans, sys.stderr)
    render = render_json if args.output == "json" else render_table
    sys.stdout.write(render(node, plans))
    return 0

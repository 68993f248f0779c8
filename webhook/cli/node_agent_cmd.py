"""``swapwise node-agent``: one per node (the chart's DaemonSet), reading its own node.

It learns the node's swap devices (``/proc/swaps``), its kubelet's ``swapBehavior`` (the
local kubelet's ``/configz``, or the declared label) and its memory and CPU pressure (kernel
PSI), and writes only its own Node, only ``swapwise.io/`` keys, only on change (docs/
node-agent.md). Nothing here imports the webhook's server or the policy model: the agent
runs on every node and keeps to a few tens of MiB.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from fractions import Fraction
from pathlib import Path
from typing import Any

from webhook.agent.stall import CPU_DEFAULTS, MEMORY_DEFAULTS


def _fraction(text: str) -> Fraction:
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from exc
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 1")
    return value


def register(subcommands: Any) -> None:
    parser = subcommands.add_parser(
        "node-agent",
        help="label this node from what it measures (swap devices, kubelet swapBehavior, "
             "memory and CPU pressure); one per node, writes only its own Node",
    )
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                        help="this node's name (default $NODE_NAME, from the downward API)")
    parser.add_argument("--kubeconfig",
                        help="kubeconfig file (default: the pod's service account)")
    parser.add_argument(
        "--swap-behavior-source", choices=["declared", "kubelet"], default="declared",
        help="where the kubelet's swapBehavior is learnt: 'declared' = the node label "
             "swapwise.io/swap-behavior=LimitedSwap|NoSwap (default), 'kubelet' = the local "
             "kubelet's /configz, called directly (RBAC nodes/configz get, never nodes/proxy)")
    parser.add_argument("--kubelet-address",
                        help="the kubelet's address (default: the node's InternalIP)")
    parser.add_argument("--kubelet-port", type=int,
                        help="the kubelet's port (default: the node's daemonEndpoints, 10250)")
    parser.add_argument("--kubelet-ca",
                        help="CA that signed the kubelet's serving certificate (default: the "
                             "service account's CA)")
    parser.add_argument("--kubelet-insecure-tls", action="store_true",
                        help="do not check the kubelet's serving certificate (self-signed "
                             "kubelet certificates, kubeadm's default)")
    parser.add_argument("--zram-backing", type=_fraction, default=Fraction(0), metavar="F",
                        help="how much of a zram device's size counts as backing swap, 0-1 "
                             "(default 0: zram's pages live in RAM)")
    parser.add_argument("--host-proc", default="/proc", help="the host's /proc (default /proc)")
    parser.add_argument("--host-sys", default="/sys", help="the host's /sys (default /sys)")
    parser.add_argument("--host-cgroup", default="/sys/fs/cgroup",
                        help="the host's cgroup2 mount (default /sys/fs/cgroup)")
    parser.add_argument("--kubepods-cgroup",
                        help="the pods' cgroup under it (default: kubepods.slice or kubepods)")
    marks = parser.add_argument_group(
        "pressure marks", "mark the node swapwise.io/memory-pressure or swapwise.io/cpu-"
        "pressure while the kernel's PSI stays high, so new reshaped pods are not placed "
        "there; nothing is evicted")
    marks.add_argument("--pressure-marks", action=argparse.BooleanOptionalAction, default=True,
                       help="mark under pressure (default on; off removes the marks)")
    marks.add_argument("--mark-with", choices=("label", "taint"), default="label",
                       help="label (default): keeps only new reshaped pods off, but a kubelet "
                       "restarted while the node is marked fails the reshaped pods on it; "
                       "taint: a NoSchedule taint, which such a restart ignores, but which "
                       "keeps every pod that does not tolerate it off")
    for resource, defaults in (("memory", MEMORY_DEFAULTS), ("cpu", CPU_DEFAULTS)):
        marks.add_argument(f"--{resource}-marks", action=argparse.BooleanOptionalAction,
                           default=True, help=f"mark {resource} pressure (default on; off "
                           f"removes the {resource} mark)")
        marks.add_argument(f"--{resource}-mark-above", type=float, default=defaults.mark_above,
                           metavar="PCT", help=f"mark when {resource} PSI some is at or above "
                           f"this percent of the mark window (default {defaults.mark_above:g})")
        marks.add_argument(f"--{resource}-clear-below", type=float,
                           default=defaults.clear_below, metavar="PCT",
                           help=f"clear when it stays below this percent of the clear window "
                           f"(default {defaults.clear_below:g})")
    marks.add_argument("--mark-window", type=float, default=MEMORY_DEFAULTS.mark_window,
                       metavar="S", help="seconds of stall that mark (default "
                       f"{MEMORY_DEFAULTS.mark_window:g}; kernel triggers watch up to 10)")
    marks.add_argument("--clear-window", type=float, default=MEMORY_DEFAULTS.clear_window,
                       metavar="S", help="seconds of calm that clear (default "
                       f"{MEMORY_DEFAULTS.clear_window:g})")
    parser.add_argument("--resync", type=float, default=3600.0, metavar="S",
                        help="seconds between fresh reads of the Node (default 3600)")
    parser.add_argument("--metrics-host", default="0.0.0.0",
                        help="listen address for /healthz, /readyz, /metrics (default 0.0.0.0)")
    parser.add_argument("--metrics-port", type=int, default=8080,
                        help="plain-HTTP port for /healthz, /readyz, /metrics (default 8080)")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=run)


def _fail(message: str) -> int:
    print(f"swapwise: error: node-agent: {message}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    from webhook.agent.kernel import HostPaths
    from webhook.agent.kubelet import Kubelet, kubelet_context
    from webhook.agent.nodeapi import ApiConfig, ApiError, NodeApi
    from webhook.agent.run import Agent, AgentOptions
    from webhook.agent.stall import Thresholds
    from webhook.base.logs import configure
    from webhook.engine.nodes import as_mapping

    if not args.node_name:
        return _fail("no node name: give --node-name or set NODE_NAME")
    if not 0 < args.metrics_port < 65536:
        return _fail(f"--metrics-port {args.metrics_port} is out of range")
    if not 60 <= args.resync <= 86400:  # NaN too
        return _fail("--resync must be between 60 and 86400 seconds")
    try:
        thresholds = {
            resource: Thresholds(getattr(args, f"{resource}_mark_above"),
                                 getattr(args, f"{resource}_clear_below"),
                                 args.mark_window, args.clear_window)
            for resource in ("memory", "cpu")}
        config = (ApiConfig.from_kubeconfig(Path(args.kubeconfig)) if args.kubeconfig
                  else ApiConfig.in_cluster())
    except (ValueError, ApiError, OSError) as exc:
        return _fail(str(exc))
    configure(args.log_level)
    options = AgentOptions(node=args.node_name, source=args.swap_behavior_source,
                           zram_backing=args.zram_backing, pressure=args.pressure_marks,
                           resources=tuple(r for r in ("memory", "cpu")
                                           if getattr(args, f"{r}_marks")),
                           mark_with=args.mark_with, thresholds=thresholds,  # type: ignore[arg-type]
                           resync=args.resync)
    paths = HostPaths(Path(args.host_proc), Path(args.host_sys), Path(args.host_cgroup),
                      args.kubepods_cgroup)
    ca = args.kubelet_ca or (None if args.kubeconfig else "/var/run/secrets/kubernetes.io/"
                             "serviceaccount/ca.crt")
    context = kubelet_context(ca, args.kubelet_insecure_tls)

    def kubelet_of(node: dict[str, Any]) -> Kubelet:
        """The kubelet this node's status names, unless the flags say otherwise."""
        status = as_mapping(node.get("status"))
        address = args.kubelet_address or next(
            (a.get("address") for a in status.get("addresses") or []
             if isinstance(a, dict) and a.get("type") == "InternalIP"), "127.0.0.1")
        port = args.kubelet_port or as_mapping(as_mapping(status.get(
            "daemonEndpoints")).get("kubeletEndpoint")).get("Port") or 10250
        return Kubelet(str(address), int(port), context, config.bearer)

    agent = Agent(options, NodeApi(config), paths, kubelet_factory=kubelet_of)
    stop = threading.Event()

    def on_signal(_signum: int, _frame: Any) -> None:
        stop.set()
        agent.waker.wake()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        agent.run(stop, args.metrics_host, args.metrics_port)
    except OSError as exc:  # the metrics port taken, say
        return _fail(str(exc))
    return 0

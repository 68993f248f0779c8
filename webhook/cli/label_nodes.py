"""``swapwise label-nodes``: the controller that keeps the swap label true to the nodes.

A swap node has swap capacity and a kubelet running ``swapBehavior: LimitedSwap``; where the
behaviour is learnt from is ``--swap-behavior-source`` (see docs/labeller.md). Swap nodes
also get ``swapwise.io/swap-permille``, their swap capacity per mille of their memory.
"""

from __future__ import annotations

import argparse
from typing import Any

from webhook.cli.common import fail
from webhook.profile import SWAP_LABEL


def register(subcommands: Any) -> None:
    parser = subcommands.add_parser(
        "label-nodes",
        help="label exactly the swap nodes: swap capacity and kubelet swapBehavior "
             "LimitedSwap, with swapwise.io/swap-permille (controller, leader-elected)",
    )
    parser.add_argument("--kubeconfig",
                        help="kubeconfig file (default: in-cluster, else $KUBECONFIG or "
                             "~/.kube/config)")
    parser.add_argument("--label", default=f"{SWAP_LABEL}=true",
                        help=f"label to manage, key=value (default {SWAP_LABEL}=true)")
    parser.add_argument("--lease-name", default="swapwise-labeller",
                        help="Lease for leader election (default swapwise-labeller)")
    parser.add_argument("--lease-namespace",
                        help="namespace of the Lease (default: the kubeconfig's or the pod's)")
    parser.add_argument("--identity", help="leader election identity (default hostname_pid)")
    parser.add_argument("--metrics-host", default="0.0.0.0",
                        help="listen address for /healthz, /readyz, /metrics (default 0.0.0.0)")
    parser.add_argument("--metrics-port", type=int, default=8080,
                        help="plain-HTTP port for /healthz, /readyz, /metrics (default 8080)")
    parser.add_argument("--lease-duration", type=float, default=15.0,
                        help="seconds a non-renewed Lease stays valid (default 15)")
    parser.add_argument("--renew-deadline", type=float, default=10.0,
                        help="seconds the leader keeps acting without a renewal (default 10)")
    parser.add_argument("--retry-period", type=float, default=2.0,
                        help="seconds between acquire/renew attempts (default 2)")
    parser.add_argument("--resync", type=float, default=300.0,
                        help="seconds between full re-checks of every node (default 300)")
    parser.add_argument(
        "--swap-behavior-source", choices=["declared", "kubelet"], default="declared",
        help="where each node's kubelet swapBehavior is learnt: 'declared' = the node label "
             "swapwise.io/swap-behavior=LimitedSwap|NoSwap (default; no extra permission), "
             "'kubelet' = the kubelet's /configz through the API server (needs RBAC "
             "nodes/proxy get, which reaches the whole kubelet API of every node)")
    parser.add_argument("--kubelet-config-ttl", type=float, default=300.0,
                        help="with --swap-behavior-source kubelet: seconds a kubelet's answer "
                             "is reused before it is read again (default 300; every --resync "
                             "reads all again)")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # The Kubernetes client is only needed by this command: import it here.
    from webhook.engine.backing import PERMILLE_LABEL
    from webhook.labeller.labels import Label, LabelError
    from webhook.labeller.lease import Timing
    from webhook.labeller.run import LabellerOptions, default_identity, serve

    if not 0 < args.metrics_port < 65536:
        return fail(f"--metrics-port {args.metrics_port} is out of range")
    if args.resync <= 0:
        return fail("--resync must be greater than zero")
    if not args.kubelet_config_ttl > 0:  # NaN too
        return fail("--kubelet-config-ttl must be greater than zero")
    try:
        label = Label.parse(args.label)
        if label.key == PERMILLE_LABEL:
            raise LabelError(f"{args.label!r}: {PERMILLE_LABEL} is the per-mille label "
                             "label-nodes always manages; choose another swap label")
        options = LabellerOptions(
            kubeconfig=args.kubeconfig,
            label=label,
            lease_name=args.lease_name,
            lease_namespace=args.lease_namespace,
            identity=args.identity or default_identity(),
            host=args.metrics_host,
            port=args.metrics_port,
            timing=Timing(args.lease_duration, args.renew_deadline, args.retry_period),
            resync_seconds=args.resync,
            swap_behavior_source=args.swap_behavior_source,
            kubelet_config_ttl=args.kubelet_config_ttl,
            log_level=args.log_level,
        )
    except (LabelError, ValueError) as exc:
        return fail(f"label-nodes: {exc}")
    try:
        serve(options)
    except Exception as exc:  # e.g. no kubeconfig: say so instead of a traceback
        return fail(f"label-nodes: {exc}")
    return 0

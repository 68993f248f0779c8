"""``swapwise label-nodes``: the controller that keeps the swap label true to the nodes.

A swap node has swap capacity and a kubelet running ``swapBehavior: LimitedSwap``; where the
behaviour is learnt from is ``--swap-behavior-source`` (see docs/labeller.md). Swap nodes
also get ``swapwise.io/swap-permille``, their swap capacity per mille of their memory, and,
with ``--pressure-guard``, ``swapwise.io/memory-pressure`` while their memory PSI stays high.
"""

from __future__ import annotations

import argparse
from typing import Any

from webhook.cli.common import fail
from webhook.labeller import pressure as defaults
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
    parser.add_argument("--kubelet-timeout", type=float, default=5.0,
                        help="seconds one read of a kubelet (/configz, the Summary) may take "
                             "through the API server before it counts as failed (default 5)")
    guard = parser.add_argument_group(
        "pressure guard",
        "mark a swap node swapwise.io/memory-pressure=true while its memory PSI (kubelet "
        "Summary, through the API server: needs RBAC nodes/proxy get) stays high, so new "
        "reshaped pods are not placed there; swapwise evicts nothing (docs/labeller.md)")
    guard.add_argument("--pressure-guard", action=argparse.BooleanOptionalAction,
                       default=False, help="turn the guard on (default off; when off, marks "
                       "left on nodes are removed)")
    guard.add_argument("--pressure-interval", type=float, default=defaults.DEFAULT_INTERVAL,
                       metavar="S", help="seconds between reads of each swap node "
                       f"(default {defaults.DEFAULT_INTERVAL:g})")
    # The hysteresis: a threshold and how long every read must stay past it, each way.
    for flag, default, metavar, text in (
        ("--pressure-mark-above", defaults.DEFAULT_MARK_ABOVE, "PCT",
         "mark when memory PSI some avg10 is at or above this percentage on every read..."),
        ("--pressure-mark-after", defaults.DEFAULT_MARK_AFTER, "S",
         "...for at least this many seconds"),
        ("--pressure-clear-below", defaults.DEFAULT_CLEAR_BELOW, "PCT",
         "clear when it is below this percentage on every read..."),
        ("--pressure-clear-after", defaults.DEFAULT_CLEAR_AFTER, "S",
         "...for at least this many seconds"),
    ):
        guard.add_argument(flag, type=float, default=default, metavar=metavar,
                           help=f"{text} (default {default:g})")
    guard.add_argument("--pressure-mark-with", choices=("label", "taint"), default="label",
                       help="label (default): swapwise.io/memory-pressure=true, which keeps "
                       "only new reshaped pods off, but a kubelet restarted while its node "
                       "is marked fails the reshaped pods on it (it re-admits pods against "
                       "their node affinity); taint: a swapwise.io/memory-pressure=true:"
                       "NoSchedule taint, which such a restart ignores, but which keeps "
                       "every pod that does not tolerate it off")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # The Kubernetes client is only needed by this command: import it here.
    from webhook.engine.backing import PERMILLE_LABEL
    from webhook.engine.pressure import PRESSURE_LABEL
    from webhook.labeller.labels import Label, LabelError
    from webhook.labeller.lease import Timing
    from webhook.labeller.pressure import PressureSettings
    from webhook.labeller.run import LabellerOptions, default_identity, serve

    if not 0 < args.metrics_port < 65536:
        return fail(f"--metrics-port {args.metrics_port} is out of range")
    if args.resync <= 0:
        return fail("--resync must be greater than zero")
    if not args.kubelet_config_ttl > 0:  # NaN too
        return fail("--kubelet-config-ttl must be greater than zero")
    if not 0 < args.kubelet_timeout < 3600:  # NaN too
        return fail("--kubelet-timeout must be between 0 and 3600 seconds")
    try:
        label = Label.parse(args.label)
        if label.key == PERMILLE_LABEL:
            raise LabelError(f"{args.label!r}: {PERMILLE_LABEL} is the per-mille label "
                             "label-nodes always manages; choose another swap label")
        if label.key == PRESSURE_LABEL:
            raise LabelError(f"{args.label!r}: {PRESSURE_LABEL} is the pressure guard's "
                             "mark; choose another swap label")
        # Checked whether the guard is on or not: a bad value must not wait to surface
        # until someone turns it on.
        pressure = PressureSettings(args.pressure_interval, args.pressure_mark_above,
                                    args.pressure_clear_below, args.pressure_mark_after,
                                    args.pressure_clear_after, args.pressure_mark_with)
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
            pressure=pressure if args.pressure_guard else None,
            kubelet_timeout=args.kubelet_timeout,
            log_level=args.log_level,
        )
    except (LabelError, ValueError) as exc:
        return fail(f"label-nodes: {exc}")
    try:
        serve(options)
    except Exception as exc:  # e.g. no kubeconfig: say so instead of a traceback
        return fail(f"label-nodes: {exc}")
    return 0

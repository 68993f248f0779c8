"""Prometheus metrics of the labeller, on a registry of its own (tests stay isolated)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics

disable_created_metrics()  # type: ignore[no-untyped-call]  # `_created` series double the output and no dashboard uses them


class LabellerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.labels_added = Counter(
            "swapwise_labeller_labels_added",
            "Nodes the swap label was put on (the node became a swap node, or the value was "
            "wrong).",
            registry=self.registry,
        )
        self.labels_removed = Counter(
            "swapwise_labeller_labels_removed",
            "Nodes the swap label was removed from (no longer a swap node: no swap capacity, "
            "or swapBehavior not LimitedSwap).",
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "swapwise_labeller_reconcile_errors",
            "Failed node patches (retried with backoff).",
            registry=self.registry,
        )
        self.watch_restarts = Counter(
            "swapwise_labeller_watch_restarts",
            "Node list/watch failures followed by a fresh list.",
            registry=self.registry,
        )
        self.is_leader = Gauge(
            "swapwise_labeller_is_leader",
            "1 while this replica holds the Lease and may patch Nodes, else 0.",
            registry=self.registry,
        )
        self.nodes = Gauge(
            "swapwise_labeller_nodes", "Nodes in the watch cache.", registry=self.registry
        )
        # The two below are the leader's judgement (0 on followers): swap capacity above zero
        # and kubelet swapBehavior LimitedSwap, as read from the configured source.
        self.swap_nodes = Gauge(
            "swapwise_labeller_swap_nodes",
            "Swap nodes: swap capacity above zero and kubelet swapBehavior LimitedSwap.",
            registry=self.registry,
        )
        self.permille_nodes = Gauge(
            "swapwise_labeller_permille_nodes",
            "Swap nodes given the swapwise.io/swap-permille label (fewer than swap nodes: "
            "some report no readable memory capacity).",
            registry=self.registry,
        )
        self.nodes_by_reason = Gauge(
            "swapwise_labeller_nodes_by_reason",
            "Nodes by the reason of the leader's last judgement (LimitedSwap = swap node).",
            ["reason"],
            registry=self.registry,
        )
        self.kubelet_config_errors = Counter(
            "swapwise_labeller_kubelet_config_errors",
            "Failed reads of a kubelet's /configz through the API server (node left unchanged, "
            "retried with backoff).",
            registry=self.registry,
        )
        # The pressure guard (--pressure-guard); the gauges are the leader's (0 or no series
        # on followers, like the judgement gauges above).
        self.pressure_marked_nodes = Gauge(
            "swapwise_labeller_pressure_marked_nodes",
            "Swap nodes carrying the swapwise.io/memory-pressure mark (new reshaped pods are "
            "not placed there).",
            registry=self.registry,
        )
        self.psi_read_errors = Counter(
            "swapwise_labeller_psi_read_errors",
            "Failed or unusable reads of a swap node's memory PSI (kubelet Summary through the "
            "API server); the node's mark and windows are left as they are.",
            registry=self.registry,
        )
        self.pressure_transitions = Counter(
            "swapwise_labeller_pressure_transitions",
            "Memory-pressure marks put on (action=mark) and taken off (action=clear) nodes.",
            ["action"],
            registry=self.registry,
        )
        self.memory_psi = Gauge(
            "swapwise_labeller_memory_psi_avg10_percent",
            "The last memory PSI avg10 read from each swap node's kubelet, in percent "
            "(kind=some: some task waited on memory; kind=full: all did). No series while "
            "the node cannot be read.",
            ["node", "kind"],
            registry=self.registry,
        )
        self.pressure_threshold = Gauge(
            "swapwise_labeller_pressure_threshold_percent",
            "The guard's thresholds on memory PSI some avg10: bound=mark (mark at or above) "
            "and bound=clear (clear below). No series while the guard is off.",
            ["bound"],
            registry=self.registry,
        )

"""Prometheus metrics of the node agent, on a registry of its own (tests stay isolated).

One agent per node, so each series is one node's (the scrape's ``instance``/``node``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics

disable_created_metrics()  # type: ignore[no-untyped-call]  # `_created` series double the output and no dashboard uses them


class AgentMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.swap_node = Gauge(
            "swapwise_node_agent_swap_node",
            "1 when this node is a swap node (LimitedSwap and swap), 0 when not, -1 unknown.",
            registry=r)
        self.permille = Gauge(
            "swapwise_node_agent_swap_permille",
            "The swapwise.io/swap-permille this node carries (backing swap per mille of "
            "memory); -1 without one.", registry=r)
        self.swap_bytes = Gauge(
            "swapwise_node_agent_swap_bytes", "Swap devices' size by kind (disk, zram).",
            ["kind"], registry=r)
        self.marked = Gauge(
            "swapwise_node_agent_pressure_marked",
            "1 while this node carries the resource's pressure mark.", ["resource"],
            registry=r)
        self.share = Gauge(
            "swapwise_node_agent_pressure_stall_percent",
            "Percent of the mark window some task of the scope waited for the resource "
            "(kernel PSI some): scope node or kubepods.", ["resource", "scope"], registry=r)
        self.threshold = Gauge(
            "swapwise_node_agent_pressure_threshold_percent",
            "The stall percent that marks (edge mark) and that clears (edge clear).",
            ["resource", "edge"], registry=r)
        self.transitions = Counter(
            "swapwise_node_agent_pressure_transitions",
            "Pressure marks put on (to=marked) and taken off (to=cleared).",
            ["resource", "to"], registry=r)
        self.patches = Counter(
            "swapwise_node_agent_patches", "Patches of this Node by result (ok, conflict, "
            "error).", ["result"], registry=r)
        self.node_events = Counter(
            "swapwise_node_agent_node_events",
            "Watch events of this Node received (each one re-checks what the node carries).",
            registry=r)
        self.watch_restarts = Counter(
            "swapwise_node_agent_watch_restarts",
            "Node watches that ended in an error or at once (retried with backoff).",
            registry=r)
        self.kubelet_errors = Counter(
            "swapwise_node_agent_kubelet_config_errors",
            "Failed reads of the local kubelet's /configz.", registry=r)
        self.kernel_errors = Counter(
            "swapwise_node_agent_kernel_read_errors",
            "Failed reads of /proc/swaps or a PSI file.", registry=r)
        self.triggers = Gauge(
            "swapwise_node_agent_psi_triggers",
            "1 when kernel PSI triggers wake the agent, 0 when it reads PSI once a second.",
            registry=r)
        # Known from the start: "unknown" until the Node and the facts are read, and every
        # labelled counter at 0, so that its first event is an increase (Prometheus counts no
        # increase into a series' first sample: a single mark would never show in increase()).
        self.swap_node.set(-1)
        self.permille.set(-1)
        for resource in ("memory", "cpu"):
            for to in ("marked", "cleared"):
                self.transitions.labels(resource, to)
        for result in ("ok", "conflict", "error"):
            self.patches.labels(result)

"""``swapwise label-nodes``: keep the swap label on exactly the nodes that report swap.

The webhook steers reshaped pods to ``feature.node.kubernetes.io/memory-swap=true``; a pod
sent to a node without swap gets a lowered request and no swap, the worst of both. Since
Kubernetes 1.33 each Node reports ``status.nodeInfo.swap.capacity``, so the label can follow
the truth instead of a node-pool convention. Layout:

- :mod:`.labels`: pure decision, node dict -> label change;
- :mod:`.lease`: pure leader-election rules and the Lease-based elector;
- :mod:`.controller`: the list/watch cache and the reconcile loop;
- :mod:`.kube`: the lightkube adapter (the only module that talks to the API server);
- :mod:`.health`, :mod:`.metrics`: health, readiness and Prometheus metrics;
- :mod:`.run`: wiring, signals and shutdown.
"""

"""``swapwise label-nodes``: keep the swap label on exactly the swap nodes.

The webhook steers reshaped pods to ``feature.node.kubernetes.io/memory-swap=true``; a pod
sent to a node where the kubelet gives it no swap gets a lowered request and no swap, the
worst of both. A swap node reports ``status.nodeInfo.swap.capacity`` above zero (Kubernetes
≥ 1.33) *and* runs its kubelet with ``memorySwap.swapBehavior: LimitedSwap``: the default,
``NoSwap``, reports capacity too. Layout:

- :mod:`.labels`: pure decision, node dict + known swapBehavior -> verdict -> merge patch;
- :mod:`.kubelet`: when to read a kubelet's configuration again (cache, backoff);
- :mod:`.lease`: pure leader-election rules and the Lease-based elector;
- :mod:`.controller`: the list/watch cache and the reconcile loop;
- :mod:`.kube`: the lightkube adapter (the only module that talks to the API server);
- :mod:`.health`, :mod:`.metrics`: health, readiness and Prometheus metrics;
- :mod:`.run`: wiring, signals and shutdown.
"""

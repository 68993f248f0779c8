"""Offline analyses: what reshaping does to manifests and to a running cluster.

Pure functions of objects a command read (manifests, or objects listed through the API
server) and the policy, built on :mod:`webhook.engine`'s one reshape: density on a node
shape (``planner``, ``overhead``), autoscalers the reshape affects (``hpa``,
``vpa_manifests``), the pod templates of workloads (``workloads``) and the cluster audit
(``audit``). The commands in :mod:`webhook.cli` do the reading and printing.
"""

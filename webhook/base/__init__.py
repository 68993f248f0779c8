"""The lowest layer, which every other one uses and which uses none of them.

Exact Kubernetes quantities (``quantity``), bounded reads of files a user or the cluster
writes (``files``), YAML documents within bounds (``documents``), JSON on the admission path
(``codec``), the structured log lines of the server and the labeller (``logs``) and CEL
literals (``cel``), with which each rule's CEL twin is written beside it.
"""

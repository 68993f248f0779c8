"""The lowest layer, which every other one uses and which uses none of them.

Exact Kubernetes quantities (``quantity``), bounded reads of files a user or the cluster
writes (``files``), YAML documents within bounds (``documents``), JSON on the admission path
(``codec``), label keys and values as the API server checks them (``labels``), the
structured log lines of the server and the node agent (``logs``), the lightkube client of
the commands that read a cluster (``kubeapi``) and CEL literals (``cel``), with which each
rule's CEL twin is written beside it.
"""

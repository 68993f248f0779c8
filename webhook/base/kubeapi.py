"""The lightkube client of the commands that read a whole cluster (``audit``).

The node agent has its own, smaller client (webhook/agent/kubeapi.py): it reads one Node on
every node, within a few tens of MiB.
"""

from __future__ import annotations

from pathlib import Path

from lightkube import AsyncClient, KubeConfig

FIELD_MANAGER = "swapwise"


def make_client(kubeconfig: str | None) -> AsyncClient:
    """In-cluster service account, else ``--kubeconfig``, else $KUBECONFIG / ~/.kube/config.

    An explicit ``--kubeconfig`` wins over the in-cluster account.
    """
    config = KubeConfig.from_file(Path(kubeconfig)) if kubeconfig else KubeConfig.from_env()
    return AsyncClient(config=config, field_manager=FIELD_MANAGER)

"""The lightkube adapter: the only module of the labeller that talks to the API server.

Nodes cross this boundary as plain dicts (``to_dict()``), so the decision logic reads
``status.nodeInfo.swap`` the same way whatever the installed lightkube-models knows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from webhook.labeller.lease import Conflict, LeaseRecord

FIELD_MANAGER = "swapwise-labeller"
WATCH_SECONDS = 300  # the server ends each watch after this; lightkube resumes it


def make_client(kubeconfig: str | None) -> AsyncClient:
    """In-cluster service account, else ``--kubeconfig``, else $KUBECONFIG / ~/.kube/config.

    An explicit ``--kubeconfig`` wins over the in-cluster account.
    """
    config = KubeConfig.from_file(Path(kubeconfig)) if kubeconfig else KubeConfig.from_env()
    return AsyncClient(config=config, field_manager=FIELD_MANAGER)


def _status(exc: ApiError) -> int:
    return int(exc.status.code or 0)


class KubeLeaseStore:
    """:class:`~webhook.labeller.lease.LeaseStore` on a real Lease object."""

    def __init__(self, client: AsyncClient, name: str, namespace: str) -> None:
        self.client = client
        self.name = name
        self.namespace = namespace

    def _lease(self, record: LeaseRecord) -> Lease:
        return Lease(
            metadata=ObjectMeta(
                name=self.name, namespace=self.namespace,
                resourceVersion=record.resource_version,
            ),
            spec=LeaseSpec(
                holderIdentity=record.holder,
                leaseDurationSeconds=record.duration,
                acquireTime=record.acquire_time,
                renewTime=record.renew_time,
                leaseTransitions=record.transitions,
            ),
        )

    @staticmethod
    def _record(lease: Lease) -> LeaseRecord:
        spec = lease.spec or LeaseSpec()
        return LeaseRecord(
            holder=spec.holderIdentity or "",
            duration=spec.leaseDurationSeconds or 0,
            acquire_time=spec.acquireTime,
            renew_time=spec.renewTime,
            transitions=spec.leaseTransitions or 0,
            resource_version=lease.metadata.resourceVersion if lease.metadata else None,
        )

    async def get(self) -> LeaseRecord | None:
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
        except ApiError as exc:
            if _status(exc) == 404:
                return None
            raise
        return self._record(lease)

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        try:
            lease = await self.client.create(self._lease(record))
        except ApiError as exc:
            if _status(exc) == 409:
                raise Conflict(str(exc)) from exc
            raise
        return self._record(lease)

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        try:
            lease = await self.client.replace(self._lease(record))
        except ApiError as exc:
            if _status(exc) in (404, 409):  # changed, or deleted, since it was read
                raise Conflict(str(exc)) from exc
            raise
        return self._record(lease)


class KubeNodes:
    """:class:`~webhook.labeller.controller.NodeAPI` on the cluster's Nodes."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def list_nodes(self) -> tuple[list[dict[str, Any]], str]:
        """All Nodes, and the resourceVersion to watch from (set even for an empty list)."""
        listing = self.client.list(Node)
        nodes = [node.to_dict() async for node in listing]
        return nodes, listing.resourceVersion

    async def watch_nodes(self, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        events = self.client.watch(
            Node, resource_version=resource_version or None, server_timeout=WATCH_SECONDS
        )
        async for kind, node in events:
            yield kind, node.to_dict()

    async def patch_node_labels(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        node = await self.client.patch(Node, name, patch, patch_type=PatchType.MERGE)
        return node.to_dict()

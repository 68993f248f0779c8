"""The lightkube adapter: the only module of the labeller that talks to the API server.

Nodes cross this boundary as plain dicts (``to_dict()``), so the decision logic reads
``status.nodeInfo.swap`` the same way whatever the installed lightkube-models knows; a
kubelet's ``/configz`` crosses it as decoded JSON, checked by :mod:`.labels`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.core.generic_client import BasicRequest
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from webhook.labeller.lease import Conflict, LeaseRecord

FIELD_MANAGER = "swapwise-labeller"
WATCH_SECONDS = 300  # the server ends each watch after this; lightkube resumes it
CONFIGZ_TIMEOUT = 5.0  # seconds for one /configz read (API server -> kubelet -> back)
CONFIGZ_MAX_BYTES = 1 << 20  # a kubelet configuration is a few KiB; refuse to buffer more


class KubeletConfigError(Exception):
    """A ``/configz`` read that did not give a JSON document (HTTP error, too big, not JSON)."""


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

    async def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of the Node (the labeller's label and annotation only)."""
        node = await self.client.patch(Node, name, patch, patch_type=PatchType.MERGE)
        return node.to_dict()

    async def kubelet_config(self, name: str) -> Any:
        """``GET /api/v1/nodes/{name}/proxy/configz``: the kubelet's running configuration.

        lightkube has no call for the node proxy, so the request is built on its client
        (same server, credentials and TLS). The body is read with a size cap and a short
        timeout: it comes from a kubelet, through the API server, and must not stall or
        swamp the reconcile loop.
        """
        generic = self.client._client
        request = generic.build_adapter_request(BasicRequest(
            method="GET", url=f"api/v1/nodes/{quote(name, safe='')}/proxy/configz",
            headers={"Accept": "application/json"}, timeout=httpx2.Timeout(CONFIGZ_TIMEOUT),
        ))
        response = await generic._client.send(request, stream=True)
        body = bytearray()
        try:
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > CONFIGZ_MAX_BYTES:
                    break
        finally:
            await response.aclose()
        if response.status_code != 200:  # the start of the body says why
            raise KubeletConfigError(f"HTTP {response.status_code}: "
                                     f"{_status_message(bytes(body))}")
        if len(body) > CONFIGZ_MAX_BYTES:
            raise KubeletConfigError(f"configz answer larger than {CONFIGZ_MAX_BYTES} bytes")
        try:
            return json.loads(body)
        except ValueError as exc:  # also UnicodeDecodeError
            raise KubeletConfigError(f"configz answer is not JSON: {exc}") from exc


def _status_message(body: bytes) -> str:
    """The ``message`` of a Kubernetes Status body, else the start of the body as text."""
    text = body[:2000].decode("utf-8", "replace")
    try:
        status = json.loads(body)
    except ValueError:
        return text.strip()[:300] or "(empty body)"
    message = status.get("message") if isinstance(status, dict) else None
    return message if isinstance(message, str) and message else text.strip()[:300]

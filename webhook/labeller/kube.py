"""The lightkube adapter: the only module of the labeller that talks to the API server.

Nodes cross this boundary as plain dicts (``to_dict()``), so the decision logic reads
``status.nodeInfo.swap`` the same way whatever the installed lightkube-models knows; a
kubelet's ``/configz`` crosses it as decoded JSON, checked by :mod:`.labels`, and so does
its Summary (``/stats/summary``), checked by :mod:`.pressure`.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.core.generic_client import BasicRequest
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Event, Node
from lightkube.types import PatchType

from webhook.labeller.lease import Conflict, LeaseRecord

FIELD_MANAGER = "swapwise-labeller"
WATCH_SECONDS = 300  # the server ends each watch after this; lightkube resumes it
KUBELET_TIMEOUT = 5.0  # default seconds for one kubelet read (API server -> kubelet -> back)
CONFIGZ_MAX_BYTES = 1 << 20  # a kubelet configuration is a few KiB; refuse to buffer more
# A CPU-and-memory Summary is about 1 KiB per pod and container: 4 MiB covers a few
# thousand containers.
SUMMARY_MAX_BYTES = 4 << 20
EVENT_NAMESPACE = "default"  # where Events about cluster-scoped objects must go
EVENT_MESSAGE_CHARS = 1024


class KubeletReadError(Exception):
    """A kubelet read through the node proxy that did not give a JSON document (HTTP error,
    too big, not JSON)."""


class KubeletConfigError(KubeletReadError):
    """A ``/configz`` read that did not give a JSON document."""


class KubeletSummaryError(KubeletReadError):
    """A ``/stats/summary`` read that did not give a JSON document."""


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

    def __init__(self, client: AsyncClient, kubelet_timeout: float = KUBELET_TIMEOUT) -> None:
        self.client = client
        self.kubelet_timeout = kubelet_timeout

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
        """``GET /api/v1/nodes/{name}/proxy/configz``: the kubelet's running configuration."""
        return await self._kubelet_json(name, "configz", {}, "configz", CONFIGZ_MAX_BYTES,
                                        KubeletConfigError)

    async def node_summary(self, name: str) -> Any:
        """``GET /api/v1/nodes/{name}/proxy/stats/summary?only_cpu_and_memory=true``: the
        kubelet's Summary, the node's CPU and memory part only (which carries its memory
        PSI), without the filesystem and network figures it would otherwise gather."""
        return await self._kubelet_json(name, "stats/summary", {"only_cpu_and_memory": "true"},
                                        "Summary", SUMMARY_MAX_BYTES, KubeletSummaryError)

    async def _kubelet_json(self, name: str, path: str, params: dict[str, str], what: str,
                            limit: int, error: type[KubeletReadError]) -> Any:
        """A kubelet endpoint through the API server's node proxy, decoded as JSON.

        lightkube has no call for the node proxy, so the request is built on its client
        (same server, credentials and TLS). The body is read with a size cap and a short
        timeout: it comes from a kubelet, through the API server, and must not stall or
        swamp the labeller's loops.
        """
        generic = self.client._client
        request = generic.build_adapter_request(BasicRequest(
            method="GET", url=f"api/v1/nodes/{quote(name, safe='')}/proxy/{path}",
            params=params, headers={"Accept": "application/json"},
            timeout=httpx2.Timeout(self.kubelet_timeout),
        ))
        response = await generic._client.send(request, stream=True)
        body = bytearray()
        try:
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > limit:
                    break
        finally:
            await response.aclose()
        if response.status_code != 200:  # the start of the body says why
            raise error(f"HTTP {response.status_code}: {_status_message(bytes(body))}")
        if len(body) > limit:
            raise error(f"{what} answer larger than {limit} bytes")
        try:
            return json.loads(body)
        except ValueError as exc:  # also UnicodeDecodeError
            raise error(f"{what} answer is not JSON: {exc}") from exc

    async def create_event(self, node: dict[str, Any], event_type: str, reason: str,
                           message: str, instance: str) -> None:
        """A core/v1 Event about ``node``, as ``kubectl describe node`` lists them.

        An Event about a cluster-scoped object must live in the ``default`` namespace (the
        API server's validation), hence the chart's Role there.
        """
        metadata = node.get("metadata") or {}
        name = str(metadata.get("name", ""))
        now = dt.datetime.now(dt.UTC)
        await self.client.create(Event(
            metadata=ObjectMeta(generateName=f"{name}.", namespace=EVENT_NAMESPACE),
            involvedObject=ObjectReference(apiVersion="v1", kind="Node", name=name,
                                           uid=metadata.get("uid")),
            reason=reason, message=message[:EVENT_MESSAGE_CHARS], type=event_type,
            source=EventSource(component=FIELD_MANAGER),
            reportingComponent=f"swapwise.io/{FIELD_MANAGER}", reportingInstance=instance[:128],
            firstTimestamp=now, lastTimestamp=now, count=1,
        ))


def _status_message(body: bytes) -> str:
    """The ``message`` of a Kubernetes Status body, else the start of the body as text."""
    text = body[:2000].decode("utf-8", "replace")
    try:
        status = json.loads(body)
    except ValueError:
        return text.strip()[:300] or "(empty body)"
    message = status.get("message") if isinstance(status, dict) else None
    return message if isinstance(message, str) and message else text.strip()[:300]

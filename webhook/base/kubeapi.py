"""Reading the Kubernetes API within bounds: the client and paged lists for ``audit``.

lightkube builds the requests (paths, credentials, TLS from a kubeconfig or the in-cluster
service account); the paging, the retries and the reading of each answer are here, because
lightkube's own list pages for as long as the server hands out ``continue`` tokens, reads
each page whole (decompressed) before looking at it, and gives up on the first 503 of an API
server that is restarting. The rules are :mod:`webhook.base.upstream`'s: a page cap and a
check for a repeated token, each page counted as it streams after decompression, retries
that back off and say what they retry. A whole-read time limit is the caller's
(:meth:`~webhook.base.upstream.Deadline.run` around the reads): it cancels a read that
drips wherever it is. Nothing here imports the labeller: the node agent reuses it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import orjson
from lightkube import AsyncClient, KubeConfig
from lightkube.core.resource import api_info

from webhook.base.upstream import Backoff, BodyLimit, Pages, shown

FIELD_MANAGER = "swapwise"
PAGE_SIZE = 500  # objects per page: what kubectl asks for
# 1,000 pages of 500: half a million objects of one kind in one namespace, beyond any cluster.
MAX_PAGES = 1000
MAX_PAGE_BYTES = 64 * 1024 * 1024  # 500 of the largest objects the API server stores (1.5 MiB
# each, etcd's limit) would be more; 500 real pods are a few MiB
RETRIED = {429, 500, 502, 503, 504}  # the API server is busy, restarting or behind a proxy
MAX_RETRY_AFTER = 30.0


class KubeError(Exception):
    """A read that failed for good: the message says what and why (escaped); ``status``
    is the HTTP status when the API server answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NotServed(KubeError):
    """The API server does not serve the resource (404): a group/version not installed."""


def make_client(kubeconfig: str | None, field_manager: str = FIELD_MANAGER,
                timeout: float = 30.0) -> AsyncClient:
    """In-cluster service account, else ``--kubeconfig``, else $KUBECONFIG / ~/.kube/config.

    An explicit ``--kubeconfig`` wins over the in-cluster account. ``timeout`` bounds each
    connect and each read; a whole read is bounded by the caller's deadline.
    """
    config = KubeConfig.from_file(Path(kubeconfig)) if kubeconfig else KubeConfig.from_env()
    return AsyncClient(config=config, field_manager=field_manager,
                       timeout=httpx2.Timeout(timeout))


@dataclass(frozen=True)
class ListLimits:
    page_size: int = PAGE_SIZE
    max_pages: int = MAX_PAGES
    max_page_bytes: int = MAX_PAGE_BYTES


def describe(resource: Any, namespace: str | None) -> str:
    """``list pods in namespace team``: what a read is called in messages."""
    plural = api_info(resource).plural
    return f"list {plural}" + (f" in namespace {namespace}" if namespace else "")


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    retry_after: float


def _retry_after(value: str | None) -> float:
    """A Retry-After in seconds (the API server sends whole seconds); 0 when absent or odd."""
    try:
        seconds = float(value) if value is not None else 0.0
    except ValueError:
        return 0.0
    return min(max(seconds, 0.0), MAX_RETRY_AFTER) if seconds == seconds else 0.0


async def _get(client: AsyncClient, resource: Any, namespace: str | None,
               params: dict[str, Any], limit: int, what: str) -> _Answer:
    """One page, its body read within ``limit`` bytes after decompression."""
    generic = client._client  # lightkube builds the request; the read is ours
    request = generic.build_adapter_request(generic.prepare_request(
        "list", res=resource, namespace=namespace, params=params,
        # Only what httpx2 decodes in bounded pieces, so BodyLimit sees every byte.
        headers={"Accept": "application/json", "Accept-Encoding": "gzip, deflate"}))
    response = await generic._client.send(request, stream=True)
    try:
        body = await BodyLimit(limit, f"{what}: a page").read(response.aiter_bytes())
    finally:
        await response.aclose()
    return _Answer(response.status_code, body,
                   _retry_after(response.headers.get("retry-after")))


def status_message(body: bytes) -> str:
    """The ``message`` of a Kubernetes Status body, else the start of the body; escaped."""
    try:
        status = orjson.loads(body)
    except orjson.JSONDecodeError:
        status = None
    message = status.get("message") if isinstance(status, dict) else None
    if isinstance(message, str) and message:
        return shown(message)
    text = body[:300].decode("utf-8", "replace").strip()
    return shown(text) if text else "(empty body)"


def _page(body: bytes, what: str) -> tuple[list[Any], str | None]:
    """A list page's items and its ``continue`` token."""
    try:
        document = orjson.loads(body)  # nesting beyond 1024 levels is refused, not recursed
    except orjson.JSONDecodeError as exc:
        raise KubeError(f"{what}: the answer is not JSON ({shown(exc, 120)})") from None
    items = document.get("items") if isinstance(document, dict) else None
    metadata = document.get("metadata") if isinstance(document, dict) else None
    if not isinstance(items, list) and items is not None:
        raise KubeError(f"{what}: the answer is not a list of objects")
    token = metadata.get("continue") if isinstance(metadata, dict) else None
    return items or [], token if isinstance(token, str) and token else None


async def list_objects(client: AsyncClient, resource: Any, namespace: str | None = None, *,
                       backoff: Backoff, limits: ListLimits = ListLimits()
                       ) -> list[Any]:
    """Every object of ``resource`` (in ``namespace``, or cluster-wide), as the API server
    sent them (dicts; anything else in ``items`` is passed on for the caller to judge).

    Pages of ``limits.page_size``; a token seen before or more than ``limits.max_pages``
    pages end it with :class:`~webhook.base.upstream.PagingError`, a page over
    ``limits.max_page_bytes`` with :class:`~webhook.base.upstream.BodyTooLarge`. A busy or
    restarting server (429, 5xx, a dropped connection) is retried after ``backoff``'s delay,
    which resets once a page arrives; an expired token (410) starts the list again. A 404
    raises :class:`NotServed`, any other refusal :class:`KubeError`.
    """
    what = describe(resource, namespace)
    pages = Pages(what, limits.max_pages)
    items: list[Any] = []
    token: str | None = None
    while True:
        params = {"limit": limits.page_size, "continue": token}
        try:
            answer = await _get(client, resource, namespace, params, limits.max_page_bytes,
                                what)
        except httpx2.TransportError as exc:  # refused, reset, closed early
            await asyncio.sleep(backoff.failed(what, f"{type(exc).__name__}: {exc}"))
            continue
        except httpx2.DecodingError as exc:
            raise KubeError(f"{what}: the answer could not be decompressed: "
                            f"{shown(exc)}") from None
        if answer.status == 200:
            found, next_token = _page(answer.body, what)
            backoff.progressed()
            items += found
            token = pages.next(next_token)
            if token is None:
                return items
            continue
        reason = f"HTTP {answer.status}: {status_message(answer.body)}"
        if answer.status == 410 and token is not None:  # the token expired: start again
            pages.restart()
            items, token = [], None
            await asyncio.sleep(backoff.failed(what, f"{reason} (starting the list again)"))
        elif answer.status in RETRIED:
            await asyncio.sleep(backoff.failed(what, reason, answer.retry_after))
        elif answer.status == 404:
            raise NotServed(f"{what}: {reason}", 404)
        else:
            raise KubeError(f"{what}: {reason}", answer.status)


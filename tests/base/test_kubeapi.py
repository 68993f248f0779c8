"""webhook.base.kubeapi: paged lists against a stand-in API server on loopback.

The whole ``audit`` command against such a server is in tests/test_audit.py; here the
paging rules on their own, with limits small enough to reach.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.core_v1 import Node, Pod

from testkit import fake_upstream as fake
from webhook.base.kubeapi import KubeError, ListLimits, NotServed, list_objects, make_client
from webhook.base.upstream import Backoff, PagingError


def node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}}


def listed(server: fake.Upstream, tmp_path: Path, resource: Any = Node,
           namespace: str | None = None, limits: ListLimits | None = None,
           said: list[str] | None = None) -> list[Any]:
    async def main() -> list[Any]:
        client = make_client(str(fake.kubeconfig(tmp_path / "kubeconfig", server.url)))
        backoff = Backoff(initial=0.01, maximum=0.05,
                          report=(said if said is not None else []).append)
        try:
            return await list_objects(client, resource, namespace, backoff=backoff,
                                      limits=limits or ListLimits())
        finally:
            await client.close()
    return asyncio.run(main())


def test_pages_are_followed_to_the_end_with_the_page_size_asked(tmp_path: Path) -> None:
    pages = {None: ("a", [node("n1")]), "a": ("b", [node("n2")]), "b": (None, [node("n3")])}

    def respond(handler: fake.Handler, method: str, path: str, body: bytes) -> None:
        query = dict(p.split("=", 1) for p in path.partition("?")[2].split("&"))
        token, items = pages[query.get("continue")]
        assert query["limit"] == "2"
        handler.json(200, fake.object_list("Node", items, token))

    with fake.upstream(respond) as server:
        found = listed(server, tmp_path, limits=ListLimits(page_size=2))
    assert [n["metadata"]["name"] for n in found] == ["n1", "n2", "n3"]
    assert len(server.requests) == 3


def test_a_server_that_never_stops_paging_is_stopped_at_the_cap(tmp_path: Path) -> None:
    tokens = itertools.count()

    def respond(handler: fake.Handler, *_: Any) -> None:
        handler.json(200, fake.object_list("Node", [node("n")], f"t{next(tokens)}"))

    with fake.upstream(respond) as server, \
            pytest.raises(PagingError, match="list nodes: more than 5 pages"):
        listed(server, tmp_path, limits=ListLimits(max_pages=5))
    assert len(server.requests) == 5


def test_an_expired_token_starts_the_list_again_once_the_server_allows(
        tmp_path: Path) -> None:
    """410 Gone on a continue token: the list starts again from its first page, and the
    items of the first attempt are not kept twice."""
    state = {"expired": 1}

    def respond(handler: fake.Handler, method: str, path: str, body: bytes) -> None:
        if "continue=a" in path and state["expired"]:
            state["expired"] -= 1
            handler.json(410, fake.status(410, "The provided continue parameter is too old"))
        elif "continue=a" in path:
            handler.json(200, fake.object_list("Node", [node("n2")]))
        else:
            handler.json(200, fake.object_list("Node", [node("n1")], "a"))

    said: list[str] = []
    with fake.upstream(respond) as server:
        found = listed(server, tmp_path, said=said)
    assert [n["metadata"]["name"] for n in found] == ["n1", "n2"]
    assert len(said) == 1 and "starting the list again" in said[0]


def test_retry_after_is_honoured_and_errors_that_will_not_pass_are_not_retried(
        tmp_path: Path) -> None:
    state = {"busy": 1}

    def respond(handler: fake.Handler, method: str, path: str, body: bytes) -> None:
        if "/pods" in path:
            handler.json(401, fake.status(401, "Unauthorized"))
        elif state["busy"]:
            state["busy"] -= 1
            handler.json(429, fake.status(429, "too many requests"), {"Retry-After": "1"})
        else:
            handler.json(200, fake.object_list("Node", [node("n1")]))

    said: list[str] = []
    with fake.upstream(respond) as server:
        assert len(listed(server, tmp_path, said=said)) == 1
        # Backoff's maximum (0.05 s here) caps even a server's Retry-After.
        assert said == [said[0]] and "HTTP 429: too many requests" in said[0]
        with pytest.raises(KubeError, match="list pods in namespace team: HTTP 401: "
                                            "Unauthorized") as failed:
            listed(server, tmp_path, Pod, "team")
        assert failed.value.status == 401
    assert sum("/pods" in r for r in server.requests) == 1


def test_an_api_the_server_does_not_serve_is_named(tmp_path: Path) -> None:
    with fake.upstream(lambda h, *_: h.send(404, b"404 page not found\n", "text/plain")
                       ) as server, pytest.raises(NotServed, match="404 page not found"):
        listed(server, tmp_path)


@pytest.mark.parametrize(("body", "message"), [
    (b"<html>", "the answer is not JSON"),
    (b'{"items": {"a": 1}}', "not a list of objects"),
])
def test_answers_that_are_no_list_are_refused(tmp_path: Path, body: bytes,
                                              message: str) -> None:
    with fake.upstream(lambda h, *_: h.send(200, body)) as server, \
            pytest.raises(KubeError, match=message):
        listed(server, tmp_path)

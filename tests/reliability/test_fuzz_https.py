"""The fuzzing of test_fuzz.py, on a smaller sample, over real HTTPS to ``swapwise serve``.

In-process fuzzing skips TLS, the HTTP parser and uvicorn; this covers them with the
same checks, one keep-alive connection like the API server's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from testkit.strategies import pods
from tests.reliability.reviews import broken_reviews, fuzz, mutated_example_pods
from tests.reliability.support import (
    Server,
    apply_checked,
    check_reply,
    patch_of,
    review_bytes,
    validate,
)

HEADERS = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    server = Server(tmp_path_factory.mktemp("fuzz-https"), None, "--drain-seconds", "0").start()
    with server.client() as c:
        yield c
    server.stop()


def post(client: httpx.Client, content: bytes) -> httpx.Response:
    return client.post("/mutate/default", content=content, headers=HEADERS)


@fuzz(150)
@given(pod=pods())
def test_generated_pods_over_https(client: httpx.Client, pod: dict[str, Any]) -> None:
    validate(pod)
    response = check_reply(post(client, review_bytes(pod, uid="h-1")), "h-1")
    assert response is not None
    result = apply_checked(pod, response)
    if result is not pod:
        validate(result)
        again = check_reply(post(client, review_bytes(result, uid="h-2")), "h-2")
        assert again is not None and patch_of(again) == []


@fuzz(150)
@given(pod=mutated_example_pods())
def test_mutated_real_pods_over_https(client: httpx.Client, pod: dict[str, Any]) -> None:
    response = check_reply(post(client, review_bytes(pod, uid="h-3")), "h-3")
    assert response is not None
    apply_checked(pod, response)


@fuzz(150)
@given(body=st.one_of(broken_reviews(), st.binary(max_size=500)))
def test_broken_bodies_over_https(client: httpx.Client, body: bytes) -> None:
    reply = post(client, body)
    response = check_reply(reply)
    if response is not None:
        assert response["uid"] == json.loads(body)["request"]["uid"]

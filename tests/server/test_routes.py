"""The routes of README "HTTP interface", from the one route table, in process.

Admissions are taken past FastAPI's middleware stack (app.py), so middleware there would
never see one: the app refuses to be built with any.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi import FastAPI
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.routing import Route

from testkit.asgi import Reply, call
from testkit.pods import pod, review
from webhook.server.app import AppState, SwapwiseApp, create_app
from webhook.server.metrics import Metrics
from webhook.server.reload import PolicyStore


@pytest.fixture
def app() -> SwapwiseApp:
    metrics = Metrics()
    return create_app(AppState(PolicyStore(None, metrics), metrics, serving=True))


def request(app: SwapwiseApp, method: str, path: str, body: bytes = b"") -> Reply:
    return asyncio.run(asyncio.wait_for(call(app, method, path, body), 10))


def test_one_route_table_with_the_documented_routes(app: SwapwiseApp) -> None:
    table = {(route.path, frozenset(route.methods or ()))
             for route in app.fastapi.routes if isinstance(route, Route)}
    assert table == {
        ("/mutate/{profile}", frozenset({"POST"})),
        ("/healthz", frozenset({"GET", "HEAD"})),
        ("/readyz", frozenset({"GET", "HEAD"})),
        ("/metrics", frozenset({"GET", "HEAD"})),
    }
    assert app.admission in app.fastapi.routes


def test_admission_route_answers_reviews(app: SwapwiseApp) -> None:
    body = json.dumps(review(pod())).encode()
    reply = request(app, "POST", "/mutate/default", body)
    assert reply.status == 200
    assert json.loads(reply.body)["response"]["allowed"] is True


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/mutate/default", 405),
        ("PUT", "/mutate/default", 405),
        ("POST", "/mutate/", 404),
        ("POST", "/mutate/default/", 404),
        ("POST", "/mutate/a/b", 404),
        ("POST", "/healthz", 405),
        ("GET", "/healthz", 200),
        ("GET", "/nope", 404),
    ],
)
def test_everything_else_goes_through_fastapi(app: SwapwiseApp, method: str, path: str,
                                              status: int) -> None:
    reply = request(app, method, path)
    assert reply.status == status
    if status == 405:
        allowed = set(dict(reply.headers)[b"allow"].decode().split(", "))
        assert allowed == ({"GET", "HEAD"} if path == "/healthz" else {"POST"})


def test_create_app_adds_no_middleware(app: SwapwiseApp) -> None:
    assert app.fastapi.user_middleware == []


def test_middleware_that_admissions_would_bypass_is_refused(app: SwapwiseApp) -> None:
    with_middleware = FastAPI(routes=list(app.fastapi.routes))
    with_middleware.add_middleware(BaseHTTPMiddleware, dispatch=lambda r, n: n(r))
    with pytest.raises(ValueError, match="middleware would never see an admission"):
        SwapwiseApp(with_middleware, app.admission)

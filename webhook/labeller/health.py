"""Plain-HTTP health, readiness and metrics for the labeller (it serves no other traffic).

The same Starlette + uvicorn stack as the webhook, but uvicorn does not own the process
signals here: :mod:`.run` handles SIGTERM so the Lease is released before exit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from webhook.labeller.metrics import LabellerMetrics


def create_app(
    metrics: LabellerMetrics, ready: Callable[[], bool], leading: Callable[[], bool]
) -> Starlette:
    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(_request: Request) -> Response:
        """Ready once the node cache is filled: followers are ready too (they take over)."""
        ok = ready()
        return JSONResponse({"ready": ok, "leader": leading()}, status_code=200 if ok else 503)

    async def metrics_route(_request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
    ])


class HealthServer(uvicorn.Server):
    """uvicorn without its signal handlers: shutdown is driven by ``should_exit``."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def health_server(app: Starlette, host: str, port: int) -> HealthServer:
    config = uvicorn.Config(
        app, host=host, port=port, lifespan="off", access_log=False, log_config=None,
        server_header=False, timeout_graceful_shutdown=2,
    )
    return HealthServer(config)

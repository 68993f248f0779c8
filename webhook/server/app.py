"""The ASGI application: routes of SPEC §5 around :func:`webhook.admission.decide`.

Admission is on the path of every pod creation, so ``/mutate`` is a plain Starlette
route (no dependency injection or body models): read at most 3 MiB, parse once, decide,
serialize once. Whatever the input, the answer is a 2xx or a 4xx, never a 5xx.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from webhook import __version__
from webhook.admission import InvalidReview, decide, parse_review, review_response
from webhook.engine.warnings import warning
from webhook.server.logs import get_logger
from webhook.server.metrics import Metrics
from webhook.server.reload import PolicyStore

MAX_BODY = 3 * 1024 * 1024  # the API server's own request limit is 3 MiB

log = get_logger("admission")


@dataclass
class AppState:
    policies: PolicyStore
    metrics: Metrics
    serving: bool = False  # TLS listener is up
    draining: bool = False  # shutdown started: stop advertising readiness
    extra: dict[str, Any] = field(default_factory=dict)


class BodyTooLarge(Exception):
    pass


async def read_body(request: Request, limit: int = MAX_BODY) -> bytes:
    """The request body, refused as soon as it is known to exceed ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "code": status}, status_code=status)


def create_app(state: AppState) -> FastAPI:
    app = FastAPI(
        title="swapwise", version=__version__, docs_url=None, redoc_url=None,
        openapi_url=None,
    )
    app.state.swapwise = state
    metrics = state.metrics

    async def mutate(request: Request) -> Response:
        started = time.perf_counter()
        profile: str = request.path_params["profile"]
        policy = state.policies.policy
        label = profile if profile in policy.profiles else "unknown"
        try:
            body = await read_body(request)
        except BodyTooLarge:
            metrics.requests.labels(label, "too_large").inc()
            return _error(413, f"request body exceeds {MAX_BODY} bytes")
        except ClientDisconnect:
            return _error(400, "client disconnected")
        try:
            request_review = parse_review(json.loads(body))
        except (ValueError, RecursionError) as exc:  # bad JSON or not an AdmissionReview
            metrics.requests.labels(label, "invalid").inc()
            reason = str(exc) if isinstance(exc, InvalidReview) else "body is not valid JSON"
            log.info("rejected request", extra={"profile": profile, "error": reason})
            return _error(400, f"not an admission.k8s.io/v1 AdmissionReview: {reason}")
        uid: str = request_review["uid"]
        try:
            decision = decide(request_review, profile, policy)
        except Exception:
            # A bug must not block pod creation: allow unchanged, and say so loudly.
            log.exception("admission failed; pod allowed unchanged", extra={"uid": uid})
            metrics.requests.labels(label, "error").inc()
            payload = review_response(uid, warnings=[warning("internal error; pod unchanged")])
            return Response(json.dumps(payload), media_type="application/json")
        content = json.dumps(decision.response, separators=(",", ":"))
        elapsed = time.perf_counter() - started
        metrics.requests.labels(label, decision.outcome).inc()
        metrics.latency.observe(elapsed)
        if decision.changed:
            metrics.containers_changed.labels(label).inc(decision.changed)
        log.info(
            "admission",
            extra={
                "uid": decision.uid,
                "profile": profile,
                "namespace": decision.namespace,
                "outcome": decision.outcome,
                "reason": decision.reason,
                "containers_changed": decision.changed,
                "warnings": len(decision.warnings),
                "duration_ms": round(elapsed * 1000, 3),
            },
        )
        return Response(content, media_type="application/json")

    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(_request: Request) -> Response:
        ready = state.serving and not state.draining
        body = {
            "ready": ready,
            "policy": state.policies.policy.source,
            "profiles": sorted(state.policies.policy.profiles),
            "draining": state.draining,
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics_route(_request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.add_route("/mutate/{profile}", mutate, methods=["POST"])
    app.add_route("/healthz", healthz, methods=["GET"])
    app.add_route("/readyz", readyz, methods=["GET"])
    app.add_route("/metrics", metrics_route, methods=["GET"])
    return app

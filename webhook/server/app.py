"""The ASGI application: the routes (docs/rules.md, README "Operations") around
:func:`webhook.admission.decide`.

Admission is on the path of every pod creation, so ``POST /mutate/<profile>`` is served
by a lean ASGI handler in front of FastAPI: read at most 3 MiB (within a deadline), parse
once, decide, serialize once. Going through FastAPI's middleware stack and Starlette's
Request/Response objects cost more than the admission decision itself (see
BENCHMARKS.md). Everything else (health, readiness, metrics, 404/405) is ordinary
FastAPI. Whatever the input, the answer is a 2xx or a 4xx, never a 5xx.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from webhook import __version__, codec
from webhook.admission import InvalidReview, decide, parse_review, review_response
from webhook.engine.warnings import warning
from webhook.server.logs import get_logger
from webhook.server.metrics import Metrics
from webhook.server.reload import PolicyStore

MAX_BODY = 3 * 1024 * 1024  # the API server's own request limit is 3 MiB
MUTATE_PREFIX = "/mutate/"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = get_logger("admission")


@dataclass
class AppState:
    policies: PolicyStore
    metrics: Metrics
    serving: bool = False  # TLS listener is up
    draining: bool = False  # shutdown started: stop advertising readiness, close after reply
    extra: dict[str, Any] = field(default_factory=dict)


class BodyTooLarge(Exception):
    pass


class Disconnected(Exception):
    pass


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The request body, refused as soon as it is known to exceed ``limit``.

    No deadline here: the connection protocol (protocol.py) times out a request whose
    body does not arrive, and this then sees a disconnect.
    """
    declared = _declared_length(scope)
    if declared is not None and declared > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _error(status: int, message: str) -> tuple[int, bytes]:
    return status, codec.dumps({"error": message, "code": status})


class Admission:
    """``POST /mutate/<profile>`` as a plain ASGI handler."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        self.metrics = state.metrics
        # Counter children by label values: labels() takes a lock and builds a key on
        # every call. Profiles and outcomes are few, so this stays small.
        self._counted: dict[tuple[str, str], Any] = {}

    def count(self, label: str, outcome: str) -> None:
        child = self._counted.get((label, outcome))
        if child is None:
            child = self._counted[(label, outcome)] = self.metrics.requests.labels(label, outcome)
        child.inc()

    async def __call__(self, profile: str, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        policy = self.state.policies.policy
        label = profile if profile in policy.profiles else "unknown"
        try:
            body = await read_body(scope, receive, MAX_BODY)
        except BodyTooLarge:
            self.count(label, "too_large")
            status, content = _error(413, f"request body exceeds {MAX_BODY} bytes")
        except Disconnected:
            return  # nobody to answer
        else:
            status, content = self.answer(profile, label, policy, body, started)
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(content)).encode())]
        if self.state.draining:
            # Lame duck: answer, then move the client to another replica (or connection).
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    def answer(
        self, profile: str, label: str, policy: Any, body: bytes, started: float
    ) -> tuple[int, bytes]:
        metrics = self.metrics
        try:
            request_review = parse_review(codec.loads(body))
        except (ValueError, RecursionError) as exc:  # bad JSON or not an AdmissionReview
            self.count(label, "invalid")
            reason = str(exc) if isinstance(exc, InvalidReview) else "body is not valid JSON"
            log.info("rejected request", extra={"profile": profile, "error": reason})
            return _error(400, f"not an admission.k8s.io/v1 AdmissionReview: {reason}")
        uid: str = request_review["uid"]
        try:
            decision = decide(request_review, profile, policy)
            content = codec.dumps(decision.response)
        except Exception:
            # A bug must not block pod creation: allow unchanged, and say so loudly.
            log.exception("admission failed; pod allowed unchanged", extra={"uid": uid})
            self.count(label, "error")
            payload = review_response(uid, warnings=[warning("internal error; pod unchanged")])
            return 200, codec.dumps(payload)
        elapsed = time.perf_counter() - started
        self.count(label, decision.outcome)
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
        return 200, content


class SwapwiseApp:
    """ASGI entry point: admissions on the lean path, the rest through FastAPI."""

    def __init__(self, state: AppState, fallback: FastAPI) -> None:
        self.state = state
        self.fastapi = fallback
        self.admission = Admission(state)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            if path.startswith(MUTATE_PREFIX):
                profile = path[len(MUTATE_PREFIX):]
                if profile and "/" not in profile:  # what Starlette's {profile} matches
                    await self.admission(profile, scope, receive, send)
                    return
        await self.fastapi(scope, receive, send)


def create_app(state: AppState) -> SwapwiseApp:
    app = FastAPI(
        title="swapwise", version=__version__, docs_url=None, redoc_url=None,
        openapi_url=None,
    )
    app.state.swapwise = state
    metrics = state.metrics

    async def mutate_elsewhere(_request: Request) -> Response:  # pragma: no cover
        # Registered so that GET /mutate/x is a 405, not a 404; POSTs never get here.
        return JSONResponse({"error": "not found", "code": 404}, status_code=404)

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
        return Response(generate_latest(metrics.exposition()), media_type=CONTENT_TYPE_LATEST)

    app.add_route("/mutate/{profile}", mutate_elsewhere, methods=["POST"])
    app.add_route("/healthz", healthz, methods=["GET"])
    app.add_route("/readyz", readyz, methods=["GET"])
    app.add_route("/metrics", metrics_route, methods=["GET"])
    return SwapwiseApp(state, app)

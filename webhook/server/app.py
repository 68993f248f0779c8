"""The ASGI application: the routes (docs/rules.md, README "Operations") around
:func:`webhook.admission.decide`.

Admission is on the path of every pod creation, so ``POST /mutate/<profile>`` is served
by a lean ASGI handler: read at most 3 MiB, parse once, decide, serialize once. Going
through FastAPI's middleware stack and Starlette's Request/Response objects cost more than
the admission decision itself (see BENCHMARKS.md). The routes are one table, FastAPI's;
the admission route's endpoint is that handler, and :class:`SwapwiseApp` hands a request
that route matches straight to it, past the middleware stack. So no middleware may exist
(it would never see an admission): :class:`SwapwiseApp` refuses an app that has any.
In the server, the connection protocol goes further for an admission of at most
OFFLOAD_BYTES: it answers with :meth:`Admission.respond`, without an ASGI request at all
(uvicorn_internals.py; measured behind kube-apiserver, BENCHMARKS.md). Whatever the
input, the answer is a 2xx or a 4xx, never a 5xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
import traceback
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any, Literal, NamedTuple

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, Route

from webhook import __version__
from webhook.admission import InvalidReview, Outcome, decide, parse_review, review_response
from webhook.base import codec
from webhook.base.logs import get_logger
from webhook.engine.warnings import warning
from webhook.policy import Policy
from webhook.server import asynclog
from webhook.server.metrics import Metrics
from webhook.server.reload import PolicyStore

MAX_BODY = 3 * 1024 * 1024  # the API server's own request limit is 3 MiB
# Reviews of ordinary pods are a few KiB (10 KB for a 4-container pod as the API server
# sends it) and are answered on the event loop (a hop would cost more than the decision).
# A bigger body is parsed and decided in a child process (LargeReviews), one at a time,
# so that big reviews cannot stall /healthz or the ordinary admissions on the loop: this
# bounds the slice of the loop one request takes (pipelined reviews of a few hundred KiB
# of nested arrays once kept the probes waiting for seconds: BENCHMARKS.md).
OFFLOAD_BYTES = 64 * 1024

ADMISSION_PREFIX = "/mutate/"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Answers that are no decision: a body refused (400, 413) or a bug (200, pod unchanged).
Refusal = Literal["invalid", "too_large", "error"]

log = get_logger("admission")


@dataclass
class AppState:
    policies: PolicyStore
    metrics: Metrics
    serving: bool = False  # TLS listener is up
    draining: bool = False  # shutdown started: stop advertising readiness, close after reply
    on_stop: list[Callable[[], None]] = field(default_factory=list)  # run at shutdown


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

    No deadline here: the connection protocol (uvicorn_internals.py) times out a request whose
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


# The most a log line carries of any one value taken from a request (the profile in the
# URL, the uid and namespace in the review, why it was refused); a traceback, ours but
# possibly quoting request data, gets more. README "Operations".
LOG_VALUE_CHARS = 256
LOG_TRACEBACK_CHARS = 8192


def clip(value: str | None, limit: int = LOG_VALUE_CHARS) -> str | None:
    """``value`` cut to ``limit`` characters, saying how long it was."""
    if value is None or len(value) <= limit:
        return value
    return f"{value[:limit]}... ({len(value)} characters)"


def _error(status: int, message: str) -> tuple[int, bytes]:
    return status, codec.dumps({"error": message, "code": status})


class Answer(NamedTuple):
    """An admission answered (bytes to send) and what happened, for logs and metrics.

    A NamedTuple: one is built per admission, in a quarter of a frozen dataclass's time."""

    status: int
    content: bytes
    outcome: Outcome | Refusal
    uid: str | None = None
    namespace: str | None = None
    changed: int = 0
    reason: str | None = None  # skip reason, or why the body was refused
    warnings: int = 0
    traceback: str | None = None  # outcome "error": the bug


def parse_body(body: bytes) -> Any:
    """``codec.loads`` with the cyclic garbage collector paused.

    Parsed JSON holds no reference cycles, so a collection during the parse finds nothing
    to free; but a body of many small containers (a review stuffed with nested arrays)
    allocates enough to trigger one every few hundred objects, each traversing what was
    built so far, which multiplies the parse time of a review of nested arrays. That is
    the slice one connection's request holds the loop for while every other connection,
    and the probes, wait.
    """
    if not gc.isenabled():
        return codec.loads(body)
    gc.disable()
    try:
        return codec.loads(body)
    finally:
        gc.enable()


def evaluate(body: bytes, profile: str, policy: Policy) -> Answer:
    """Body in, answer out: parse, decide, serialize. No I/O, no shared state, so it runs
    on the event loop or in the large-review process alike."""
    try:
        request_review = parse_review(parse_body(body))
    except (ValueError, RecursionError) as exc:  # bad JSON or not an AdmissionReview
        reason = str(exc) if isinstance(exc, InvalidReview) else "body is not valid JSON"
        status, content = _error(400, f"not an admission.k8s.io/v1 AdmissionReview: {reason}")
        return Answer(status, content, "invalid", reason=reason)
    uid: str = request_review["uid"]
    try:
        decision = decide(request_review, profile, policy)
        content = codec.dumps(decision.response)
    except Exception:
        # A bug must not block pod creation: allow unchanged, and say so loudly.
        payload = review_response(uid, warnings=[warning("internal error; pod unchanged")])
        return Answer(200, codec.dumps(payload), "error", uid,
                      traceback=traceback.format_exc())
    return Answer(200, content, decision.outcome, uid, decision.namespace, decision.changed,
                  decision.reason, len(decision.warnings))


def _lower_priority() -> None:
    """In the large-review process: yield the CPU to the event loop's process first."""
    with contextlib.suppress(OSError):
        os.nice(10)


class LargeReviews:
    """Huge reviews are evaluated in one child process, one at a time.

    Parsing a review of tens of thousands of containers holds the GIL for the whole call,
    so a thread would still stall the event loop; a process does not, and it runs at a
    lower CPU priority (nice 10). Started on the first large review; if it dies, the
    next one starts a new one.
    """

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    async def evaluate(self, body: bytes, profile: str, policy: Policy) -> Answer:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"),
                                             initializer=_lower_priority)
        pool = self._pool
        try:
            return await asyncio.get_running_loop().run_in_executor(
                pool, evaluate, body, profile, policy)
        except BrokenProcessPool:
            if self._pool is pool:
                self._pool = None
            raise

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


class Admission:
    """``POST /mutate/{profile}`` as a plain ASGI app (the route's endpoint)."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        self.metrics = state.metrics
        # Counter children by label values: labels() takes a lock and builds a key on
        # every call. Profiles and outcomes are few, so this stays small.
        self._counted: dict[tuple[str, Outcome | Refusal], Any] = {}
        self._changed: dict[str, Any] = {}
        self.large = LargeReviews()
        state.on_stop.append(self.large.close)

    def count(self, label: str, outcome: Outcome | Refusal) -> None:
        child = self._counted.get((label, outcome))
        if child is None:
            child = self._counted[(label, outcome)] = self.metrics.requests.labels(label, outcome)
        child.inc()

    def policy_for(self, profile: str) -> tuple[Policy, str]:
        """The policy in use and ``profile``'s metrics label: unknown profiles share one,
        so clients cannot grow the series."""
        policy = self.state.policies.policy
        return policy, profile if profile in policy.profiles else "unknown"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        profile: str = scope["path_params"]["profile"]
        policy, label = self.policy_for(profile)
        try:
            body = await read_body(scope, receive, MAX_BODY)
        except BodyTooLarge:
            self.count(label, "too_large")
            status, content = _error(413, f"request body exceeds {MAX_BODY} bytes")
        except Disconnected:
            return  # nobody to answer
        else:
            answer = await self.answer(body, profile, policy)
            status, content = self.record(profile, label, answer, started)
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(content)).encode())]
        if self.state.draining:
            # Lame duck: answer, then move the client to another replica (or connection).
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    def respond(self, profile: str, body: bytes) -> tuple[int, bytes]:
        """What :meth:`__call__` sends for a body of at most OFFLOAD_BYTES, already read:
        the connection protocol answers most admissions with this, without an ASGI cycle
        (uvicorn_internals.py)."""
        started = time.perf_counter()
        policy, label = self.policy_for(profile)
        return self.record(profile, label, evaluate(body, profile, policy), started)

    async def answer(self, body: bytes, profile: str, policy: Policy) -> Answer:
        """Evaluate on the event loop, or in the large-review process for a big body."""
        if len(body) <= OFFLOAD_BYTES:
            return evaluate(body, profile, policy)
        try:
            return await self.large.evaluate(body, profile, policy)
        except Exception:  # the child process died (e.g. killed): answer here
            log.exception("large-review process failed; answering on the event loop")
            return evaluate(body, profile, policy)

    def record(self, profile: str, label: str, answer: Answer, started: float
               ) -> tuple[int, bytes]:
        """Count and log an answer; returns what to send."""
        self.count(label, answer.outcome)
        if answer.outcome == "invalid":
            log.info("rejected request", extra={"profile": clip(profile),
                                                "error": clip(answer.reason)})
            return answer.status, answer.content
        if answer.outcome == "error":
            log.error("admission failed; pod allowed unchanged",
                      extra={"uid": clip(answer.uid),
                             "traceback": clip(answer.traceback, LOG_TRACEBACK_CHARS)})
            return answer.status, answer.content
        elapsed = time.perf_counter() - started
        self.metrics.latency.observe(elapsed)
        if answer.changed:
            changed = self._changed.get(label)
            if changed is None:
                changed = self._changed[label] = self.metrics.containers_changed.labels(label)
            changed.inc(answer.changed)
        asynclog.info(
            log,
            "admission",
            {
                "uid": clip(answer.uid),
                "profile": clip(profile),
                "namespace": clip(answer.namespace),
                "outcome": answer.outcome,
                "reason": clip(answer.reason),
                "containers_changed": answer.changed,
                "warnings": answer.warnings,
                "duration_ms": round(elapsed * 1000, 3),
            },
        )
        return answer.status, answer.content


class SwapwiseApp:
    """ASGI entry point: FastAPI, with the admission route taken past its middleware."""

    def __init__(self, fastapi: FastAPI, admission: Route) -> None:
        if fastapi.user_middleware:
            raise ValueError("middleware would never see an admission (see app.py)")
        assert admission in fastapi.routes, "the admission route is one of the app's routes"
        assert admission.path == ADMISSION_PREFIX + "{profile}", "the fast match in __call__"
        assert isinstance(admission.endpoint, Admission)
        self.fastapi = fastapi
        self.admission = admission
        self.endpoint = admission.endpoint  # for the connection protocol's fast path

    @staticmethod
    def admission_profile(path: str) -> str | None:
        """The profile of a POST to ``path`` if the admission route matches it: what its
        pattern (/mutate/{profile}: one non-empty segment) matches, without its regex and
        scope copies (every admission comes this way)."""
        if path.startswith(ADMISSION_PREFIX):
            profile = path[len(ADMISSION_PREFIX):]
            if profile and "/" not in profile:
                return profile
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            profile = self.admission_profile(scope.get("path", ""))
            if profile is not None:
                scope["endpoint"] = self.admission.endpoint
                scope["path_params"] = {"profile": profile}
                await self.admission.app(scope, receive, send)
                return
        match, child_scope = self.admission.matches(scope)
        if match is Match.FULL:
            scope.update(child_scope)
            await self.admission.app(scope, receive, send)
            return
        await self.fastapi(scope, receive, send)


def create_app(state: AppState) -> SwapwiseApp:
    metrics = state.metrics

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

    # Every route, in one table. GET /mutate/x is a 405, by the admission route itself.
    admission = Route(ADMISSION_PREFIX + "{profile}", Admission(state), methods=["POST"])
    routes: list[BaseRoute] = [
        admission,
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
    ]
    app = FastAPI(
        title="swapwise", version=__version__, docs_url=None, redoc_url=None,
        openapi_url=None, routes=routes,
        # Never a redirect: POST /mutate/default/ would be sent a 307 to a Location built
        # from the client's Host header. A path that is not a route is a 404.
        redirect_slashes=False,
    )
    return SwapwiseApp(app, admission)

"""The KServe v2 HTTP endpoint (Open Inference Protocol), in the manager process.

It serves the same routers and queues as the Unix socket: an HTTP infer request is parsed
into the router's tensor header and raw bytes and submitted like a socket request, so the
bounded queue, the admission gate of a reload and the timeouts apply to both alike.

Routes (Triton's HTTP API, which `tritonclient.http` and `curl` scripts expect):

    GET  /v2/health/live, /v2/health/ready, /v2
    GET  /v2/models/{name}[/versions/{v}], .../ready
    POST /v2/models/{name}[/versions/{v}]/infer
    POST /v2/repository/index, /v2/repository/models/{name}/load, .../unload
    GET  /metrics
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST

from hotreload import __version__
from hotreload.engine.event_kinds import BaseEvent, HttpStarted, SessionStopping
from hotreload.errors import ClientError, HotreloadError
from hotreload.http.auth import token_refusal, without_details
from hotreload.http.body import BodyError, BodyLimits, ClientGone, compress_small, read_body
from hotreload.http.edges import (
    answer_parse_errors_in_json,
    close_without_lingering,
    http_exception_response,
)
from hotreload.http.kserve import (
    HEADER_LENGTH,
    InferRequestError,
    encode_infer_response,
    model_metadata_doc,
    parse_infer_request,
    to_router_request,
)
from hotreload.http.metrics import SessionMetrics, model_ready
from hotreload.http.openai_routes import TextRoutes
from hotreload.http.replies import HttpError, client_error, error_body, json_response
from hotreload.paths import ensure_http_token, http_token_path

if TYPE_CHECKING:
    from hotreload.engine.model import ModelSupervisor
    from hotreload.engine.session import Session

log = logging.getLogger(__name__)

SERVER_NAME = "hotreload"
EXTENSIONS = ["binary_tensor_data", "model_repository"]
#: States in which a model has no worker at all; infer fails at once instead of queueing.
_NO_WORKER_STATES = frozenset({"unloaded", "stopped"})
#: How long aiohttp waits for running handlers (a load in progress) when the server closes.
SHUTDOWN_TIMEOUT_S = 2.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _front(token: str | None, token_file: str) -> Middleware:
    """The front's one middleware (each is a coroutine more on every request): the token of
    the protected routes (auth.py), and every error as JSON (`replies.error_body`: OpenAI's
    error object on the OpenAI-style routes, `{"error": "..."}` on KServe's): ours,
    aiohttp's (404, 405, 413) and bugs alike."""

    @web.middleware
    async def front(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            refused = token_refusal(request, token, token_file)
            return refused if refused is not None else await handler(request)
        except HttpError as exc:
            extra = without_details(request, exc.extra, token)
            resp = json_response(
                error_body(request.path, exc.status, exc.message, exc.param, exc.code, **extra),
                exc.status,
            )
            if exc.close:
                resp.force_close()
            return resp
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return http_exception_response(request, exc)
        except Exception as exc:  # a bug: say so, keep serving
            log.exception("HTTP %s %s failed", request.method, request.path)
            message = (
                f"internal error: {type(exc).__name__}: {exc}; this is a bug in hotreload, "
                "the server keeps serving: please report it with the request that caused it"
            )
            return json_response(error_body(request.path, 500, message), 500)

    return front


class KServeApp:
    """Request handlers over one session."""

    def __init__(
        self,
        session: Session,
        metrics: SessionMetrics,
        max_body_bytes: int,
        limits: BodyLimits,
        token: str | None = None,
    ) -> None:
        self.session = session
        #: The bearer token the repository routes and tracebacks need (None: open).
        self.token = token
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.limits = limits
        self.stopping = False
        self._unsubscribe = session.events.subscribe(self._on_event)

    def _on_event(self, event: BaseEvent) -> None:
        if isinstance(event, SessionStopping):
            self.stopping = True

    def close(self) -> None:
        self._unsubscribe()

    def build(self) -> web.Application:
        # aiohttp refuses bodies over client_max_size with 413 (turned into JSON above).
        token_file = str(http_token_path(self.session.config.state_dir))
        app = web.Application(
            client_max_size=self.max_body_bytes, middlewares=[_front(self.token, token_file)]
        )
        get, post = web.get, web.post
        model = "/v2/models/{name}"
        version = "/v2/models/{name}/versions/{version}"
        app.add_routes(
            [
                # Infer first: aiohttp tries the routes under /v2/models in this order, and
                # infer is the one asked for thousands of times a second.
                post(model + "/infer", self.infer),
                post(version + "/infer", self.infer),
                get("/v2/health/live", self.live),
                get("/v2/health/ready", self.ready),
                get("/v2", self.server_metadata),
                get("/v2/", self.server_metadata),  # the spec's own spelling
                get(model, self.model_metadata),
                get(version, self.model_metadata),
                get(model + "/ready", self.model_ready),
                get(version + "/ready", self.model_ready),
                post("/v2/repository/index", self.repository_index),
                post("/v2/repository/models/{name}/load", self.load),
                post("/v2/repository/models/{name}/unload", self.unload),
                get("/metrics", self.prometheus),
                # OpenAI completions, the generate extension, tokenizer routes.
                *TextRoutes(self).routes(),
            ]
        )
        return app

    # ------------------------------------------------------------------ helpers

    def _host(self, request: web.Request) -> ModelSupervisor:
        name = request.match_info["name"]
        host = self.session.models.get(name)
        if host is None:
            known = ", ".join(self.session.models)
            raise HttpError(404, f"unknown model {name!r}; this session serves: {known}")
        wanted = request.match_info.get("version")
        if wanted is not None and wanted != str(host.version):
            raise HttpError(
                404,
                f"model {name!r} version {wanted} is not available; version {host.version} "
                "is serving (hotreload serves one version: leave the version out)",
            )
        return host

    async def _read(self, request: web.Request, model: str | None = None) -> bytes:
        try:
            return await read_body(request, self.limits)
        except ClientGone as exc:
            # One line, no traceback: any local user can hang up mid-body at will.
            log.warning("HTTP %s %s: %s", request.method, request.path, exc.message)
            raise HttpError(exc.status, exc.message, close=True) from None
        except BodyError as exc:
            if exc.status == 408:
                close_without_lingering(request)
            if model is not None:
                self.metrics.count_bad_request(model)
            where = f"model {model!r}: " if model else ""
            raise HttpError(exc.status, where + exc.message, close=True) from None

    async def _json_body(self, request: web.Request) -> dict[str, Any]:
        raw = await self._read(request)
        if not raw.strip():
            return {}
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # see parse_infer_request
            raise HttpError(400, f"the body is not valid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise HttpError(400, "the body must be a JSON object")
        return doc

    # ------------------------------------------------------------------ health and metadata

    async def live(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def ready(self, request: web.Request) -> web.Response:
        if self.stopping:
            raise HttpError(400, "not ready: the server is shutting down")
        problems = [why for ok, why in map(model_ready, self.session.models.values()) if not ok]
        if problems:
            # KServe: a 4xx status means "not ready"; Triton answers 400 too.
            raise HttpError(400, "not ready: " + "; ".join(problems))
        return web.Response(status=200)

    async def model_ready(self, request: web.Request) -> web.Response:
        ok, why = model_ready(self._host(request))
        if not ok or self.stopping:
            raise HttpError(400, f"not ready: {why or 'the server is shutting down'}")
        return web.Response(status=200)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return json_response(
            {"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS}
        )

    async def model_metadata(self, request: web.Request) -> web.Response:
        view = self._host(request).view
        return json_response(
            model_metadata_doc(
                view.name,
                view.version,
                view.input_form,
                list(view.inputs),
                list(view.outputs),
                view.digest,
                view.adapters,
            )
        )

    # ------------------------------------------------------------------ inference

    async def infer(self, request: web.Request) -> web.Response:
        host = self._host(request)
        # The few fields a request needs, read directly: `host.view` builds a snapshot of
        # every figure (request counts, text statistics), work an answer does not use.
        state, router = host.state, host.router
        form, signature = router.input_form, router.input_signature
        if state in _NO_WORKER_STATES:
            raise HttpError(
                503,
                f"model {host.name!r} is {state}; POST /v2/repository/models/"
                f"{host.name}/load to load it",
            )
        length = request.content_length
        if length is not None and length > self.max_body_bytes:
            self.metrics.count_bad_request(host.name)
            raise HttpError(
                413,
                f"the body has {length} bytes, over the {self.max_body_bytes} byte limit "
                "(max_frame_mib in the config)",
            )
        body = await self._read(request, host.name)
        try:
            req = parse_infer_request(body, request.headers.get(HEADER_LENGTH))
            header, payload = to_router_request(req, form, signature)
        except InferRequestError as exc:
            self.metrics.count_bad_request(host.name)
            raise HttpError(400, f"model {host.name!r}: {exc}") from None
        try:
            # parse_infer_request checked the tensors against the body: not again.
            frame = await router.submit_future(header, payload, tensors_checked=True)
        except ClientError as exc:
            raise client_error(exc) from None
        h = frame.header
        try:
            pieces, json_len = encode_infer_response(
                host.name,
                int(h.get("version") or 0),
                req,
                h.get("tensors", []),
                frame.payload,
                h.get("digest"),
            )
        except InferRequestError as exc:
            raise HttpError(400, f"model {host.name!r}: {exc}") from None
        headers = {}
        if json_len is not None:
            headers[HEADER_LENGTH] = str(json_len)
            content_type = "application/octet-stream"
        else:
            content_type = "application/json"
        body = b"".join(pieces)
        accept = request.headers.get("Accept-Encoding", "")
        compress = "gzip" in accept or "deflate" in accept
        if compress and (small := compress_small(body, accept)) is not None:
            # A small answer (most are): coded here, at a fraction of the cost (body.py).
            body, headers[hdrs.CONTENT_ENCODING] = small
            compress = False
        resp = web.Response(body=body, headers=headers, content_type=content_type, status=200)
        if compress:
            resp.enable_compression()
        return resp

    # ------------------------------------------------------------------ repository

    async def repository_index(self, request: web.Request) -> web.Response:
        doc = await self._json_body(request)
        only_ready = doc.get("ready") is True
        entries = []
        for host in self.session.models.values():
            ok, why = model_ready(host)
            if only_ready and not ok:
                continue
            view = host.view
            entry: dict[str, Any] = {"name": view.name, "version": str(view.version)}
            if ok:
                entry["state"] = "READY"
            elif view.state in ("starting", "loading", "warming", "restarting"):
                entry["state"] = "LOADING"
            else:
                entry["state"] = "UNAVAILABLE"
                entry["reason"] = view.last_error or why
            entries.append(entry)
        return json_response(entries)

    async def load(self, request: web.Request) -> web.Response:
        """Reload (or load an unloaded) model through the serialized reload path; answer
        only when it has succeeded or failed, with the error in the body on failure."""
        host = self._host(request)
        doc = await self._json_body(request)
        params = doc.get("parameters")
        params = {} if params is None else params  # [] is no object: refused below
        if not isinstance(params, dict):
            raise HttpError(400, "'parameters' must be a JSON object, e.g. {}")
        if any(k == "config" or k.startswith("file:") for k in params):
            raise HttpError(
                400,
                "load with a config or files override is not supported; edit the model's "
                "files (or hotreload.toml) and load again",
            )
        reload_model = getattr(self.session, "reload_model", None)
        if reload_model is None:
            raise HttpError(501, "this hotreload session has no reload support")
        # Shielded: a client that hangs up must not cancel a reload half way.
        outcome = await asyncio.shield(
            reload_model(host.name, trigger="http", detail=[f"POST {request.path}"])
        )
        result = {
            "model": outcome.model,
            "version": outcome.version,
            "total_s": round(outcome.total_s, 4),
            "phases": {k: round(v, 4) for k, v in outcome.phases.items()},
            "policy": outcome.policy,
            "strategy": outcome.strategy,
        }
        if outcome.ok:
            return json_response(result)
        serving = (
            f"; version {outcome.version} keeps serving"
            if outcome.version
            else "; no version is serving"
        )
        raise HttpError(
            500,
            f"failed to load {host.name!r} in {outcome.phase or 'reload'}: {outcome.error}"
            + serving,
            phase=outcome.phase,
            traceback=outcome.traceback,
            **result,
        )

    async def unload(self, request: web.Request) -> web.Response:
        host = self._host(request)
        await self._json_body(request)  # unload_dependents and friends: nothing depends here
        unload_model = getattr(self.session, "unload_model", None)
        if unload_model is None:
            raise HttpError(501, "this hotreload session has no unload support")
        await asyncio.shield(unload_model(host.name))
        return json_response({"model": host.name, "state": host.view.state})

    # ------------------------------------------------------------------ metrics

    async def prometheus(self, request: web.Request) -> web.Response:
        resp = web.Response(body=self.metrics.exposition())
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp


class HttpEndpoint:
    """A running HTTP endpoint: `.port` (the bound one), `.url`, `await close()`."""

    def __init__(self, app: KServeApp, host: str, keepalive_timeout_s: float = 75.0) -> None:
        self._app = app
        self.keepalive_timeout_s = keepalive_timeout_s
        self._runners: list[web.AppRunner] = []
        self.host = host
        self.port = 0
        #: Port of the metrics-only listener (Triton's 8002), or None.
        self.metrics_port: int | None = None
        self.metrics = app.metrics
        self._closed = False

    @property
    def url(self) -> str:
        return _url(self.host, self.port)

    async def listen(self, app: web.Application, port: int) -> int:
        """Serve `app` on host:port; returns the bound port."""
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            # An idle keep-alive connection closes after this (aiohttp's own is an hour).
            keepalive_timeout=self.keepalive_timeout_s,
            # Bodies are inflated by read_body, with a limit, off the loop (http/body.py).
            auto_decompress=False,
        )
        await runner.setup()
        answer_parse_errors_in_json(runner, self._app.max_body_bytes)
        self._runners.append(runner)
        site = web.TCPSite(runner, self.host, port, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        try:
            await site.start()
        except OSError as exc:
            await self.close()
            raise HotreloadError(
                f"cannot serve HTTP on {self.host}:{port}: {exc.strerror or exc}; choose "
                "another address with --http HOST:PORT or [http] host/port in the config"
            ) from exc
        return int(runner.addresses[0][1]) if runner.addresses else port

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._app.close()
        self.metrics.close()
        for runner in self._runners:
            with contextlib.suppress(Exception):
                await runner.cleanup()


def _token(state_dir: Path) -> str:
    """The session's HTTP token (made once); HotreloadError, said in one line, when it
    cannot be written (a full or read-only state folder): the repository routes would
    need a token nobody could read, and open routes are not what `auth` asked for."""
    try:
        return ensure_http_token(state_dir)
    except OSError as exc:
        raise HotreloadError(
            f"cannot write the HTTP token file {http_token_path(state_dir)}: "
            f"{exc.strerror or exc}; free space in (or fix the permissions of) {state_dir}, "
            'or set [http] auth = "none" in the config to '
            "serve HTTP without a token"
        ) from None


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def start_http(
    session: Session,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    metrics_port: int | None = None,
) -> HttpEndpoint:
    """Serve the KServe v2 API and /metrics for `session` on host:port (port 0: any free
    port); with `metrics_port`, /metrics alone on that port too, where Triton serves it
    (8002), so Triton users' scrape configs and `curl localhost:8002/metrics` work as-is.

    Call it before the models start, so readiness is observable during warm-up.
    """
    config = session.config
    limits = BodyLimits(
        timeout_s=config.http.body_timeout_s,
        max_inflated_bytes=(config.http.max_inflated_mib or config.max_frame_mib) * 2**20,
    )
    token = _token(config.state_dir) if config.http.auth == "token" else None
    kapp = KServeApp(session, SessionMetrics(session), config.max_frame_bytes, limits, token)
    endpoint = HttpEndpoint(kapp, host, config.http.keepalive_timeout_s)
    endpoint.port = await endpoint.listen(kapp.build(), port)
    if metrics_port is not None:
        metrics_app = web.Application(middlewares=[_front(None, "")])
        metrics_app.add_routes([web.get("/metrics", kapp.prometheus)])
        endpoint.metrics_port = await endpoint.listen(metrics_app, metrics_port)
    session.events.emit(
        HttpStarted(
            url=endpoint.url,
            host=host,
            port=endpoint.port,
            metrics_url=_url(host, endpoint.metrics_port) + "/metrics"
            if endpoint.metrics_port is not None
            else endpoint.url + "/metrics",
        )
    )
    return endpoint

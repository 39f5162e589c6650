"""Text routes on the session's HTTP server, for eval harnesses and OpenAI clients:

    POST /v1/completions              OpenAI legacy completions (echo, logprobs, stop, seed, n)
    POST /v1/chat/completions         OpenAI chat, through the model's chat template
    GET  /v1/models                   the generators of this session
    POST /v2/models/{name}/generate   the Open Inference Protocol generate extension (Triton)
    POST /tokenize, /detokenize       vLLM's tokenizer routes (lm-eval's remote tokenizer)
    GET  /tokenizer_info              the special tokens (lm-eval reads eos_token from it)
    GET  /health                      200 when every generator can answer (vLLM's probe)

Each request goes through the model's router as a `text` op, so the queue, a reload's gate
and drain, timeouts and `min_version` apply as to a forward. Every answer names the version
and weights digest that computed it: in the body (`system_fingerprint` is the digest) and
in the `X-Hotreload-Version` / `X-Hotreload-Digest` headers. Errors are OpenAI error
objects (http/replies.py), so the `openai` SDK's exception says what to fix.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from hotreload.errors import ClientError
from hotreload.http import adapter_choice, chat, streaming
from hotreload.http import completions as c
from hotreload.http.metrics import model_ready
from hotreload.http.replies import HttpError, client_error, json_response
from hotreload.http.text_metrics import TextCollector
from hotreload.protocol.ops import WorkerOp

if TYPE_CHECKING:
    from hotreload.engine.model import ModelSupervisor
    from hotreload.engine.session import Session
    from hotreload.http.metrics import SessionMetrics


class KServeFront(Protocol):
    """What these routes use of the KServe app (http/server.py's `KServeApp`): its session,
    metrics, body reading and model lookup, so both answer errors alike."""

    session: Session
    metrics: SessionMetrics

    async def _json_body(self, request: web.Request) -> dict[str, Any]: ...

    def _host(self, request: web.Request) -> ModelSupervisor: ...


VERSION_HEADER = "X-Hotreload-Version"
DIGEST_HEADER = "X-Hotreload-Digest"
#: A request may ask to be answered by this version or a later one (a trainer's push).
MIN_VERSION_HEADER = "X-Hotreload-Min-Version"


class TextRoutes:
    """The handlers, over the KServe app's session, errors and body limits."""

    def __init__(self, kapp: KServeFront) -> None:
        self.kapp = kapp
        self.session = kapp.session
        kapp.metrics.registry.register(TextCollector(kapp.session))

    def routes(self) -> list[web.RouteDef]:
        gen = "/v2/models/{name}/generate"
        return [
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
            web.get("/v1/models", self.models),
            web.post(gen, self.generate),
            web.post("/v2/models/{name}/versions/{version}/generate", self.generate),
            web.post("/tokenize", self.tokenize),
            web.post("/detokenize", self.detokenize),
            web.get("/tokenizer_info", self.tokenizer_info),
            web.get("/health", self.health),
        ]

    # ------------------------------------------------------------------ helpers

    def _generators(self) -> list[ModelSupervisor]:
        return [h for h in self.session.models.values() if h.model.generator]

    def _generator(self, name: Any) -> ModelSupervisor:

        gens = self._generators()
        names = ", ".join(h.name for h in gens) or "none"
        if name is None:
            if len(gens) == 1:
                return gens[0]
            raise HttpError(
                400,
                f"say which model: 'model' is missing and this session has {len(gens)} text "
                f"generators ({names})",
                param="model",
            )
        if not isinstance(name, str):
            raise HttpError(400, "'model' must be a model name (a string)", param="model")
        host = self.session.models.get(name)
        if host is None:
            raise HttpError(
                404,
                f"unknown model {name!r}; this session's text generators: {names}",
                param="model",
                code="model_not_found",
            )
        if not host.model.generator:
            raise HttpError(
                400,
                f"model {name!r} is not a text generator, so it cannot serve completions or "
                "tokenize: set generator = true in its [[models]] table if its forward takes "
                "input_ids and returns logits (and tokenizer = a save_pretrained folder, or "
                f"encode/decode in its module); this session's text generators: {names}",
                param="model",
            )
        return host

    async def _doc(self, request: web.Request) -> dict[str, Any]:
        return await self.kapp._json_body(request)

    async def _run(
        self, host: ModelSupervisor, text: dict[str, Any], request: web.Request, doc: dict[str, Any]
    ) -> dict[str, Any]:
        """The worker's reply to `text`. A client that hangs up meanwhile stops it (in the
        worker at its next token): a long generation nobody reads would hold the serving
        thread, and a reload's drain behind it, to its end."""
        fut, stop = host.router.submit_stoppable(self._header(text, request, doc), b"")
        watch = streaming.ClientWatch(request, stop)
        try:
            frame = await fut
        except ClientError as exc:
            if watch.gone:
                raise HttpError(499, "the client went away") from None
            raise client_error(exc) from None
        finally:
            watch.stop()
        return frame.header

    async def _stream(
        self,
        host: ModelSupervisor,
        text: dict[str, Any],
        request: web.Request,
        doc: dict[str, Any],
        chunks: streaming.Chunks,
    ) -> web.StreamResponse:
        """A `stream: true` request answered as Server-Sent Events (http/streaming.py)."""
        stream = host.router.stream(self._header(text, request, doc))
        return await streaming.serve(request, stream, chunks, _version_headers)

    def _header(
        self, text: dict[str, Any], request: web.Request, doc: dict[str, Any]
    ) -> dict[str, Any]:
        header: dict[str, Any] = {"op": WorkerOp.TEXT, "text": text}
        asked = doc.get("min_version", request.headers.get(MIN_VERSION_HEADER))
        min_version = min_version_of(asked)
        if min_version is not None:
            header["min_version"] = min_version
        return header

    def _answer(self, doc: dict[str, Any], reply: dict[str, Any]) -> web.Response:

        resp = json_response(doc)
        resp.headers[VERSION_HEADER] = str(reply.get("version"))
        resp.headers[DIGEST_HEADER] = str(reply.get("digest"))
        return resp

    def _parsed(self, fn: Any, doc: dict[str, Any], host: ModelSupervisor) -> dict[str, Any]:

        try:
            return fn(doc)
        except c.TextBodyError as exc:
            self.kapp.metrics.count_bad_request(host.name)
            raise HttpError(400, f"model {host.name!r}: {exc}", param=exc.param) from None

    # ------------------------------------------------------------------ routes

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(
            request, "completion", c.completion_request, c.completion_response
        )

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, "chat", chat.chat_request, chat.chat_response)

    async def _openai(
        self,
        request: web.Request,
        kind: str,
        parse: Callable[[dict[str, Any]], dict[str, Any]],
        respond: Callable[[str, dict[str, Any]], dict[str, Any]],
    ) -> web.StreamResponse:
        """One OpenAI route: its body parsed into the worker's text request, then answered
        whole or streamed as `kind`'s chunks."""
        doc = await self._doc(request)
        # "llm:a" names adapter "a" of model "llm" (what lm-eval's model= can carry).
        name, adapter = adapter_choice.split_model(doc.get("model"), doc)
        host = self._generator(name)
        text = adapter_choice.with_adapter(self._parsed(parse, doc, host), adapter)
        shown = adapter_choice.shown_name(host.name, adapter)
        if text.get("stream"):
            chunks = streaming.Chunks(kind, shown, bool(c.stream_of(doc)))
            return await self._stream(host, text, request, doc, chunks)
        reply = await self._run(host, text, request, doc)
        return self._answer(respond(shown, reply), reply)

    async def generate(self, request: web.Request) -> web.Response:
        host = self._generator(self.kapp._host(request).name)
        doc = await self._doc(request)
        _, adapter = adapter_choice.split_model(None, doc)
        text = adapter_choice.with_adapter(self._parsed(c.generate_request, doc, host), adapter)
        reply = await self._run(host, text, request, doc)
        return self._answer(c.generate_response(host.name, reply), reply)

    async def tokenize(self, request: web.Request) -> web.Response:
        doc = await self._doc(request)
        host = self._generator(doc.get("model"))
        # `messages`: the chat template's text, as the chat route feeds it to the model.
        parse = chat.tokenize_chat_request if "messages" in doc else c.tokenize_request
        reply = await self._run(host, self._parsed(parse, doc, host), request, doc)
        tokens = reply["tokens"]
        body = {"tokens": tokens, "count": len(tokens), **_fingerprint(reply)}
        return self._answer(body, reply)

    async def detokenize(self, request: web.Request) -> web.Response:
        doc = await self._doc(request)
        host = self._generator(doc.get("model"))
        reply = await self._run(host, self._parsed(c.detokenize_request, doc, host), request, doc)
        return self._answer({"prompt": reply["prompt"], **_fingerprint(reply)}, reply)

    async def tokenizer_info(self, request: web.Request) -> web.Response:
        host = self._generator(request.query.get("model"))
        reply = await self._run(host, {"task": "info"}, request, dict(request.query))
        return self._answer({**reply["info"], **_fingerprint(reply)}, reply)

    async def health(self, request: web.Request) -> web.Response:
        """vLLM's liveness probe: 200 (no body) while every text generator can answer,
        else 503 saying which cannot."""
        problems = [why for ok, why in map(model_ready, self._generators()) if not ok]
        if problems:
            raise HttpError(503, "not ready: " + "; ".join(problems))
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:

        now = int(time.time())
        data = [
            {
                "id": v.name,
                "object": "model",
                "created": now,
                "owned_by": "hotreload",
                "model_version": v.version,
                "system_fingerprint": v.digest,
            }
            for v in (h.view for h in self._generators())
        ]
        return json_response({"object": "list", "data": data})


def min_version_of(v: Any) -> int | None:
    """`min_version` (the body's field, or the X-Hotreload-Min-Version header's text),
    checked: a whole version number; None when not asked."""
    if v is None:
        return None
    if isinstance(v, str):
        try:
            n: Any = int(v.strip())
        except ValueError:
            n = None
    elif isinstance(v, float) and v.is_integer():  # 3.0, as JSON may write 3 (not inf, nan)
        n = int(v)
    else:
        n = v if isinstance(v, int) and not isinstance(v, bool) else None
    if n is None or n < 0:
        raise HttpError(
            400,
            f"'min_version' must be a version number (an integer >= 0), got {v!r}",
            param="min_version",
        )
    return int(n)


def _version_headers(reply: dict[str, Any]) -> dict[str, str]:
    """The headers naming the version and weights of a reply (or a stream's first frame)."""
    return {VERSION_HEADER: str(reply.get("version")), DIGEST_HEADER: str(reply.get("digest"))}


def _fingerprint(reply: dict[str, Any]) -> dict[str, Any]:
    return {"model_version": reply.get("version"), "system_fingerprint": reply.get("digest")}

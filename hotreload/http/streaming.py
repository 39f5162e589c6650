"""Streamed answers (`"stream": true`) of `/v1/completions` and `/v1/chat/completions`:
Server-Sent Events in the shape OpenAI's clients read (openai-python, LiteLLM).

    data: {chunk}\\n\\n      one per new piece of text, per choice, as the worker makes it
    data: {chunk}\\n\\n      each choice's last piece, with its finish_reason
    data: {usage chunk}\\n\\n  with stream_options.include_usage: `choices: []` and `usage`
    data: [DONE]\\n\\n

Completions stream `text_completion` chunks (`choices[].text`); chat streams
`chat.completion.chunk`s (`choices[].delta`: the role first, then `content`, then an empty
delta with the finish_reason). Asked for, each chunk's `logprobs` are those of the tokens
it completes (legacy or chat shape, as the answer not streamed has them: the pieces add up
to its list; a token that ends inside a character comes with the chunk of its text, the
end-of-text token with the last). With `include_usage` every chunk carries `"usage": null`
and the usage chunk the counts, as OpenAI sends them; without it no chunk has the field
(LiteLLM fails on a usage chunk of another shape). Every chunk's `system_fingerprint` is
the digest of the weights that wrote it, and `model_version` the version (one per stream:
engine/router.py never lets a stream mix versions).

An error before the first token is answered as the same request not streamed would be (a
400 for a prompt too long, a 503, ...): no byte of the stream was sent. After it, the
stream ends with an error event (`data: {"error": {...}}`, which openai-python raises as
an `APIError` with its message: a reload that ended the stream names itself) and
`[DONE]`. A client that goes away stops the request in the worker at its next token:
every write finds it gone, and between writes (a long prompt, a queue) the connection is
looked at every CLIENT_POLL_S.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from hotreload.engine.text_stream import TextStream
from hotreload.errors import ClientError
from hotreload.http.chat import chat_logprobs
from hotreload.http.replies import client_error, error_body
from hotreload.protocol.framing import Frame
from hotreload.protocol.json_read import compact_json
from hotreload.protocol.messages import PARTIAL

DONE = b"data: [DONE]\n\n"
#: How often a stream waiting for its next frame looks whether its client hung up.
CLIENT_POLL_S = 0.25
#: The kinds of stream: the OpenAI object each chunk is, and its id's prefix.
KINDS = {"completion": ("text_completion", "cmpl"), "chat": ("chat.completion.chunk", "chatcmpl")}


def event(doc: dict[str, Any]) -> bytes:
    """One Server-Sent Event carrying `doc` as JSON."""
    return b"data: " + compact_json(doc).encode() + b"\n\n"


class Chunks:
    """The chunks of one stream, made from the worker's frames in order: the token frames
    (`PARTIAL`: a piece of text per choice), then the final reply (each choice's whole
    text, finish_reason and the usage), whose text not sent yet goes in its last chunk."""

    def __init__(self, kind: str, model: str, include_usage: bool) -> None:
        self.object, prefix = KINDS[kind]
        self.chat = kind == "chat"
        self.model = model
        self.include_usage = include_usage
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        #: Per choice index: the text sent so far.
        self.sent: dict[int, str] = {}
        #: Per choice index: how many tokens' log-probabilities were sent so far.
        self.lp_sent: dict[int, int] = {}

    def _chunk(self, frame: dict[str, Any], choices: list[dict[str, Any]]) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": frame.get("digest"),
            "choices": choices,
        }
        if self.include_usage:
            doc["usage"] = None
        # hotreload's own, as on the answers not streamed: the version that wrote it.
        doc["model_version"] = frame.get("version")
        return doc

    def _choice(
        self,
        index: int,
        text: str | None,
        finish: str | None,
        logprobs: dict[str, list[Any]] | None = None,
    ) -> dict[str, Any]:
        """One chunk's choice; `logprobs`: the worker's (legacy shape) for the tokens it
        completes, counted as sent."""
        if logprobs is not None:
            self.lp_sent[index] = self.lp_sent.get(index, 0) + len(logprobs["tokens"])
        if not self.chat:
            doc = {"index": index, "text": text or "", "logprobs": logprobs}
            return {**doc, "finish_reason": finish}
        delta: dict[str, Any] = {}
        if index not in self.sent:  # its first chunk says who speaks
            delta = {"role": "assistant", "content": ""}
        if text:
            delta["content"] = text
        lp = chat_logprobs(logprobs)
        return {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}

    def _rest(self, index: int, whole: dict[str, list[Any]] | None) -> dict[str, Any] | None:
        """The final reply's log-probabilities not sent yet (the tokens whose text was held
        back to the end, the end-of-text token); None when none are left."""
        done = self.lp_sent.get(index, 0)
        if whole is None or len(whole["tokens"]) <= done:
            return None
        return {key: values[done:] for key, values in whole.items()}

    def frame(self, frame: Frame) -> bytes:
        """The events of one frame: a token frame's pieces, or the final reply's last
        pieces, usage chunk and `[DONE]`."""
        h = frame.header
        out: list[bytes] = []
        if h.get(PARTIAL):
            for c in h.get("choices") or ():
                index, text = int(c["index"]), str(c.get("text") or "")
                lp = c.get("logprobs")
                out.append(event(self._chunk(h, [self._choice(index, text, None, lp)])))
                self.sent[index] = self.sent.get(index, "") + text
            return b"".join(out)
        for c in sorted(h.get("choices") or (), key=lambda c: int(c["index"])):
            index, whole = int(c["index"]), str(c.get("text") or "")
            sent = self.sent.get(index, "")
            # The worker sends only text two decodes agree on, so the answer extends it.
            # A tokenizer whose decode rewrote text already sent (further back than one
            # token) cannot be undone: the answer past the length sent still goes, so the
            # client's text is whole to its end, differing only where it was rewritten.
            rest = whole[len(sent) :]
            finish = c.get("finish_reason")
            lp = self._rest(index, c.get("logprobs"))
            if self.chat and rest:
                out.append(event(self._chunk(h, [self._choice(index, rest, None, lp)])))
                self.sent[index] = whole
                rest, lp = "", None
            out.append(event(self._chunk(h, [self._choice(index, rest, finish, lp)])))
            self.sent[index] = whole
        if self.include_usage:
            usage = self._chunk(h, [])
            usage["usage"] = h.get("usage")
            out.append(event(usage))
        out.append(DONE)
        return b"".join(out)

    def error(self, path: str, exc: ClientError) -> bytes:
        """The end of a stream that failed after its first token: the error, `[DONE]`."""
        e = client_error(exc)
        return event(error_body(path, e.status, e.message, e.param, e.code)) + DONE


async def serve(
    request: web.Request,
    stream: TextStream,
    chunks: Chunks,
    headers: Callable[[dict[str, Any]], dict[str, str]],
) -> web.StreamResponse:
    """Answer `request` with `stream`'s frames as Server-Sent Events. `headers`: the
    response headers that name the version of a reply (its first frame's)."""
    watch = ClientWatch(request, stream.close)
    try:
        try:
            frames = await stream.next()
        except ClientError as exc:
            raise client_error(exc) from None  # nothing sent yet: the status says it
        if not frames:
            return web.Response(status=499)  # the client went away before its first token
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                **headers(frames[0].header),
            }
        )
        try:
            await resp.prepare(request)
            while frames:
                # What came since the last write goes in one write (a slow client catches up).
                await resp.write(b"".join(chunks.frame(f) for f in frames))
                try:
                    frames = await stream.next()
                except ClientError as exc:
                    await resp.write(chunks.error(request.path, exc))
                    break
            await resp.write_eof()
        except ConnectionError:
            pass  # the client went away mid-stream (the request is stopped below)
        return resp
    finally:
        watch.stop()
        stream.close()


class ClientWatch:
    """Calls `on_gone` once `request`'s connection is gone, looked at every CLIENT_POLL_S
    (aiohttp does not cancel a handler when its client hangs up): a stream's close, or a
    request's stop (http/openai_routes.py). `gone`: it was called."""

    def __init__(self, request: web.Request, on_gone: Callable[[], None]) -> None:
        self.request, self.on_gone = request, on_gone
        self.gone = False
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(CLIENT_POLL_S, self._look)

    def _look(self) -> None:
        transport = self.request.transport
        if transport is None or transport.is_closing():
            self._timer = None
            self.gone = True
            self.on_gone()
            return
        self._timer = self._loop.call_later(CLIENT_POLL_S, self._look)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

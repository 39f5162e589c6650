"""Who may change the session over HTTP, and who may read its tracebacks.

A TCP port on 127.0.0.1 is open to every local user. Unload followed by a broken file is a
full outage, and a traceback shows the owner's code and paths. So with `[http] auth =
"token"` (the default) the repository routes (index, load, unload) need the bearer token
kept in the private state folder (`.hotreload/http_token`, 0600), and error replies carry
a traceback only for a request that sent it. Health, metadata, infer and /metrics stay
open, as a Triton client expects. `auth = "none"` opens everything, as Triton does.
"""

from __future__ import annotations

import hmac
from typing import Any

from aiohttp import web

#: Routes that need the token (by path prefix).
PROTECTED_PREFIXES = ("/v2/repository",)


def authorized(request: web.Request, token: str | None) -> bool:
    """Did the request send the session's token (always true with auth off)?"""
    if token is None:
        return True
    sent = request.headers.get("Authorization", "")
    scheme, _, value = sent.partition(" ")
    # As bytes: compare_digest refuses a str holding non-ASCII (a header can send one),
    # and a TypeError here would turn a 401 into a bare 500.
    sent_token = value.strip().encode("utf-8", "surrogateescape")
    return scheme.lower() == "bearer" and hmac.compare_digest(sent_token, token.encode())


def refusal(request: web.Request, token_file: str) -> dict[str, Any]:
    """The 401 body for a protected route asked without the token."""
    return {
        "error": (
            f"{request.method} {request.path} needs the session's token: send "
            f"'Authorization: Bearer <token>' with the token in {token_file} (readable "
            'by you alone), or set [http] auth = "none" in the config to open these '
            "routes to every local user"
        )
    }


def needs_token(path: str) -> bool:
    return path.startswith(PROTECTED_PREFIXES)


def token_refusal(request: web.Request, token: str | None, token_file: str) -> web.Response | None:
    """The 401 for a protected route asked without the token; None when the request may go
    on. Asked by the front's one middleware (server.py) before any handler, so an unknown
    or wrong-method path under a protected prefix is refused too; the token is read only
    there, and for an error that carries a traceback (`without_details`)."""
    if token is None or not needs_token(request.path) or authorized(request, token):
        return None
    return web.json_response(
        refusal(request, token_file),
        status=401,
        headers={"WWW-Authenticate": 'Bearer realm="hotreload"'},
    )


def without_details(
    request: web.Request, extra: dict[str, Any], token: str | None
) -> dict[str, Any]:
    """An error reply's extra fields, the traceback left out for a request without the
    token (it shows the owner's code and paths)."""
    if "traceback" not in extra or authorized(request, token):
        return extra
    return {k: v for k, v in extra.items() if k != "traceback"}

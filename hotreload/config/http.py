"""The `[http]` table (the KServe v2 endpoint) and the `--http HOST:PORT` address format."""

from __future__ import annotations

from dataclasses import dataclass

from hotreload.config.checker import Checker

#: `[http] auth` values.
AUTH_MODES = ("token", "none")


@dataclass(frozen=True)
class HttpConfig:
    """The KServe v2 HTTP endpoint (off by default; `--http HOST:PORT` turns it on)."""

    #: Serve the KServe v2 HTTP API (or pass `--http HOST:PORT` to `serve` / `watch`).
    enabled: bool = False
    #: Address to listen on. Loopback by default; `"0.0.0.0"` exposes it to the network, and
    #: there is no authentication.
    host: str = "127.0.0.1"
    #: Port to listen on; 0 picks a free one.
    port: int = 8000
    #: A second listener serving only /metrics (Triton serves it on 8002).
    metrics_port: int | None = None
    #: Seconds a request body may take to arrive in full (then 408, and the connection closes).
    body_timeout_s: float = 60.0
    #: Seconds an idle keep-alive connection stays open.
    keepalive_timeout_s: float = 75.0
    #: Largest body after gzip/deflate inflation, in MiB. Unset: `max_frame_mib`.
    max_inflated_mib: int | None = None
    #: "token": load, unload, the repository index and tracebacks need the bearer token in
    #: the state folder's `http_token` (any local user can reach a port); "none": open to
    #: every local user, as Triton is.
    auth: str = "token"


def parse_http(top: Checker) -> HttpConfig:
    """`[http]` from the top-level table (every key optional)."""
    h = top.subtable("http", tuple(HttpConfig.__dataclass_fields__))
    return HttpConfig(
        enabled=h.get("enabled", bool, False, "true or false"),
        host=h.get("host", str, "127.0.0.1", "a host name or address"),
        port=h.integer("port", 8000, minimum=0, maximum=65535),
        metrics_port=(
            h.integer("metrics_port", 0, minimum=0, maximum=65535)
            if "metrics_port" in h.table
            else None
        ),
        body_timeout_s=h.number("body_timeout_s", 60.0, minimum=0.001),
        keepalive_timeout_s=h.number("keepalive_timeout_s", 75.0, minimum=0.001),
        max_inflated_mib=h.integer("max_inflated_mib", 0, minimum=1, maximum=4096)
        if "max_inflated_mib" in h.table
        else None,
        auth=h.choice("auth", "token", AUTH_MODES),
    )


def parse_http_address(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT`, `PORT` or `[::1]:PORT` -> (host, port); ValueError says why."""
    host, port_text = "127.0.0.1", text
    if text.startswith("["):
        end = text.find("]:")
        if end < 0:
            raise ValueError(f"expected [ADDRESS]:PORT, got {text!r}")
        host, port_text = text[1:end], text[end + 2 :]
    elif ":" in text:
        head, port_text = text.rsplit(":", 1)
        host = head or host
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"expected a port between 0 and 65535 in {text!r}")
    return host, int(port_text)

"""HTTP access to a session: the KServe v2 REST API (Open Inference Protocol), the model
repository extension and Prometheus metrics, served by aiohttp in the manager process.

Off by default; `start_http(session, host, port)` is what `[http] enabled = true` or
`--http HOST:PORT` runs. Like the rest of the manager, this package never imports torch,
textual or pynvml.
"""

from hotreload.http.server import HttpEndpoint, start_http

__all__ = ["HttpEndpoint", "start_http"]

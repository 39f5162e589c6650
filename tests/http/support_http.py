"""Small HTTP helpers for the endpoint tests (raw requests, where tritonclient would refuse
to send something malformed)."""

from __future__ import annotations

import http.client
import importlib.util
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families


def skip_unless_installed(*modules: str) -> None:
    """Skip, as `pytest.importorskip` does, unless every module is installed, but without
    importing any here: the test runs them in a subprocess of its own, and an import in the
    test's process costs seconds (torch, lm-eval; LiteLLM also tries to fetch its price
    list over the network, retrying)."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed", allow_module_level=True)


def request(
    url: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    method: str | None = None,
    timeout: float = 30.0,
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request; HTTP errors are results, not exceptions."""
    req = urllib.request.Request(url + path, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        try:
            return e.code, dict(e.headers), e.read()
        finally:
            e.close()


def error_of(body: bytes) -> str:
    doc = json.loads(body)
    assert set(doc) >= {"error"}, doc
    return doc["error"]


def json_infer(
    data: list[float], shape: list[int], name: str = "x", datatype: str = "FP32"
) -> bytes:
    doc = {"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}]}
    return json.dumps(doc).encode()


def chunked_post(url: str, path: str, chunks: list[bytes]) -> tuple[int, bytes]:
    """POST without Content-Length (chunked), so only the server's body limit can stop it."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", path, body=iter(chunks), encode_chunked=True)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def scrape(url: str) -> dict[str, list[Any]]:
    """/metrics parsed by the Prometheus text parser: sample name -> samples."""
    status, headers, body = request(url, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain"), headers
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s)
    return samples


def value(samples: dict[str, list[Any]], name: str, **labels: str) -> float:
    matches = [s.value for s in samples.get(name, []) if labels.items() <= s.labels.items()]
    assert len(matches) == 1, (name, labels, samples.get(name))
    return matches[0]


def wait_for_status(url: str, path: str, status: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        last = request(url, path)[0]
        if last == status:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} still answers {last}, not {status}, after {timeout} s")

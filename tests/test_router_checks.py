"""The router checks a request's tensors against its payload once: a socket client's header
is checked (`validate_metas`), while the KServe front's, described by its parser from the
body it checked, is not checked again (`tensors_checked`). Both are still checked against
the model's inputs. The parser's checks are the router's: every request it accepts passes
`validate_metas`."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotreload.engine import request_limits
from hotreload.engine.router import ModelRouter
from hotreload.errors import BadRequestError
from hotreload.http.kserve import (
    KSERVE_TO_WIRE,
    InferRequestError,
    parse_infer_request,
    to_router_request,
)
from hotreload.protocol.framing import Frame
from hotreload.protocol.tensors import WIRE_DTYPES, validate_metas
from hotreload.protocol.text import BYTES, encode_strings

META = {"name": "input", "dtype": "float32", "shape": [1, 4], "nbytes": 16}


class RecordingWorker:
    alive = True
    exit_reason = None

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def submit(self, header: dict[str, Any], blobs: list[Any], on_reply: Any) -> bool:
        self.sent.append(header)
        on_reply(Frame({"ok": True, "version": 1}, b""), None)
        return True


def _router() -> tuple[ModelRouter, RecordingWorker]:
    r = ModelRouter(name="m", max_queue_size=8, request_timeout_s=30, max_inflight=4)
    r.input_signature = [{"name": "input", "dtype": "float32", "shape": [1, 4]}]
    worker = RecordingWorker()
    r.worker = worker  # type: ignore[assignment]
    r.open_gate()
    return r, worker


def _outcome(header: dict[str, Any], payload: bytes, checked: bool) -> Frame | BaseException:
    async def run() -> Frame | BaseException:
        r, _ = _router()
        try:
            return await r.submit_future(header, payload, tensors_checked=checked)
        except BadRequestError as exc:
            return exc

    return asyncio.run(asyncio.wait_for(run(), 30))


def test_checked_tensors_are_not_validated_again(monkeypatch: pytest.MonkeyPatch) -> None:
    def again(*args: Any) -> Any:
        raise AssertionError("validate_metas ran on tensors the parser checked")

    monkeypatch.setattr(request_limits, "validate_metas", again)
    header = {"tensors": [META], "form": "single"}
    assert isinstance(_outcome(header, b"\0" * 16, checked=True), Frame)
    # Still checked against the model's inputs.
    wrong = {"tensors": [{**META, "dtype": "float64", "nbytes": 32}], "form": "single"}
    refused = _outcome(wrong, b"\0" * 32, checked=True)
    assert isinstance(refused, BadRequestError) and "expected dtype float32" in str(refused)


def test_a_socket_clients_tensors_are_validated() -> None:
    bad = {"tensors": [{**META, "nbytes": 12}], "form": "single"}
    refused = _outcome(bad, b"\0" * 12, checked=False)
    assert isinstance(refused, BadRequestError) and "nbytes 12 does not match" in str(refused)


_DTYPES = list(KSERVE_TO_WIRE)


@st.composite
def _infer_bodies(draw: st.DrawFn) -> tuple[bytes, str | None]:
    """Valid and invalid KServe bodies: JSON and binary inputs of any datatype, with
    sizes that may not fit."""
    inputs, blobs = [], []
    for i in range(draw(st.integers(1, 3))):
        kserve = draw(st.sampled_from(_DTYPES))
        dtype = KSERVE_TO_WIRE[kserve]
        shape = draw(st.lists(st.integers(0, 3), min_size=0, max_size=3))
        count = int(np.prod(shape))
        name = draw(st.sampled_from([f"in{i}", "in0"]))  # names may repeat
        if dtype == BYTES:
            values = draw(st.lists(st.text(max_size=3), min_size=count, max_size=count))
            raw = encode_strings(np.asarray(values, dtype=object).reshape(-1))[1]
        else:
            raw = np.zeros(count, WIRE_DTYPES[dtype]).tobytes()
            values = np.zeros(count, WIRE_DTYPES[dtype]).tolist()
        if draw(st.booleans()):
            size = len(raw) + draw(st.sampled_from([0, 0, 0, 1, -1]))
            inputs.append(
                {
                    "name": name,
                    "datatype": kserve,
                    "shape": shape,
                    "parameters": {"binary_data_size": size},
                }
            )
            blobs.append(raw)
        else:
            data: Any = values if draw(st.integers(0, 4)) else [*values, values[:1]]
            inputs.append({"name": name, "datatype": kserve, "shape": shape, "data": data})
    head = json.dumps({"inputs": inputs}).encode()
    return head + b"".join(blobs), str(len(head)) if blobs else None


@settings(max_examples=300, deadline=None)
@given(body=_infer_bodies(), form=st.sampled_from(["single", "tuple", "dict"]))
def test_whatever_the_parser_accepts_passes_the_routers_checks(
    body: tuple[bytes, str | None], form: str
) -> None:
    """The guarantee `tensors_checked` stands on."""
    try:
        header, payload = to_router_request(parse_infer_request(*body), form, [])
    except InferRequestError:
        return
    validate_metas(header["tensors"], len(payload), payload)


@pytest.mark.parametrize("timeout_s", [float("nan"), float("inf"), -1.0, 0, True, "5"])
def test_a_timeout_that_is_no_finite_positive_number_gets_the_models(timeout_s: Any) -> None:
    """A socket client's `timeout_s` NaN passed `<= 0` and `min(nan, 30)` is NaN: a request
    with no deadline at all. Such a value takes the model's request_timeout_s."""

    async def run() -> float:
        r, worker = _router()
        header = {"tensors": [META], "form": "single", "timeout_s": timeout_s}
        await r.submit_future(header, b"\0" * 16)
        return float(worker.sent[-1]["deadline"]) - asyncio.get_running_loop().time()

    left = asyncio.run(asyncio.wait_for(run(), 30))
    assert 25 < left <= 30, left

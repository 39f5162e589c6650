"""Property-based tests (hypothesis) for push descriptors and HTTP `parameters` (issue 30):
a descriptor of any shape is refused with a ValueError/BadRequestError and never blocks,
whatever fd its path names; any `parameters` either fit the worker's header or are refused
at the edge, counted as the router writes them."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hotreload.engine.push_intake import intake
from hotreload.engine.request_limits import FORWARD_HEADER_LIMIT, forward_problem
from hotreload.errors import BadRequestError
from hotreload.http.kserve import InferRequestError, parse_infer_request, to_router_request
from hotreload.protocol.framing import header_bytes
from hotreload.protocol.shared_state import pack_state, validate_descriptor

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
ENTRY = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["w", "b", ""]) | JSON,
        "dtype": st.sampled_from(["float32", "float64", "bfloat16", "str"]) | JSON,
        "shape": st.lists(st.integers(-1, 4), max_size=3) | JSON,
        "nbytes": st.integers(-1, 128) | st.floats() | JSON,
        "via": st.sampled_from(["memfd", "cuda_ipc", "disk"]) | JSON,
        "offset": st.integers(-64, 256) | JSON,
        "device": st.integers(-1, 2) | JSON,
        "stride": st.lists(st.integers(-1, 4), max_size=3) | JSON,
        "handle": st.dictionaries(st.sampled_from(["handle", "storage_size_bytes"]), JSON) | JSON,
    },
)
DESCRIPTOR = (
    st.fixed_dictionaries(
        {},
        optional={
            "kind": st.sampled_from(["memfd", "cuda_ipc", "mixed", "x"]) | JSON,
            "path": st.builds(
                lambda pid, fd: f"/proc/{pid}/fd/{fd}",
                st.sampled_from(["self", "1", str(os.getpid())]),
                st.integers(0, 40),
            )
            | JSON,
            "memfd_name": st.sampled_from(["hotreload-state-0123456789abcdef", "x"]) | JSON,
            "size": st.integers(-1, 512) | JSON,
            "tensors": st.lists(ENTRY, max_size=3) | JSON,
        },
    )
    | JSON
)


@settings(max_examples=150, deadline=None)
@given(DESCRIPTOR)
def test_validate_descriptor_raises_only_value_errors(d: Any) -> None:
    try:
        validate_descriptor(d, peer_pid=os.getpid())
    except ValueError:
        pass


@pytest.fixture(scope="module")
def open_fds(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A FIFO with no writer, a plain file and a real sealed memfd, open in this process:
    what a descriptor's path may name."""
    folder = tmp_path_factory.mktemp("fds")
    os.mkfifo(folder / "fifo")
    fifo = os.open(folder / "fifo", os.O_RDONLY | os.O_NONBLOCK)
    plain = os.open(folder / "plain", os.O_RDWR | os.O_CREAT, 0o600)
    import numpy as np

    packed = pack_state({"w": np.zeros(4, np.float32)})
    yield [fifo, plain, packed.fd]
    packed.close()
    os.close(fifo)
    os.close(plain)


def test_intake_never_blocks_and_refuses_all_but_the_senders_sealed_memfd(open_fds) -> None:  # type: ignore[no-untyped-def]
    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(DESCRIPTOR, st.sampled_from([*open_fds, 0, 1, 2, 999]))
    def check(d: Any, fd: int) -> None:
        if isinstance(d, dict) and isinstance(d.get("path"), str) and "/fd/" in d["path"]:
            d = {**d, "path": f"/proc/{os.getpid()}/fd/{fd}"}

        async def run() -> None:
            try:
                checked = await asyncio.wait_for(intake(d, os.getpid()), 10)
            except BadRequestError:
                return
            checked.close()

        asyncio.run(run())

    check()


PARAMS = st.dictionaries(
    st.text(max_size=8),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=2000)
    | st.integers()
    | st.lists(st.text(max_size=50), max_size=50),
    max_size=6,
)


@settings(max_examples=80, deadline=None)
@given(PARAMS, st.integers(0, 600))
def test_http_parameters_fit_the_worker_header_or_are_refused(params: dict, grow: int) -> None:
    if params:
        # Now and then a value near the limit, ASCII-escaped to several times its size.
        params[next(iter(params))] = "é" * (grow * 1000)
    doc = {
        "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}],
        "parameters": params,
    }
    try:
        req = parse_infer_request(json.dumps(doc).encode(), None)
        header, _ = to_router_request(req, "single", [])
    except InferRequestError:
        return
    problem = forward_problem(header["tensors"], header.get("parameters"))
    size = header_bytes(
        {"tensors": header["tensors"], "parameters": header.get("parameters") or {}}
    )
    assert (problem is None) == (size <= FORWARD_HEADER_LIMIT), (size, problem)
    if problem:
        assert f"{FORWARD_HEADER_LIMIT}-byte header limit" in problem

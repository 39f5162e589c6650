"""The request and answer of an `infer` as both clients build and read them (client.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from hotreload.errors import ERROR_CLASSES, ClientError, ModelError
from hotreload.protocol.framing import Frame
from hotreload.protocol.tensors import BF16, bf16_to_float32, decode_tensors, encode_tensors
from hotreload.protocol.text import BYTES


class _Answer(NamedTuple):
    output: Any
    version: int
    model: str


class InferResult(_Answer):
    """What `infer` returns: unpack as `output, version, model = client.infer(...)`, and
    `.digest`, the content digest of the weights that computed it (the one
    `update_weights` and `hotreload status` report; None for a model without weights)."""

    digest: str | None

    def __new__(
        cls, output: Any, version: int, model: str, digest: str | None = None
    ) -> InferResult:
        self = super().__new__(cls, output, version, model)
        self.digest = digest  # an attribute, not a fourth field: 3-way unpacking holds
        return self

    def _replace(self, **changes: Any) -> InferResult:
        fields = {**self._asdict(), "digest": self.digest, **changes}
        return InferResult(**fields)


def build_infer_header(
    model: str | None,
    inputs: Any,
    timeout_s: float | None,
    parameters: Mapping[str, Any] | None = None,
    min_version: int | None = None,
) -> tuple[dict[str, Any], list[Any]]:
    """A request's header and blobs. A str or a list of str is one strings (BYTES) input;
    a tuple/list of arrays, positional inputs; a dict, named inputs. `min_version`: served
    by that version of the model or a later one (a trainer reading its own push)."""
    if isinstance(inputs, Mapping):
        form, named = "dict", dict(inputs)
    elif isinstance(inputs, (tuple, list)) and inputs and all(hasattr(v, "shape") for v in inputs):
        form, named = "tuple", {f"input_{i}": v for i, v in enumerate(inputs)}
    else:
        form, named = "single", {"input": inputs}
    metas, blobs = encode_tensors(named)
    header: dict[str, Any] = {"op": "infer", "model": model, "form": form, "tensors": metas}
    if timeout_s is not None:
        header["timeout_s"] = timeout_s
    if parameters:
        header["parameters"] = dict(parameters)
    if min_version is not None:
        header["min_version"] = int(min_version)
    return header, blobs


def raise_for_error(frame: Frame) -> None:
    if frame.header.get("ok"):
        return
    err = frame.header.get("error") or {}
    code = err.get("code", "error")
    message = err.get("message", "request failed")
    if code == "model_error":
        raise ModelError(message, err.get("traceback"))
    raise ERROR_CLASSES.get(code, ClientError)(message)


def _client_value(meta: Mapping[str, Any], arr: Any, raw: bool) -> Any:
    """What a caller gets for one output: strings as str (a list per row), bfloat16 widened
    to float32 (exact) unless `raw` asks for the uint16 bit patterns."""
    if meta["dtype"] == BYTES:
        return arr.tolist()
    if meta["dtype"] == BF16 and not raw:
        return bf16_to_float32(arr)
    return arr


def decode_result(frame: Frame, raw: bool = False) -> InferResult:
    h = frame.header
    metas = h.get("tensors", [])
    decoded = decode_tensors(metas, frame.payload)
    arrays = {m["name"]: _client_value(m, decoded[m["name"]], raw) for m in metas}
    form = h.get("form", "single")
    if form == "single":
        output: Any = next(iter(arrays.values()))
    elif form == "tuple":
        output = tuple(arrays.values())
    else:
        output = arrays
    return InferResult(output, int(h.get("version") or 0), h.get("model", ""), h.get("digest"))


def _rows(inputs: Any) -> Any:
    """One prompt is a batch of one: a str travels as a one-row strings tensor."""
    return [inputs] if isinstance(inputs, str) else inputs


def _unrow(inputs: Any, result: InferResult) -> InferResult:
    """...and its answer comes back as one str when the model answered one string."""
    out = result.output
    if isinstance(inputs, str) and isinstance(out, list) and len(out) == 1:
        return result._replace(output=out[0])
    return result

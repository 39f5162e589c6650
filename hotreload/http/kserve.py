"""KServe v2 (Open Inference Protocol) tensors: JSON and the binary tensor extension.

Pure functions with no HTTP in them: `parse_infer_request` turns a request body into tensors
the router accepts (wire dtypes, raw little-endian bytes), `encode_infer_response` turns a
worker reply into a KServe response body. Every problem is an `InferRequestError` whose
message says what was wrong and what was expected, answered as HTTP 400.

Binary tensor extension: the body starts with `Inference-Header-Content-Length` bytes of
JSON; each binary input declares `parameters.binary_data_size` and its bytes follow the
JSON in input order. `tritonclient.http` sends binary inputs and asks for binary outputs
by default, so this is the common path, not an extra.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hotreload.engine.signature import dims_of, output_dims
from hotreload.errors import ProtocolError
from hotreload.protocol.header_fields import json_type
from hotreload.protocol.json_read import dumps, loads
from hotreload.protocol.tensors import (
    BF16,
    MAX_RANK,
    WIRE_DTYPES,
    bf16_to_float32,
    float32_to_bf16,
)
from hotreload.protocol.text import BYTES, decode_strings, encode_strings, split_strings

#: Header naming the length of the JSON part of a body that carries binary tensors.
HEADER_LENGTH = "Inference-Header-Content-Length"

#: KServe datatype -> wire dtype name (torch/numpy spelling).
KSERVE_TO_WIRE: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BF16": BF16,
    "BYTES": BYTES,
}
WIRE_TO_KSERVE: dict[str, str] = {v: k for k, v in KSERVE_TO_WIRE.items()}
#: Types a model may declare (metadata) that cannot travel.
_METADATA_ONLY = {"uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64"}
_KNOWN_KSERVE = (*KSERVE_TO_WIRE, "UINT16", "UINT32", "UINT64")


#: Request parameters that Triton and its clients use themselves: never passed to a model.
TRITON_PARAMETERS = frozenset(
    {
        "binary_data_output",
        "binary_data_size",
        "timeout",
        "priority",
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "headers",
        "classification",
    }
)


class InferRequestError(ValueError):
    """The request body is not a valid KServe v2 infer request; answered with HTTP 400."""


def kserve_datatype(wire_dtype: str) -> str:
    """KServe datatype for a wire/torch dtype name, for metadata."""
    return WIRE_TO_KSERVE.get(wire_dtype) or _METADATA_ONLY.get(wire_dtype, wire_dtype.upper())


def metadata_shape(shape: Sequence[int]) -> list[int]:
    """Dimension 0 is the batch and may vary (-1); the others are fixed by the example."""
    return [-1, *shape[1:]] if shape else []


def model_metadata_doc(
    name: str,
    version: int | None,
    form: str,
    inputs: Sequence[Mapping[str, Any]],
    outputs: Sequence[Mapping[str, Any]],
    digest: str | None = None,
    adapters: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """KServe model metadata: inputs with their declared dims (-1 where any size is
    accepted). An output's dimensions past the batch are -1 as soon as an input may vary
    beyond its batch (they may follow it, as a sequence length does). `parameters`
    carries the serving weights' digest, and its peft adapters' (the default, each one's
    digest), hotreload's addition that clients ignore."""
    in_dims = [dims_of(s) for s in inputs]
    params = {"weights_digest": digest} if digest else {}
    if adapters:
        params["adapters"] = dict(adapters)
    extra = {"parameters": params} if params else {}
    return {
        **extra,
        "name": name,
        "versions": [str(version)] if version else [],
        "platform": "pytorch",
        "inputs": [
            {
                # One-input models take any input name; "input" is what the example uses.
                "name": "input" if form == "single" else s["name"],
                "datatype": kserve_datatype(s["dtype"]),
                "shape": d,
            }
            for s, d in zip(inputs, in_dims, strict=True)
        ],
        "outputs": [
            {
                "name": o["name"],
                "datatype": kserve_datatype(o["dtype"]),
                "shape": output_dims(inputs, o),
            }
            for o in outputs
        ],
    }


@dataclass
class InputTensor:
    name: str
    dtype: str
    shape: list[int]
    data: bytes | memoryview


@dataclass
class InferRequest:
    """A parsed infer request: tensors in the order they came, and what to send back."""

    id: str | None
    inputs: list[InputTensor]
    #: Requested output name -> binary? (None: every output, `binary_default` decides).
    outputs: dict[str, bool] | None
    binary_default: bool
    timeout_s: float | None
    extra: dict[str, Any] = field(default_factory=dict)
    #: Request parameters meant for the model (Triton's own keys taken out).
    model_parameters: dict[str, Any] = field(default_factory=dict)


def _obj(value: Any, what: str, *args: Any) -> dict[str, Any]:
    """`value`, a JSON object; else the error naming `what.format(*args)` (formatted only
    then: a request checks a few objects, and formatting each name cost more than that)."""
    if not isinstance(value, dict):
        raise InferRequestError(
            f"{what.format(*args)} must be a JSON object, got {json_type(value)}"
        )
    return value


def _split_body(body: bytes, header_length: str | None) -> tuple[bytes | memoryview, memoryview]:
    if header_length is None:
        return body, memoryview(b"")
    try:
        n = int(header_length)
    except ValueError:
        raise InferRequestError(
            f"{HEADER_LENGTH} must be an integer, got {header_length!r}"
        ) from None
    if not 0 <= n <= len(body):
        raise InferRequestError(
            f"{HEADER_LENGTH} is {n} but the body has {len(body)} bytes; it must give the "
            "length of the JSON part that starts the body"
        )
    view = memoryview(body)
    return view[:n], view[n:]


def _shape(value: Any, name: str) -> list[int]:
    # `type(d) is int`: JSON's integers are ints (a bool is refused), read in a plain loop
    # (`all` over a generator cost three times as much for a shape of two).
    ok = isinstance(value, list) and len(value) <= MAX_RANK
    for d in value if ok else ():
        if type(d) is not int or d < 0:
            ok = False
            break
    if not ok:
        raise InferRequestError(
            f"input {name!r}: 'shape' must be a list of sizes >= 0, got {value!r}"
        )
    return value


def _datatype(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise InferRequestError(
            f"input {name!r}: 'datatype' must be a string such as \"FP32\", got {json_type(value)}"
        )
    if value not in KSERVE_TO_WIRE:
        hint = "" if value in _KNOWN_KSERVE else " (datatypes are upper case, e.g. FP32)"
        raise InferRequestError(
            f"input {name!r}: unsupported datatype {value!r}{hint}; use one of "
            f"{', '.join(KSERVE_TO_WIRE)}"
        )
    return KSERVE_TO_WIRE[value]


#: struct's codes for the dtypes whose JSON numbers it packs as numpy converts them: each
#: a C cast of the number's double, a finite one past the dtype's range refused.
_STRUCT_CODES = {"float32": "f", "float64": "d"}


def _packed(data: Any, dtype: str, want: int) -> bytes | None:
    """`data` as `dtype`'s little-endian bytes when it is a flat list of `want` JSON
    numbers, none of them a bool (the caller knows the text has no `true` or `false`);
    else None, for `_json_data`'s general path to convert it or say what is wrong. One C
    pass: the general path's type check and numpy's conversion of a 1x64 list took four
    times the instructions (6% of the HTTP front's work a request)."""
    code = _STRUCT_CODES.get(dtype)
    if code is None or type(data) is not list or len(data) != want:
        return None
    try:
        # Refuses a string, a null, a list (nested data) and a finite number past the
        # range (OverflowError); takes ints and floats, as numpy does.
        return struct.pack(f"<{want}{code}", *data)
    except (struct.error, TypeError, OverflowError):
        return None


def _json_data(data: Any, name: str, dtype: str, shape: list[int], bools: bool = True) -> bytes:
    """The bytes of a tensor sent as JSON `data`. `bools`: the text may hold a JSON bool
    (False: it has no `true` or `false` in it, so no value in `data` is a bool)."""
    want = math.prod(shape)
    if not bools and (packed := _packed(data, dtype, want)) is not None:
        return packed
    if dtype == BYTES:
        items = np.asarray(data, dtype=object).reshape(-1)
        if items.size != want or not all(isinstance(v, str) for v in items.tolist()):
            raise InferRequestError(
                f"input {name!r}: BYTES 'data' must hold {want} string(s) for shape {shape}"
            )
        return encode_strings(items)[1]
    problem = _numbers_problem(data, dtype, shape)
    if problem:
        raise InferRequestError(f"input {name!r}: {problem}")
    try:
        # A number past the dtype's range (3.5e38 for FP32) is the client's mistake: say so,
        # rather than serve an inf (numpy only warns on an overflowing cast).
        with np.errstate(over="raise", invalid="raise"):
            if dtype == BF16:
                # JSON carries numbers: round them to bfloat16 here, as Triton does.
                arr = float32_to_bf16(np.asarray(data, dtype=np.float32))
            else:
                arr = np.asarray(data, dtype=WIRE_DTYPES[dtype])
    except (TypeError, ValueError, OverflowError, FloatingPointError) as exc:
        raise InferRequestError(
            f"input {name!r}: 'data' does not hold {dtype} values: {exc}"
        ) from None
    if arr.size != want:
        raise InferRequestError(
            f"input {name!r}: 'data' has {arr.size} element(s) but shape {shape} needs {want}"
        )
    return arr.tobytes()


#: The types of a flat list of JSON numbers (exact: bool is an int to isinstance, and
#: `_items_problem` refuses it for any dtype but bool).
_FLAT_NUMBERS = frozenset({int, float})


def _numbers_problem(data: Any, dtype: str, shape: list[int]) -> str | None:
    """Why `data` is not numbers laid out flat or nested as `shape` (None: it is)."""
    if dtype != "bool" and type(data) is list and {type(v) for v in data} <= _FLAT_NUMBERS:
        # Flat JSON numbers, what clients send: `_items_problem` finds nothing wrong with
        # them, at three times the cost (an object array, a list, a set of its types).
        return None
    return _items_problem(data, dtype, shape)


def _items_problem(data: Any, dtype: str, shape: list[int]) -> str | None:
    """`_numbers_problem` item by item, through numpy. numpy alone took "1" as 1.0 and None
    as NaN, and any nesting with the right count."""
    try:
        items = np.asarray(data, dtype=object)
    except ValueError:
        return f"'data' is nested unevenly; send it flat or nested as shape {shape}"
    if items.ndim > 1 and list(items.shape) != list(shape):
        return f"'data' nests as {list(items.shape)}, not as shape {shape}; send it flat or so"
    allowed: tuple[type, ...] = (bool, int) if dtype == "bool" else (int, float)
    kinds = {type(v) for v in items.reshape(-1).tolist()}
    if list in kinds:  # numpy keeps the rows of ragged lists as objects
        return f"'data' is nested unevenly; send it flat or nested as shape {shape}"
    wrong = sorted(
        k.__name__ for k in kinds if not issubclass(k, allowed) or (k is bool and dtype != "bool")
    )
    if wrong:
        shown = {"str": "strings", "NoneType": "nulls", "list": "lists", "dict": "objects"}
        what = ", ".join(shown.get(w, w) for w in wrong)
        return f"'data' does not hold {dtype} values: it holds {what} (JSON numbers only)"
    return None


def parse_infer_request(body: bytes, header_length: str | None) -> InferRequest:
    """Parse a KServe v2 infer request body (JSON, or JSON followed by binary tensors)."""
    head, binary = _split_body(body, header_length)
    head = head if isinstance(head, bytes) else bytes(head)
    try:
        doc = loads(head)
    except (ValueError, RecursionError) as exc:
        # ValueError covers a syntax error (JSONDecodeError), bad UTF-8 and an integer of
        # more than 4300 digits; RecursionError, nesting deeper than the parser goes.
        where = f"the first {len(head)} bytes ({HEADER_LENGTH})" if header_length else "the body"
        raise InferRequestError(f"{where} is not valid JSON: {exc}") from None
    doc = _obj(doc, "the request")
    params = _obj(doc.get("parameters") or {}, "'parameters'")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InferRequestError("'inputs' must be a non-empty list of tensors")

    inputs: list[InputTensor] = []
    offset = 0
    bools = b"true" in head or b"false" in head  # JSON's only spellings of a bool
    for i, raw in enumerate(raw_inputs):
        t = _obj(raw, "inputs[{}]", i)
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise InferRequestError(f"inputs[{i}] needs a 'name' (a non-empty string)")
        if any(x.name == name for x in inputs):
            raise InferRequestError(f"input {name!r} appears twice")
        dtype = _datatype(t.get("datatype"), name)
        shape = _shape(t.get("shape"), name)
        nbytes = math.prod(shape) * WIRE_DTYPES[dtype].itemsize if dtype != BYTES else None
        tparams = _obj(t.get("parameters") or {}, "input {!r}: 'parameters'", name)
        size = tparams.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise InferRequestError(
                    f"input {name!r}: binary_data_size must be an integer >= 0, got {size!r}"
                )
            if nbytes is None:
                try:  # strings: the elements' own lengths must add up to the size
                    split_strings(binary[offset : offset + size], math.prod(shape), name)
                except ProtocolError as exc:
                    raise InferRequestError(f"input {name!r}: {exc}") from None
            elif size != nbytes:
                raise InferRequestError(
                    f"input {name!r}: binary_data_size is {size} but datatype "
                    f"{t['datatype']} and shape {shape} need {nbytes} bytes"
                )
            if offset + size > len(binary):
                raise InferRequestError(
                    f"input {name!r}: binary_data_size {size} runs past the end of the body "
                    f"({len(binary) - offset} binary bytes left)"
                )
            data: bytes | memoryview = binary[offset : offset + size]
            offset += size
        elif "data" in t:
            data = _json_data(t["data"], name, dtype, shape, bools)
        else:
            raise InferRequestError(
                f"input {name!r} has neither 'data' nor parameters.binary_data_size"
            )
        inputs.append(InputTensor(name, dtype, shape, data))
    if offset != len(binary):
        raise InferRequestError(
            f"the body has {len(binary) - offset} binary byte(s) that no input's "
            "binary_data_size accounts for"
        )

    outputs: dict[str, bool] | None = None
    raw_outputs = doc.get("outputs")
    binary_default = params.get("binary_data_output") is True
    if raw_outputs is not None:
        if not isinstance(raw_outputs, list):
            raise InferRequestError("'outputs' must be a list of {name, parameters}")
        outputs = {}
        for i, raw in enumerate(raw_outputs):
            o = _obj(raw, "outputs[{}]", i)
            if not isinstance(o.get("name"), str):
                raise InferRequestError(f"outputs[{i}] needs a 'name'")
            oparams = _obj(o.get("parameters") or {}, "outputs[{}].parameters", i)
            outputs[o["name"]] = bool(oparams.get("binary_data", binary_default))

    # Triton's `timeout` parameter is in microseconds.
    timeout = params.get("timeout")
    timeout_s = (
        timeout / 1e6
        if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0
        else None
    )
    rid = doc.get("id")
    return InferRequest(
        id=rid if isinstance(rid, str) else None,
        inputs=inputs,
        outputs=outputs,
        binary_default=binary_default,
        timeout_s=timeout_s,
        model_parameters={k: v for k, v in params.items() if k not in TRITON_PARAMETERS},
    )


def to_router_request(
    req: InferRequest, form: str, signature: Sequence[Mapping[str, Any]]
) -> tuple[dict[str, Any], bytes | memoryview]:
    """Router header and payload. Tuple and dict models get their inputs in signature order
    (a tuple model is called positionally); a single-input model takes any one name."""
    inputs = req.inputs
    if form != "single" and signature:
        order = {s["name"]: i for i, s in enumerate(signature)}
        if all(t.name in order for t in inputs):
            inputs = sorted(inputs, key=lambda t: order[t.name])
    metas = [
        {"name": t.name, "dtype": t.dtype, "shape": t.shape, "nbytes": len(t.data)} for t in inputs
    ]
    payload: bytes | memoryview = (
        inputs[0].data if len(inputs) == 1 else b"".join(t.data for t in inputs)
    )
    header: dict[str, Any] = {"tensors": metas, "form": form}
    if req.timeout_s is not None:
        header["timeout_s"] = req.timeout_s
    if req.model_parameters:
        header["parameters"] = req.model_parameters
    return header, payload


def encode_infer_response(
    model: str,
    version: int,
    req: InferRequest,
    metas: Sequence[Mapping[str, Any]],
    payload: bytes | memoryview,
    digest: str | None = None,
) -> tuple[list[bytes | memoryview], int | None]:
    """Body pieces and the JSON part's length when binary outputs follow it (else None).
    `digest`: the weights that computed it, as the response's `parameters.weights_digest`."""
    if req.outputs is not None:
        known = {m["name"] for m in metas}
        unknown = [n for n in req.outputs if n not in known]
        if unknown:
            raise InferRequestError(
                f"requested output(s) {unknown} do not exist; model {model!r} returns "
                f"{sorted(known)}"
            )
    view = memoryview(payload) if not isinstance(payload, memoryview) else payload
    view = view.cast("B") if view.format != "B" else view
    outs: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    offset = 0
    for meta in metas:
        n = int(meta["nbytes"])
        chunk = view[offset : offset + n]
        offset += n
        name = meta["name"]
        if req.outputs is not None and name not in req.outputs:
            continue
        binary = req.outputs[name] if req.outputs is not None else req.binary_default
        out: dict[str, Any] = {
            "name": name,
            "datatype": kserve_datatype(meta["dtype"]),
            "shape": list(meta["shape"]),
        }
        if binary:
            out["parameters"] = {"binary_data_size": n}
            blobs.append(chunk)
        elif meta["dtype"] == BYTES:
            values = decode_strings(chunk, list(meta["shape"])).reshape(-1).tolist()
            out["data"] = [v if isinstance(v, str) else v.decode("latin-1") for v in values]
        elif meta["dtype"] == BF16:
            out["data"] = bf16_to_float32(np.frombuffer(chunk, dtype=np.uint16)).tolist()
        else:
            out["data"] = np.frombuffer(chunk, dtype=WIRE_DTYPES[meta["dtype"]]).tolist()
        outs.append(out)
    doc: dict[str, Any] = {"model_name": model, "model_version": str(version), "outputs": outs}
    if req.id is not None:
        doc["id"] = req.id
    if digest:
        doc["parameters"] = {"weights_digest": digest}
    head = dumps(doc)
    return [head, *blobs], (len(head) if blobs else None)

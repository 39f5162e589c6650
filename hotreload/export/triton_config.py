"""config.pbtxt for an exported model, from the signatures the probe learnt.

Batch dimension: hotreload runs each request as sent, its dimension 0 included, and never
merges requests. The exact Triton equivalent is `max_batch_size: 0` with full dims: dimension
0 is -1 (any batch) unless `shapes` fixes it, and Triton, like hotreload, passes each request
whole. (A `max_batch_size > 0` with dynamic batching would merge requests, which changes
answers for models whose rows are not independent.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hotreload.config import ModelConfig
from hotreload.engine.signature import output_dims
from hotreload.export_layout import warmup_file

#: hotreload signature dtype -> Triton config data type.
TRITON_TYPES: dict[str, str] = {
    "bool": "TYPE_BOOL",
    "uint8": "TYPE_UINT8",
    "uint16": "TYPE_UINT16",
    "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64",
    "int8": "TYPE_INT8",
    "int16": "TYPE_INT16",
    "int32": "TYPE_INT32",
    "int64": "TYPE_INT64",
    "float16": "TYPE_FP16",
    "float32": "TYPE_FP32",
    "float64": "TYPE_FP64",
    "bfloat16": "TYPE_BF16",
    "bytes": "TYPE_STRING",
}


class NotExpressible(Exception):
    """The model has something Triton's config cannot describe; the message says what."""


def _type(entry: Mapping[str, Any], what: str) -> str:
    t = TRITON_TYPES.get(entry["dtype"])
    if t is None:
        raise NotExpressible(
            f"{what} {entry['name']!r} has dtype {entry['dtype']}, which Triton has no type for "
            f"(it takes {', '.join(TRITON_TYPES)}); convert it in the model (e.g. .real/.imag "
            "for complex)"
        )
    return t


def _rank(dims: Sequence[int], entry: Mapping[str, Any], what: str) -> None:
    if not dims:
        raise NotExpressible(
            f"{what} {entry['name']!r} is a scalar (shape []); Triton's python backend needs at "
            "least one dimension: give it one in the model (x.reshape(1))"
        )


def _kind(device: str) -> tuple[str, str]:
    """instance_group kind and its `gpus` line for a hotreload `device`."""
    if device == "cpu":
        return "KIND_CPU", ""
    if device.startswith("cuda"):
        return "KIND_GPU", f" gpus: [ {device.partition(':')[2] or '0'} ]"
    # "auto": Triton's own auto, one instance on each GPU it sees, else on the CPU.
    return "KIND_AUTO", ""


def _dims(dims: Sequence[int]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]"


def _str(value: str) -> str:
    return json.dumps(value)  # protobuf text format takes C-style escapes, as JSON writes them


def model_config(model: ModelConfig, probe: Mapping[str, Any]) -> str:
    """The text of config.pbtxt; NotExpressible when something cannot be described."""
    inputs, outputs = probe["inputs"], probe["outputs"]
    lines = [
        f"# Written by `hotreload export triton` for model {model.name!r}; see model.py.",
        f"name: {_str(model.name)}",
        'backend: "python"',
        "# Each request runs whole, as under hotreload: dimension 0 is part of dims.",
        "max_batch_size: 0",
    ]
    entries = []
    for e in inputs:
        _rank(e["dims"], e, "input")
        dtype, dims = _type(e, "input"), _dims(e["dims"])
        entries.append(f"  {{ name: {_str(e['name'])} data_type: {dtype} dims: {dims} }}")
    lines += ["input [", ",\n".join(entries), "]"]
    entries = []
    for o in outputs:
        dims = output_dims(inputs, o)
        _rank(dims, o, "output")
        entries.append(
            f"  {{ name: {_str(o['name'])} data_type: {_type(o, 'output')} dims: {_dims(dims)} }}"
        )
    lines += ["output [", ",\n".join(entries), "]"]
    kind, gpus = _kind(model.device)
    lines.append(f"instance_group [ {{ kind: {kind} count: 1{gpus} }} ]")
    params: dict[str, str] = {}
    if model.threads:
        params["intra_op_threads"] = str(model.threads.intra_op)
        params["inter_op_threads"] = str(model.threads.inter_op)
    params.update({f"env.{k}": v for k, v in model.env.items()})
    for key, value in params.items():
        lines.append(f"parameters {{ key: {_str(key)} value {{ string_value: {_str(value)} }} }}")
    if model.warmup_iters:
        lines += _warmup(model.warmup_iters, inputs, probe["example_shapes"])
    return "\n".join(lines) + "\n"


def _warmup(
    count: int, inputs: Sequence[Mapping[str, Any]], shapes: Mapping[str, Sequence[int]]
) -> list[str]:
    """The example input as Triton's warm-up sample: the model is not ready before it ran
    `warmup_iters` times (as hotreload gates readiness on warm-up)."""
    out = ["model_warmup [", "  {", '    name: "example"', "    batch_size: 1"]
    out.append(f"    count: {count}")
    for i, e in enumerate(inputs):
        out += [
            f"    inputs {{ key: {_str(e['name'])} value {{ data_type: {_type(e, 'input')} "
            f"dims: {_dims(shapes[e['name']])} input_data_file: {_str(warmup_file(i))} }} }}"
        ]
    return [*out, "  }", "]"]

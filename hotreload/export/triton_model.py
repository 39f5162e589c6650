"""A hotreload model exported for Triton Inference Server's python backend.

Written by `hotreload export triton` as `<model>/1/model.py`; it is never imported by
hotreload itself. It runs the model the way hotreload's worker does, with hotreload's own
loading rules (`hotreload_rules.py` next to this file, taken from hotreload's source): the
same factory, weights, example input, device, thread counts and `env`, the same input forms
and the same output flattening. It needs torch, numpy (and safetensors for .safetensors
weights), not hotreload.

What it reads: `hotreload_export.json` next to it (entry points, weights, signatures, set by
the export), and from config.pbtxt the `parameters` (thread counts, `env.NAME` values:
change them there) and the instance kind and device Triton gives this instance.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

HERE = Path(__file__).resolve().parent
#: Parameters Triton and its clients use themselves: never passed to the model.
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
BYTES = "bytes"
#: hotreload's PAYLOAD_ALIGN: the alignment torch's CPU allocator gives.
ALIGN = 64


class TritonPythonModel:
    """One Triton model instance: one model object on one device."""

    def initialize(self, args: dict[str, str]) -> None:
        try:
            self._initialize(args)
        except Exception as exc:
            # Triton shows this text as the load failure (server log and repository index).
            raise RuntimeError(
                f"hotreload export of {args.get('model_name')!r}: the model failed to load: "
                f"{exc}\n{traceback.format_exc()}"
            ) from None

    def _initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        # Before torch is imported: allocator settings and thread pools are read once then.
        for key, value in params.items():
            if key.startswith("env."):
                os.environ[key[4:]] = value
        intra = int(params.get("intra_op_threads") or 0)
        inter = int(params.get("inter_op_threads") or 0)
        if intra:
            os.environ.setdefault("OMP_NUM_THREADS", str(intra))
        if str(HERE) not in sys.path:
            sys.path.insert(0, str(HERE))
        rules: Any = importlib.import_module("hotreload_rules")
        import torch

        self.torch = torch
        self.rules = rules
        if intra:
            torch.set_num_threads(intra)
        if inter:
            try:
                torch.set_num_interop_threads(inter)
            except RuntimeError:
                pass  # another model in this stub process set it first; intra-op still applies
        self.spec = json.loads((HERE / "hotreload_export.json").read_text(encoding="utf-8"))
        kind = args.get("model_instance_kind", "CPU")
        wanted = f"cuda:{args.get('model_instance_device_id', '0')}" if kind == "GPU" else "cpu"
        self.device = rules.pick_device(wanted)
        code = HERE / "code"
        entry, example = (rules.entry_under(self.spec[k], code) for k in ("entry", "example"))
        factory = rules.torchscript_factory(entry) or rules.resolve(entry, code)
        example_fn = rules.resolve(example, code)
        model = factory()
        if not callable(model):
            raise rules.LoadError(
                f"{entry['spec']} returned {type(model).__name__}, which is not callable; "
                "return a torch.nn.Module or a function"
            )
        weights = [str(HERE / w) for w in self.spec["weights"]]
        rules.load_weights(model, weights, self.spec.get("weights_prefix"), root=str(HERE))
        if isinstance(model, torch.nn.Module):
            model = model.to(self.device).eval()
        self.model = model
        self.form, example_inputs = rules.normalise_example(example_fn())
        self.parameters = rules.accepted_parameters(model)
        self.input_names = [e["name"] for e in self.spec["inputs"]]
        self.input_dtypes = {e["name"]: e["dtype"] for e in self.spec["inputs"]}
        self.output_names = [e["name"] for e in self.spec["outputs"]]
        self._smoke({k: rules.to_device(v, self.device) for k, v in example_inputs.items()})

    def _smoke(self, example: dict[str, Any]) -> None:
        """hotreload's smoke test, at load: the example gives finite outputs with the names
        config.pbtxt declares (an edit that changes them must be exported again)."""
        outputs = self._forward(example, {})
        names = list(outputs)
        if names != self.output_names:
            raise self.rules.LoadError(
                f"smoke test: the model's outputs are {names}, config.pbtxt declares "
                f"{self.output_names}; run `hotreload export triton` again"
            )
        for name, value in outputs.items():
            t = value
            if isinstance(t, self.torch.Tensor) and (t.is_floating_point() or t.is_complex()):
                finite = self.torch.isfinite(t)
                if not bool(finite.all()):
                    raise self.rules.LoadError(
                        f"smoke test: output {name!r} has {int((~finite).sum())} non-finite "
                        f"value(s) (NaN or inf) out of {t.numel()} for the example input"
                    )

    def _forward(self, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        with self.torch.inference_mode():
            raw = self.rules.call_model(self.model, self.form, inputs, params)
            _, outputs, _ = self.rules.normalise_output(raw)
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        return outputs

    def execute(self, requests: list[Any]) -> list[Any]:
        # Each request runs as sent, as under hotreload (never merged with others: a model
        # may not treat rows independently), and fails on its own.
        responses = []
        for request in requests:
            try:
                responses.append(self._execute_one(request))
            except Exception as exc:
                detail = "".join(traceback.format_exception(exc)[-12:])
                responses.append(
                    pb_utils.InferenceResponse(
                        output_tensors=[],
                        error=pb_utils.TritonError(f"{type(exc).__name__}: {exc}\n{detail}"),
                    )
                )
        return responses

    def _execute_one(self, request: Any) -> Any:
        inputs: dict[str, Any] = {}
        for name in self.input_names:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                raise ValueError(f"missing input {name!r}; the model takes {self.input_names}")
            inputs[name] = self._input(tensor, self.input_dtypes[name])
        params = self._params(request, inputs)
        outputs = self._forward(inputs, params)
        wanted = set(request.requested_output_names() or self.output_names)
        return pb_utils.InferenceResponse(
            output_tensors=[_output(k, v) for k, v in outputs.items() if k in wanted]
        )

    def _input(self, tensor: Any, dtype: str) -> Any:
        if dtype == BYTES:
            return self.rules.as_rows(_strings(tensor.as_numpy()))
        # DLPack: no copy, and BF16 (which numpy cannot hold) arrives as bfloat16.
        t = self.torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
        if t.device.type == "cpu" and t.data_ptr() % ALIGN:
            # As hotreload does: kernels round differently for data off a 64-byte
            # boundary, and one input must give one answer (torch's allocator aligns).
            t = t.clone()
        return t.to(self.device)

    def _params(self, request: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        """The request's own parameters as keyword arguments, as hotreload passes them."""
        raw = json.loads(request.parameters() or "{}")
        params = {k: v for k, v in raw.items() if k not in TRITON_PARAMETERS}
        problem = self.rules.parameter_problem(params, inputs, self.parameters)
        if problem:
            raise ValueError(problem)
        return params

    def finalize(self) -> None:
        self.model = None
        if getattr(self, "device", None) is not None and self.device.type == "cuda":
            self.torch.cuda.empty_cache()


def _strings(arr: np.ndarray) -> np.ndarray:
    """BYTES elements as str, bytes where they are not UTF-8 (as hotreload decodes them)."""
    out = np.empty(arr.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(arr.reshape(-1).tolist()):
        if isinstance(item, bytes):
            try:
                item = item.decode()
            except UnicodeDecodeError:
                pass
        flat[i] = item
    return out


def _output(name: str, value: Any) -> Any:
    if isinstance(value, (str, bytes, list, tuple)) or (
        isinstance(value, np.ndarray) and value.dtype.kind in "USO"
    ):
        arr = np.asarray(value, dtype=object)
        items = [v.encode() if isinstance(v, str) else v for v in arr.reshape(-1).tolist()]
        data = np.empty(len(items), dtype=object)
        data[:] = items
        return pb_utils.Tensor(name, data.reshape(arr.shape))
    # DLPack, not numpy: no copy, bfloat16 (which numpy cannot hold) keeps its bits, and the
    # stub's numpy path is tied to the numpy it was built against.
    t = value.detach().contiguous()
    if math.prod(t.shape) == 0:
        return pb_utils.Tensor(name, t.cpu().numpy())
    return pb_utils.Tensor.from_dlpack(name, t)

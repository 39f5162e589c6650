"""A hotreload model exported as a Ray Serve deployment: the replica's code.

Written by `hotreload export ray` as `hotreload_ray_app.py` at the root of the application's
working_dir; it is never imported by hotreload itself. Each replica builds the model the way
hotreload's worker does, with hotreload's own loading rules and KServe v2 parsing
(`hotreload_rules.py` beside it, taken from hotreload's source), and serves the KServe v2
routes under the application's route prefix `/v2/models/<name>`.

Weights updates are Ray "lightweight updates": the deployment's `user_config` names the
weights file(s) and their digest; `serve deploy` with a new one calls `reconfigure` on the
running replicas, without restarting them. `reconfigure` builds the new version on a
loader thread beside the serving one (load, warm, smoke: finite outputs of the same names),
while requests keep being answered by the serving version, then swaps. A file that does
not match its digest, fails to load, or gives non-finite output is refused: the serving
version stays, the refusal is logged at ERROR (the replica's log, `serve status` does not
show it: Ray restarts a replica whose reconfigure raises), and every response and the
model metadata carry `weights_update: failed ...` until a good update.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
logger = logging.getLogger("ray.serve")


@dataclass
class Version:
    """One built model: what serves, and what every response says about it."""

    model: Any
    version: int
    files: list[str]
    file_digest: str
    #: hotreload's digest of the loaded state (equal weights, equal digest).
    digest: str | None
    pid: int


@serve.deployment
class HotreloadModel:
    """One replica of one hotreload model."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.folder = HERE  # the model's own working_dir: code/, weights/, its record
        self.spec = json.loads((self.folder / "hotreload_export.json").read_text("utf-8"))
        self.rules: Any = importlib.import_module("hotreload_rules")
        import torch

        self.torch = torch
        threads = self.spec.get("threads") or {}
        if threads.get("intra_op"):
            torch.set_num_threads(int(threads["intra_op"]))
        if threads.get("inter_op"):
            try:
                torch.set_num_interop_threads(int(threads["inter_op"]))
            except RuntimeError:
                pass  # set already in this process; intra-op still applies
        self.device = self.rules.pick_device(self.spec.get("device", "auto"))
        code = self.folder / "code"
        entry, example = (self.rules.entry_under(self.spec[k], code) for k in ("entry", "example"))
        self.factory = self.rules.torchscript_factory(entry) or self.rules.resolve(entry, code)
        self.form, self.example = self.rules.normalise_example(self.rules.resolve(example, code)())
        self.output_names = [o["name"] for o in self.spec["outputs"]]
        self.serving: Version | None = None
        self.update_error: str | None = None
        # One thread serves forwards (torch's intra-op threads parallelise each one), one
        # builds versions: a load never waits behind requests, nor requests behind a load.
        self.serve_pool = ThreadPoolExecutor(1, thread_name_prefix="hotreload-serve")
        self.load_pool = ThreadPoolExecutor(1, thread_name_prefix="hotreload-load")

    # ----------------------------------------------------------------- weights updates

    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        """A lightweight update: build the named weights beside the serving version, then
        swap. The first call (inside the replica's start) builds the first version and
        raises on failure; later ones never raise (Ray would restart the replica)."""
        files, digest, version = self._wanted(user_config)
        loop = asyncio.get_running_loop()
        if self.serving is None:
            self.serving = await loop.run_in_executor(
                self.load_pool, self._build, files, digest, version
            )
            logger.info("hotreload %s: serving %s", self.name, self._describe(self.serving))
            return
        if files == self.serving.files and digest == self.serving.file_digest:
            self.serving.version = version
            return
        started = time.perf_counter()
        try:
            built = await loop.run_in_executor(self.load_pool, self._build, files, digest, version)
        except Exception as exc:
            self.update_error = (
                f"failed: the update to {', '.join(files)} ({digest}) was refused, version "
                f"{self.serving.version} ({self.serving.digest}) still serves: {exc}"
            )
            logger.error("hotreload %s: weights update %s", self.name, self.update_error)
            return
        old, self.serving = self.serving, built  # one assignment: a request sees one or other
        self.update_error = None
        logger.info(
            "hotreload %s: weights updated in %.2f s beside the serving version: %s (was %s)",
            self.name,
            time.perf_counter() - started,
            self._describe(built),
            self._describe(old),
        )
        del old  # in-flight forwards hold their own reference until they finish

    def _wanted(self, user_config: dict[str, Any]) -> tuple[list[str], str | None, int]:
        if not isinstance(user_config, dict):
            raise ValueError("user_config must be a mapping {weights, digest, version}")
        weights = user_config.get("weights", [])
        files = [weights] if isinstance(weights, str) else list(weights)
        digest = user_config.get("digest")
        return files, digest, int(user_config.get("version", 1))

    def _path(self, name: str) -> Path:
        p = Path(name)
        return p if p.is_absolute() else self.folder / p

    def _build(self, files: list[str], digest: str | None, version: int) -> Version:
        """Load, warm and smoke a version on the loader thread (the serving one untouched)."""
        paths = [self._path(f) for f in files]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"no such weights file(s) on this node: {', '.join(missing)}")
        actual = self.rules.file_digest(paths)
        if digest is not None and actual != digest:
            raise ValueError(
                f"the file's digest is {actual}, user_config says {digest} (a file still "
                "being written, or another file): copy it in full, then deploy again"
            )
        torch = self.torch
        with torch.inference_mode(False):
            model = self.factory()
            if not callable(model):
                raise self.rules.LoadError(
                    f"{self.spec['entry']['spec']} returned {type(model).__name__}, which is "
                    "not callable; return a torch.nn.Module or a function"
                )
            if paths:
                self.rules.load_weights(
                    model,
                    [str(p) for p in paths],
                    self.spec.get("weights_prefix"),
                    root=str(self.folder),
                )
            if isinstance(model, torch.nn.Module):
                model = model.to(self.device).eval()
        example = {k: self.rules.to_device(v, self.device) for k, v in self.example.items()}
        for _ in range(max(1, int(self.spec.get("warmup_iters", 1)))):
            outputs = self._forward(model, example, {})
        self._smoke(outputs)
        state_digest = None
        if isinstance(model, torch.nn.Module):
            state_digest = self.rules.state_digest(model.state_dict())
        return Version(model, version, files, actual, state_digest, os.getpid())

    def _smoke(self, outputs: dict[str, Any]) -> None:
        names = list(outputs)
        if names != self.output_names and not self.spec.get("allow_output_change"):
            raise self.rules.LoadError(
                f"smoke test: outputs are {names}, the export serves {self.output_names}"
            )
        for name, t in outputs.items():
            if isinstance(t, self.torch.Tensor) and (t.is_floating_point() or t.is_complex()):
                finite = self.torch.isfinite(t)
                if not bool(finite.all()):
                    raise self.rules.LoadError(
                        f"smoke test: output {name!r} has {int((~finite).sum())} non-finite "
                        f"value(s) (NaN or inf) out of {t.numel()} for the example input"
                    )

    def _forward(self, model: Any, inputs: dict[str, Any], params: dict[str, Any]) -> Any:
        with self.torch.inference_mode():
            raw = self.rules.call_model(model, self.form, inputs, params)
            _, outputs, _ = self.rules.normalise_output(raw)
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        return outputs

    def _describe(self, v: Version) -> str:
        return f"version {v.version}, {', '.join(v.files) or 'no weights file'}, {v.digest}"

    # ----------------------------------------------------------------- requests

    def check_health(self) -> None:
        if self.serving is None:
            raise RuntimeError(f"hotreload {self.name}: no version is serving")

    async def __call__(self, request: Request) -> Response:
        path = request.url.path.rstrip("/")
        try:
            if request.method == "POST" and path.endswith("/infer"):
                return await self._infer(request)
            if path.endswith("/ready"):
                return Response(status_code=200 if self.serving else 503)
            if request.method == "GET" and not path.endswith(("/infer", "/stats")):
                return JSONResponse(self._metadata())
        except self.rules.InferRequestError as exc:
            return JSONResponse({"error": f"model {self.name!r}: {exc}"}, status_code=400)
        except Exception as exc:
            detail = "".join(traceback.format_exception(exc)[-6:])
            return JSONResponse(
                {"error": f"model {self.name!r}: {type(exc).__name__}: {exc}\n{detail}"},
                status_code=500,
            )
        return JSONResponse({"error": f"no route {request.method} {path}"}, status_code=404)

    def _metadata(self) -> dict[str, Any]:
        v = self.serving
        doc = self.rules.model_metadata_doc(
            self.name,
            v.version if v else None,
            self.form,
            self.spec["inputs"],
            self.spec["outputs"],
            v.digest if v else None,
        )
        doc.setdefault("parameters", {}).update(self._parameters(v))
        return doc

    def _parameters(self, v: Version | None) -> dict[str, Any]:
        out: dict[str, Any] = {"replica_pid": os.getpid()}
        if v is not None:
            out["weights_file_digest"] = v.file_digest
        if self.update_error:
            out["weights_update"] = self.update_error
        return out

    async def _infer(self, request: Request) -> Response:
        body = await request.body()
        rules = self.rules
        req = rules.parse_infer_request(body, request.headers.get(rules.HEADER_LENGTH))
        header, payload = rules.to_router_request(req, self.form, self.spec["inputs"])
        if self.form != "single":
            names = [s["name"] for s in self.spec["inputs"]]
            got = [t["name"] for t in header["tensors"]]
            if got != names:
                raise rules.InferRequestError(f"inputs are {got}; the model takes {names}")
        params = self._params(header.get("parameters") or {}, got_names(header))
        v = self.serving
        assert v is not None  # check_health: Ray routes only to a replica that has one
        outputs = await asyncio.get_running_loop().run_in_executor(
            self.serve_pool, self._run, v, header["tensors"], payload, params
        )
        metas, parts = rules.encode_tensors(outputs)
        pieces, json_len = rules.encode_infer_response(
            self.name, v.version, req, metas, b"".join(parts), v.digest
        )
        head = json.loads(bytes(pieces[0]))
        head.setdefault("parameters", {}).update(self._parameters(v))
        first = json.dumps(head, separators=(",", ":")).encode()
        headers = {}
        if json_len is not None:
            headers[rules.HEADER_LENGTH] = str(len(first))
        media = "application/octet-stream" if json_len is not None else "application/json"
        return Response(b"".join([first, *pieces[1:]]), headers=headers, media_type=media)

    def _run(self, v: Version, metas: list[Any], payload: Any, params: dict[str, Any]) -> Any:
        inputs = self.rules.request_tensors(metas, payload)
        inputs = {k: self.rules.to_device(t, self.device) for k, t in inputs.items()}
        return self._forward(v.model, inputs, params)

    def _params(self, params: dict[str, Any], inputs: list[str]) -> dict[str, Any]:
        accepted = self.rules.accepted_parameters(self.serving.model if self.serving else None)
        problem = self.rules.parameter_problem(params, inputs, accepted)
        if problem:
            raise self.rules.InferRequestError(problem)
        return params


def got_names(header: dict[str, Any]) -> list[str]:
    return [t["name"] for t in header["tensors"]]


def app(args: dict[str, str]) -> Any:
    """The application builder serve_config.yaml names: `args.model` is the model."""
    return HotreloadModel.options(name=args["model"]).bind(args["model"])

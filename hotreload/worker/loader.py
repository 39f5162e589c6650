"""Build a model version inside the worker: import the user's code, load weights, warm, smoke.

Runs on the worker's loader thread, never on the thread that serves requests, so a load
that takes seconds does not stall serving.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hotreload import runtime
from hotreload.errors import did_you_mean
from hotreload.protocol.messages import SHAPES_REFUSED
from hotreload.worker import adapter_copy, compile_watch, compiled_names, smoke_checks
from hotreload.worker.fast_build import build_without_init
from hotreload.worker.fresh_source import SourceOnlyLoader, folder_prefixes, loaded_files
from hotreload.worker.inputs import replay_inputs, to_device
from hotreload.worker.load_error import LoadError
from hotreload.worker.pacing import no_pause
from hotreload.worker.push_copy import structure_for_push
from hotreload.worker.shared_weights import digest_version
from hotreload.worker.signatures import (
    FORM_SINGLE,
    FORM_TUPLE,
    SignatureError,
    accepted_parameters,
    dropped_note,
    input_signature,
    normalise_example,
    normalise_output,
    output_signature,
    parameter_problem,
)
from hotreload.worker.weight_sources import PlacedWeights, place_weights
from hotreload.worker.weights import torchscript_factory

#: Passes per served signature on a CUDA device: CUDA graphs warm up, record, then replay.
REPLAY_PASSES_CUDA = 3


@dataclass
class ModelVersion:
    """One built version of a model, ready (after warm-up) to serve."""

    version: int
    model: Callable[..., Any]
    example_form: str
    example: dict[str, Any]
    device: torch.device
    stream: Any | None
    load_s: float = 0.0
    warm_s: float = 0.0
    warm_passes_ms: list[float] = field(default_factory=list)
    input_signature: list[dict[str, Any]] = field(default_factory=list)
    output_signature: list[dict[str, Any]] = field(default_factory=list)
    footprint_bytes: int = 0
    on_host: bool = False
    #: Keyword parameters a request may pass, and whether the call takes **kwargs.
    parameters: tuple[set[str], bool] = (set(), False)
    #: Things to say once about this version (outputs left out of replies, how it was built).
    notes: list[str] = field(default_factory=list)
    build_notes: list[str] = field(default_factory=list)
    #: Where its weights came from (files, the version before it, pushes).
    weights: PlacedWeights = field(default_factory=PlacedWeights)
    init_digests: dict[str, str] = field(default_factory=dict)  # what build() set: init_values
    #: Built as the serving module's copy, with no build() call (push_copy.py).
    copied: bool = False
    #: Content digest of its weights (weights_digest.py; None: not a torch module, or
    #: still being computed by `digest_future`).
    digest: str | None = None
    digest_future: Future[str] | None = None
    #: Bytes its digest hashed: the rest were remembered (weights_digest.py, a block's leaves).
    hashed_bytes: int | None = None
    #: What other ops made once for this version (text_op.py's call, tokenizer and
    #: vocabulary size): kept on the version so they go with it; a module-level cache held
    #: a released version's model (and its device memory) until the next text request.
    made: dict[str, Any] = field(default_factory=dict)
    #: The last warm phase: served signatures replayed, those that failed, and what
    #: torch.compile did (None: dynamo was never imported, an eager model).
    replayed: int = 0
    replay_failed: list[str] = field(default_factory=list)
    compile: compile_watch.CompileFigures | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "device": str(self.device),
            "load_s": round(self.load_s, 4),
            "warm_s": round(self.warm_s, 4),
            "warm_passes_ms": [round(x, 3) for x in self.warm_passes_ms],
            "input_form": self.example_form,
            "inputs": self.input_signature,
            "outputs": self.output_signature,
            "footprint_bytes": self.footprint_bytes,
        }


def user_module_names(roots: Sequence[Path]) -> list[str]:
    """Modules currently imported from the model's folders (site-packages excluded)."""
    prefixes = folder_prefixes(roots)
    return [n for n, _, f in loaded_files() if "site-packages" not in f and f.startswith(prefixes)]


def drop_user_modules(roots: Sequence[Path]) -> list[str]:
    """Forget the user's modules so the next import reads the code afresh from disk."""
    names = user_module_names(roots)
    for name in names:
        sys.modules.pop(name, None)
    # A file added since the last load is found even within the folder's mtime tick.
    importlib.invalidate_caches()
    return names


def user_modules(roots: Sequence[Path]) -> dict[str, Any]:
    """The user's modules as they are now (a version keeps those its build ran)."""
    return {name: sys.modules[name] for name in user_module_names(roots) if name in sys.modules}


def restore_user_modules(roots: Sequence[Path], modules: dict[str, Any]) -> None:
    """Put back the user's modules a version was built with: a refused build of an edit
    since undone left its own imported, and a push (the serving code, never the files)
    whose build() runs must find the serving version's, not those."""
    for name in user_module_names(roots):
        if sys.modules.get(name) is not modules.get(name):
            sys.modules.pop(name, None)
    sys.modules.update(modules)


def _path_first(folder: str) -> None:
    """Put the code's folder first on sys.path, even when it is there already (the project
    folder is, as the worker's cwd): after a restart on a snapshot, the snapshot's folder
    went in front, and the user's sibling modules would keep coming from that stale copy."""
    if sys.path[:1] != [folder]:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)
        sys.path.insert(0, folder)


def forget_paths(roots: Sequence[Path]) -> None:
    """Drop sys.path entries inside `roots` (code paths the worker no longer loads from)."""
    prefixes = folder_prefixes(roots)
    sys.path[:] = [
        p for p in sys.path if not (p and (os.path.abspath(p) + os.sep).startswith(prefixes))
    ]


def resolve(entry: dict[str, Any], root: Path) -> Any:
    """Import the module of an entry point and return its attribute."""
    if entry.get("file"):
        file = Path(entry["file"])
        if not file.is_file():
            raise LoadError(f"{entry['spec']}: file {file} no longer exists")
        _path_first(str(file.parent))
        mod_name = file.stem
        module = sys.modules.get(mod_name)
        loaded = getattr(module, "__file__", None)
        paths = {os.path.abspath(file), os.path.realpath(file)}
        if not loaded or os.path.abspath(loaded) not in paths:
            # Compiled from the source, never a .pyc that an edit in the same second fools.
            spec = importlib.util.spec_from_file_location(
                mod_name, file, loader=SourceOnlyLoader(mod_name, str(file))
            )
            if spec is None or spec.loader is None:
                raise LoadError(f"{entry['spec']}: cannot import {file}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[mod_name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(mod_name, None)
                raise
    else:
        _path_first(str(root))
        module = importlib.import_module(entry["module"])
    target: Any = module
    for part in entry["attr"].split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise LoadError(
                f"{entry['spec']}: module {module.__name__!r} has no attribute {entry['attr']!r}"
                + did_you_mean(part, _callables(target))
            ) from None
    if not callable(target):
        raise LoadError(f"{entry['spec']}: {entry['attr']!r} is not callable")
    return target


def _callables(obj: Any) -> list[str]:
    """Public callables of a module or class, the names an entry may point at."""
    out = []
    for name in dir(obj):
        if not name.startswith("_"):
            try:
                if callable(getattr(obj, name)):
                    out.append(name)
            except Exception:
                pass  # a property or module __getattr__ that raises: not a candidate
    return out


def call_model(
    model: Callable[..., Any],
    form: str,
    inputs: dict[str, Any],
    params: dict[str, Any] | None = None,
) -> Any:
    kw = params or {}
    if form == FORM_SINGLE:
        return model(next(iter(inputs.values())), **kw)
    if form == FORM_TUPLE:
        return model(*inputs.values(), **kw)
    return model(**inputs, **kw)


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda"):
        if not torch.cuda.is_available():
            raise LoadError(
                f"device {requested!r} was asked for but torch sees no CUDA device "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); "
                'use device = "auto" or "cpu", or install a CUDA build of torch'
            )
        dev = torch.device(requested)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise LoadError(
                f"device {requested!r} does not exist; torch sees "
                f"{torch.cuda.device_count()} CUDA device(s)"
            )
        return dev
    return torch.device("cpu")


def allocated_bytes(device: torch.device) -> int:
    return int(torch.cuda.memory_allocated(device)) if device.type == "cuda" else 0


def build_version(
    spec: dict[str, Any],
    version: int,
    device: torch.device,
    step_done: Callable[[], None] = no_pause,
    *,
    current: ModelVersion | None = None,
    base: Mapping[str, Any] | None = None,
    overlays: Sequence[Mapping[str, Any]] = (),
    digest_now: bool = False,
    unchanged: Sequence[int] | None = None,
    same_code: bool = False,
    restart: bool = False,
) -> ModelVersion:
    """Import (or reuse) the code, call the factory, load weights, move to the device.
    `step_done` runs between those steps (a `Pacer` yields the CPU to serving there).
    `current`: the serving version, whose weight tensors the build shares when the files
    (or the `unchanged` ones) are unchanged; `base`: another worker's weights block to map
    instead (respawn); `overlays`: pushed weights on top (weight_sources.py). `same_code`
    (not re-imported): an adapters-only change copies the serving module (adapter_copy.py)."""
    root = Path(spec["root"])
    started = time.perf_counter()
    before = allocated_bytes(device)
    stream = None
    runtime.set_loading_version(version)
    try:
        factory = torchscript_factory(spec["entry"]) or resolve(spec["entry"], root)
        example_fn = resolve(spec["example"], root)
        step_done()
        files = spec.get("weights") or []
        build_notes: list[str] = []
        set_by_build: dict[str, str] = {}
        quick = adapter_copy.copied(spec, current, overlays, device) if same_code else None
        pushed = structure_for_push(spec, current, overlays, unchanged) if same_code else None
        if quick is not None:
            model = quick[0]  # the serving module's structure, its tensors shared
        elif pushed is not None:
            model = pushed  # the same, with the push's tensors assigned by place_weights
            set_by_build.update(current.init_digests)  # what build() set is unchanged
        # Only with files, or a push of every tensor (strict): they hold every weight
        # whatever happens (a version whose tensors cannot be shared, a push of a subset);
        # without, build() sets the weights itself.
        elif (files or any(o.get("strict") for o in overlays)) and not spec["entry"].get(
            "torchscript"
        ):
            # Every parameter comes from the files: no random initialization to overwrite.
            model = build_without_init(factory, build_notes.append, set_by_build)
        else:
            model = factory()
        step_done()
        if not callable(model):
            raise LoadError(
                f"{spec['entry']['spec']} returned {type(model).__name__}, which is not callable; "
                "return a torch.nn.Module or a function"
            )
        placed = (
            quick[1]
            if quick is not None
            else place_weights(
                compiled_names.unwrap(model),  # compiled: its weights are the module's inside
                files,
                compiled_names.prefix_for(model, spec.get("weights_prefix")),
                root=str(root),
                device=device,
                current=current,
                base=base,
                overlays=overlays,
                step_done=step_done,
                shared=bool(spec.get("shared_weights")),
                unchanged=unchanged,
                adapters=(spec.get("adapters") or (), spec.get("default_adapter")),
                restart=restart,
            )
        )
        if isinstance(model, torch.nn.Module):
            model = model.to(device).eval()
        try:
            form, example = normalise_example(example_fn())
        except SignatureError as exc:  # named: the factory and the weights loaded fine
            raise LoadError(f"{spec['example']['spec']}: {exc}") from None
        try:
            signature_in = input_signature(example, form, spec.get("shapes"))
        except SignatureError as exc:  # the config's declaration, not the example, is wrong
            raise LoadError(f"{SHAPES_REFUSED}: {exc}") from None
        example = {k: to_device(v, device) for k, v in example.items()}
        if device.type == "cuda":
            # A stream of this version's own: the sync phase waits on exactly these.
            stream = torch.cuda.Stream(device)
            runtime.register_stream(stream, name=f"{spec['name']}-v{version}-serve")
    finally:
        runtime.set_loading_version(None)
    mv = ModelVersion(
        version=version,
        model=model,
        example_form=form,
        example=example,
        device=device,
        stream=stream,
        input_signature=signature_in,
        parameters=accepted_parameters(model),
        build_notes=build_notes,
        weights=placed,
        init_digests={
            k: d for k, d in compiled_names.eager_names(set_by_build).items() if k in placed.keys
        },
        copied=pushed is not None,
    )
    if placed.adapters is not None:
        placed.adapters.digest_into(mv, current, digest_now)  # the base's, and each adapter's
    elif (
        current is not None
        and placed.reused == len(placed.keys) > 0  # all shared: none read (a shard) or pushed
        and placed.overlay_ids == current.weights.overlay_ids
        and placed.keys == current.weights.keys
    ):
        mv.digest = current.digest  # the very tensors the serving version has
    elif isinstance(model, torch.nn.Module):
        # Now, or beside the warm-up and the swap: 1 GiB takes ~0.5 s, which an edit's first
        # new answer need not wait for (op DIGEST waits for it).
        digest_version(mv, compiled_names.unwrap(model).state_dict(), placed, now=digest_now)
    mv.load_s = time.perf_counter() - started
    mv.footprint_bytes = max(0, allocated_bytes(device) - before)
    return mv


def forward(
    mv: ModelVersion, form: str, inputs: dict[str, Any], params: dict[str, Any] | None = None
) -> Any:
    """One inference pass on the version's own stream (CUDA) under inference_mode."""
    if not torch.is_inference_mode_enabled():
        # The serving thread runs in inference mode for good (entering it costs ~15 us a
        # request); warm-ups and smoke tests on other threads enter it here.
        with torch.inference_mode():
            return forward(mv, form, inputs, params)
    if mv.stream is not None:
        with torch.cuda.stream(mv.stream):
            out = call_model(mv.model, form, inputs, params)
        mv.stream.synchronize()
        return out
    return call_model(mv.model, form, inputs, params)


def check_parameters(mv: ModelVersion, params: dict[str, Any], inputs: dict[str, Any]) -> None:
    """Refuse a parameter the model's call does not take (LoadError names what it takes)."""
    problem = parameter_problem(params, inputs, mv.parameters)
    if problem:
        raise LoadError(problem)


def warm(
    mv: ModelVersion,
    iters: int,
    step_done: Callable[[], None] = no_pause,
    shapes: Sequence[list[dict[str, Any]]] = (),
    budget_s: float | None = None,
    compiled_before: bool = False,
) -> None:
    """Run the example `iters` times and time each pass (first pass shows lazy init cost),
    then each served signature in `shapes` (engine/served_shapes.py) so its compile, CUDA
    graph capture, cuDNN autotuning and allocator growth happen here, not on a request.
    On a CPU only a compiled model replays them (this version is a torch.compile wrapper,
    dynamo compiled in its example passes, or `compiled_before`: the version it replaces
    did): an eager one has nothing to prepare there, and the replay would be reload latency.
    `step_done` runs after each pass. A shape starts only while the time spent plus the
    slowest pass so far (a compile) fits in `budget_s`: the rest is left out (said in
    `mv.replay_failed`), so the replay never takes the warm phase past its deadline. What
    torch.compile did lands in `mv.compile`."""
    mv.warm_passes_ms = []
    mv.replayed, mv.replay_failed = 0, []
    watch = compile_watch.Watch()
    started = time.perf_counter()
    example = request_like(mv.example)
    for _ in range(iters):
        t0 = time.perf_counter()
        forward(mv, mv.example_form, example)
        mv.warm_passes_ms.append((time.perf_counter() - t0) * 1000)
        step_done()
    cuda = mv.device.type == "cuda"
    if not cuda and not (compiled_before or _compiled(mv, watch)):
        shapes = ()  # an eager model on a CPU: no compile, autotune or allocator to warm
    # CUDA graphs (mode="reduce-overhead") record on a shape's second call and replay from
    # the third: each shape runs that often on a GPU, once on a CPU (a compile is all).
    passes = REPLAY_PASSES_CUDA if cuda else 1
    for _ in range(passes - iters if iters and cuda and shapes else 0):
        forward(mv, mv.example_form, example)  # the example's shape too, untimed
    # What the next shape may cost: the slowest pass so far, the example's first (its
    # compile) included; a shape at a new size compiles again, and that can be most of
    # warm_s, so "still within the budget before it starts" is not enough.
    slowest_s = max(mv.warm_passes_ms, default=0.0) / 1000
    for i, metas in enumerate(shapes):
        elapsed = time.perf_counter() - started
        if budget_s is not None and elapsed + slowest_s >= budget_s:
            mv.replay_failed.append(
                f"{len(shapes) - i} served shape(s) left out: {elapsed:.2f} s into the warm "
                f"phase, the next one (up to {slowest_s:.2f} s, the slowest pass so far) "
                f"would pass the replay's budget of {budget_s:.2f} s (raise deadlines.warm_s "
                "to warm them all)"
            )
            break
        t0 = time.perf_counter()
        try:
            with torch.inference_mode():
                inputs = replay_inputs(mv.example, metas, mv.device)
            for _ in range(passes):
                forward(mv, mv.example_form, inputs)
            mv.replayed += 1
        except Exception as exc:  # the request at that shape would fail too: said, not fatal
            shape = ", ".join(f"{m['name']} {m['dtype']}{list(m['shape'])}" for m in metas)
            mv.replay_failed.append(f"{shape}: {type(exc).__name__}: {exc}"[:500])
        slowest_s = max(slowest_s, time.perf_counter() - t0)
        step_done()
    mv.warm_s = time.perf_counter() - started
    figures = watch.done()
    # Said for a compiled model (0 compiles, after a weights change, is the news) and
    # wherever dynamo ran; an eager model in a process that imported dynamo says nothing.
    ran = figures.compiles or figures.cache or compiled_names.has_compiled(mv.model)
    mv.compile = figures if ran else None


def _compiled(mv: ModelVersion, watch: compile_watch.Watch) -> bool:
    """This version is compiled: a torch.compile wrapper, or dynamo compiled (or read
    Inductor's cache) during its warm-up so far (a compiled function inside it)."""
    if compiled_names.has_compiled(mv.model):
        return True
    so_far = watch.so_far()
    return bool(so_far.compiles or so_far.cache)


def request_like(example: dict[str, Any]) -> dict[str, Any]:
    """The example as requests are: inference tensors (the serving thread makes them in
    inference mode). Dynamo guards on a tensor's dispatch keys, so a graph compiled for the
    example as build() made it would compile again at the first request of that shape."""
    with torch.inference_mode():
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in example.items()}


def smoke(
    mv: ModelVersion,
    previous: list[dict[str, Any]] | None,
    *,
    allow_output_change: bool,
    expected: dict[str, Any] | None = None,
    seen: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run the example once; reject non-finite outputs and an unexpected output signature.
    `seen` gets the example's outputs once checked finite (the golden comparison's)."""
    example = request_like(mv.example)  # the warm-up's graphs: no compile of its own
    try:
        out_form, outputs, dropped = normalise_output(forward(mv, mv.example_form, example))
    except SignatureError as exc:
        raise LoadError(f"smoke test: {exc}") from None
    note = dropped_note(dropped)
    mv.notes = [*mv.build_notes, *([note] if note else [])]
    smoke_checks.check_finite(outputs)
    if seen is not None:  # before another forward: a CUDA graph's replay reuses the memory
        seen(outputs)
    # And each adapter this build touched (a NaN pushed into one that is not the default).
    smoke_checks.check_adapters(
        mv, lambda: normalise_output(forward(mv, mv.example_form, example))[1]
    )
    sig = output_signature(outputs, out_form)
    if expected:
        smoke_checks.check_expected(sig, expected)
    if previous is not None and not allow_output_change:
        old = [{k: e[k] for k in ("name", "dtype", "shape")} for e in previous]
        new = [{k: e[k] for k in ("name", "dtype", "shape")} for e in sig]
        if old != new:
            raise LoadError(
                f"smoke test: output changed from {smoke_checks.fmt_sig(old)} to "
                f"{smoke_checks.fmt_sig(new)}; "
                "set allow_output_change = true in the model's config if that is intended"
            )
    mv.output_signature = sig
    return sig


def release(mv: ModelVersion | None) -> None:
    """Drop a version: references, collected garbage, the allocator's cached blocks, streams."""
    if mv is None:
        return
    device = mv.device
    before = allocated_bytes(device)
    runtime.forget_streams(mv.version)
    if mv.weights.shared is not None:
        mv.weights.shared.close()  # its pages go once no version maps them
    mv.model = None  # type: ignore[assignment]
    mv.example = {}
    mv.made.clear()
    mv.stream = None
    # A full collection holds the GIL for tens of ms and stalls the serving thread; most of a
    # module goes with its last reference, so collect the young generations first and do a
    # full pass only when device memory did not come back (a cycle holds tensors).
    gc.collect(1)
    if device.type == "cuda":
        if before - allocated_bytes(device) < mv.footprint_bytes // 2:
            gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def offload(mv: ModelVersion) -> None:
    """Move a version to host memory (resource policy keeps it to restore on failure)."""
    if isinstance(mv.model, torch.nn.Module) and mv.device.type == "cuda":
        mv.model.to("cpu")
        mv.example = {k: to_device(v, torch.device("cpu")) for k, v in mv.example.items()}
        mv.on_host = True
        gc.collect()
        torch.cuda.empty_cache()


def restore(mv: ModelVersion) -> None:
    if mv.on_host:
        assert isinstance(mv.model, torch.nn.Module)
        mv.model.to(mv.device)
        mv.example = {k: to_device(v, mv.device) for k, v in mv.example.items()}
        mv.on_host = False

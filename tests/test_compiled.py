"""Compiled models (issue 40): no compile on the serving path after a reload or a restart,
what compiling cost shown on the reload, weights that never recompile, compile caches.

Real workers on CPU with tiny models. Where the point is dynamo's guards (which shapes
compile when) the model compiles with backend="eager": the same guards and recompiles as
Inductor, with no C++ to build on two cores. `dynamic=False` makes every new batch size a
compile of its own, so a shape not replayed shows on the serving counter.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import numpy as np

from hotreload import Client
from tests.support import count_events, import_file, make_project, read_events, wait_until

COMPILED_MODEL = """
import torch
from torch import nn

SCALE = 1.0


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * SCALE


def build() -> nn.Module:
    torch.manual_seed(0)
    return torch.compile(Tiny(), backend="eager", dynamic=False)


def example_input() -> torch.Tensor:
    return torch.ones(1, 8)
"""

CONFIG = """
[[models]]
name = "cm"
entry = "model.py:build"
example = "model.py:example_input"
device = "cpu"
warmup_iters = 1
threads = 1
# Generous: an Inductor compile on a loaded 2-core machine can take a minute, and a warm-up
# past its deadline would restart the worker, which then reads the cache the first one wrote.
deadlines = { start_s = 600, load_s = 600, warm_s = 600 }
"""


def compiled_project(tmp_path: Path) -> Path:
    return make_project(tmp_path, config=CONFIG, files={"model.py": COMPILED_MODEL})


def batch(n: int) -> np.ndarray:
    return np.random.default_rng(n).standard_normal((n, 8), dtype=np.float32)


def model_status(client: Client) -> dict[str, Any]:
    return client.status()["models"][0]


def serving_compiles(client: Client) -> int:
    return int(model_status(client)["worker"].get("serving_compiles", -1))


def set_scale(config: Path, value: float) -> None:
    path = config.parent / "model.py"
    text = path.read_text()
    path.write_text(text.replace("SCALE = 1.0", f"SCALE = {value}"))


def test_served_shapes_are_compiled_before_the_swap_and_after_a_restart(
    tmp_path: Path, serve
) -> None:
    config = compiled_project(tmp_path)
    proc = serve(config)
    client = Client(config=config)
    client.infer("cm", batch(1))  # the example's shape: compiled in the warm phase, for
    assert serving_compiles(client) == 0  # request tensors (inference mode) as they come

    # The control: shapes no warm phase ran compile on the serving path, one request each.
    for n in (2, 3):
        client.infer("cm", batch(n))
    assert serving_compiles(client) == 2
    client.infer("cm", batch(2))  # compiled now: no second compile
    assert serving_compiles(client) == 2

    set_scale(config, 2.0)  # a code edit: a new module, its compiles start again
    outcome = client.reload("cm", force=True)["outcomes"][0]
    assert outcome["ok"], outcome
    status = model_status(client)
    assert status["version"] == 2
    for n in (2, 3):  # served before the reload: replayed in its warm phase
        out, version, _ = client.infer("cm", batch(n))
        assert version == 2 and out.shape == (n, 4)
    assert serving_compiles(client) == 2, "a shape served before the reload compiled again"
    client.infer("cm", batch(5))  # never served: the counter moves (the control)
    assert serving_compiles(client) == 3

    # The reload said what compiling cost: the example and both served shapes compiled,
    # with dynamo's reason for each recompile.
    done = [e for e in read_events(config) if e.get("kind") == "reload_done"]
    figures = done[-1]["compile"]
    assert figures["compiles"] == 3, figures
    assert figures["seconds"] > 0
    assert {"hits", "misses", "cache"} <= set(figures)
    assert any("size mismatch" in r for r in figures["reasons"]), figures["reasons"]
    assert status["compile"] == figures

    # A worker killed: the restart's warm phase replays the log (the router's, kept).
    old_pid = status["pid"]
    os.kill(old_pid, signal.SIGKILL)
    wait_until(
        lambda: (
            (s := model_status(client))["pid"] not in (None, old_pid) and s["state"] == "serving"
        ),
        60,
        what="the restarted worker serving",
    )
    assert model_status(client)["served_shapes"] == 4  # batches 1, 2, 3 and 5
    for n in (2, 3, 5):
        client.infer("cm", batch(n))
    assert serving_compiles(client) == 0, "the restarted worker compiled on a request"
    proc.close()


WEIGHTS_CONFIG = CONFIG + 'weights = ["weights.safetensors"]\n'


def eager_twin(config: Path, seed: int) -> Any:
    """The model's eager module, in this process, with weights from `seed`."""
    import torch

    module = import_file(config.parent / "model.py", f"compiled_model_{seed}")
    torch.manual_seed(seed)
    return module.Tiny().eval()


def save_weights(config: Path, state: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    path = config.parent / "weights.safetensors"
    tmp = path.with_suffix(".tmp")
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(tmp))
    os.replace(tmp, path)  # complete when it appears: the watcher reads it at once


def answer_of(twin: Any, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return twin(torch.from_numpy(x)).numpy()


def test_weights_of_a_compiled_model_load_by_eager_names_and_never_recompile(
    tmp_path: Path, serve
) -> None:
    config = make_project(tmp_path, config=WEIGHTS_CONFIG, files={"model.py": COMPILED_MODEL})
    first = eager_twin(config, 1)
    save_weights(config, first.state_dict())  # eager names: no weights_prefix written
    serve(config, "--no-tui", command="watch")
    client = Client(config=config)
    x = batch(2)
    out, _, _ = client.infer("cm", x)
    np.testing.assert_allclose(out, answer_of(first, x), rtol=1e-5, atol=1e-6)
    compiled_before = serving_compiles(client)

    second = eager_twin(config, 2)
    save_weights(config, second.state_dict())
    wait_until(lambda: count_events(config, "reload_done") >= 1, 60, what="the weights reload")
    done = [e for e in read_events(config) if e.get("kind") == "reload_done"][-1]
    assert done["version"] == 2
    assert done["compile"]["compiles"] == 0, done["compile"]  # dynamo's own count
    out, version, _ = client.infer("cm", x)
    assert version == 2
    np.testing.assert_allclose(out, answer_of(second, x), rtol=1e-5, atol=1e-6)

    # A compiled trainer's state dict: its names carry torch.compile's `_orig_mod.`.
    third = eager_twin(config, 3)
    pushed = {f"_orig_mod.{k}": v for k, v in third.state_dict().items()}
    reply = client.update_weights("cm", pushed)
    assert reply.get("version") == 3, reply
    out, version, _ = client.infer("cm", x)
    assert version == 3
    np.testing.assert_allclose(out, answer_of(third, x), rtol=1e-5, atol=1e-6)
    pushes = [e for e in read_events(config) if e.get("kind") == "reload_done"][-1]
    assert pushes["compile"] is None or pushes["compile"]["compiles"] == 0, pushes
    assert serving_compiles(client) == compiled_before, "a weights change compiled a request"


#: Before its first C++ kernel, Inductor asks g++ which of AMX, AVX-512 and AVX2 the CPU
#: runs: a dry compile of each into the model's cache, each then dlopen-probed by a process
#: of its own (again in the restarted worker): 13.5 s -> 5.7 s of a cold compile measured
#: on two cores. TORCHINDUCTOR_VEC_ISA_OK=1 is Inductor's own switch to take the CPU's
#: flags instead. What is proven stays: the model's graph compiled by g++ once, then loaded
#: from the model's cache by the next worker.
INDUCTOR_CONFIG = CONFIG + 'env = { TORCHINDUCTOR_VEC_ISA_OK = "1" }\n'


def test_a_new_worker_loads_the_compiled_code_from_the_models_cache(tmp_path: Path, serve) -> None:
    # Real Inductor (its caches are the point): one compile of a tiny graph.
    model = COMPILED_MODEL.replace('backend="eager", dynamic=False', "dynamic=False")
    config = make_project(tmp_path, config=INDUCTOR_CONFIG, files={"model.py": model})
    serve(config)
    client = Client(config=config)
    first = model_status(client)
    assert first["restarts"] == 0, f"the first worker was replaced before it was read: {first}"
    cold = first["compile"]
    assert cold["compiles"] >= 1 and cold["misses"] >= 1 and cold["hits"] == 0, cold
    cache = config.parent / ".hotreload" / "compile-cache" / "cm"
    assert any(cache.iterdir()), "the compile cache is not in the session's state folder"

    old_pid = model_status(client)["pid"]
    os.kill(old_pid, signal.SIGKILL)  # a new process: nothing compiled in its memory
    wait_until(
        lambda: (
            (s := model_status(client))["pid"] not in (None, old_pid) and s["state"] == "serving"
        ),
        120,
        what="the restarted worker serving",
    )
    warm = model_status(client)["compile"]
    assert warm["hits"] >= 1 and warm["misses"] == 0, warm
    assert warm["seconds"] < cold["seconds"], (warm, cold)


def test_check_reports_what_compiling_cost(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    config = compiled_project(tmp_path)
    args = ["check", "--config", str(config), "--json", "--reloads", "1"]
    out = subprocess.run(
        [sys.executable, "-m", "hotreload", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=config.parent,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (model,) = json.loads(out.stdout)["models"]
    steps = {s["name"]: s for s in model["steps"]}
    for name in ("load+warm", "reload 1"):
        figures = steps[name]["figures"]["compile"]
        assert figures["compiles"] >= 1 and figures["seconds"] > 0, (name, figures)
        assert {"hits", "misses"} <= set(figures)
        assert "compiled " in steps[name]["detail"], steps[name]


def test_the_replay_stops_at_its_budget_and_says_what_it_left_out() -> None:
    import torch

    from hotreload.worker import loader

    calls: list[tuple[int, ...]] = []

    def model(x: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(x.shape))
        return x * 2

    mv = loader.ModelVersion(
        1, model, "single", {"x": torch.arange(8.0).reshape(1, 8)}, torch.device("cpu"), None
    )
    shapes = [[{"name": "x", "dtype": "float32", "shape": [n, 8]}] for n in (2, 3)]
    # The version it replaces compiled (an edit that now hits dynamo's caches): replayed.
    loader.warm(mv, 1, shapes=shapes, compiled_before=True)
    assert calls == [(1, 8), (2, 8), (3, 8)] and mv.replayed == 2 and not mv.replay_failed
    calls.clear()
    loader.warm(mv, 1, shapes=shapes, budget_s=0.0, compiled_before=True)
    assert calls == [(1, 8)] and mv.replayed == 0
    assert len(mv.replay_failed) == 1
    said = mv.replay_failed[0]
    assert said.startswith("2 served shape(s) left out: ") and "budget of 0.00 s" in said
    assert said.endswith("(raise deadlines.warm_s to warm them all)")
    assert mv.compile is None or mv.compile.compiles == 0  # an eager model compiles nothing


def sleepy_version(first_s: float, per_shape_s: float) -> Any:
    """A model whose first pass takes `first_s` (the example's compile) and each pass at a
    new batch size `per_shape_s` (a compile at that shape)."""
    import time

    import torch

    from hotreload.worker import loader

    seen: set[int] = set()

    def model(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] not in seen:
            seen.add(x.shape[0])
            time.sleep(first_s if x.shape[0] == 1 else per_shape_s)
        return x * 2

    return loader.ModelVersion(
        1, model, "single", {"x": torch.ones(1, 8)}, torch.device("cpu"), None
    )


def test_a_shape_starts_only_if_the_slowest_pass_so_far_still_fits_the_budget() -> None:
    from hotreload.engine.served_shapes import REPLAY_SHARE
    from hotreload.worker import loader

    shapes = [[{"name": "x", "dtype": "float32", "shape": [n, 8]}] for n in (2, 3, 4)]
    warm_s = 1.0  # deadlines.warm_s: the replay may take the phase to 0.8 s
    mv = sleepy_version(0.0, 0.35)
    loader.warm(mv, 1, shapes=shapes, budget_s=warm_s * REPLAY_SHARE, compiled_before=True)
    # 2 shapes: 0.7 s; a third (0.35 s like the others) would end past 0.8 s: left out.
    assert mv.replayed <= 2 and len(mv.replay_failed) == 1, mv.replay_failed
    assert "budget of 0.80 s" in mv.replay_failed[0] and "ran past 1 s" not in mv.replay_failed[0]
    # The example's first pass (its compile) is the estimate for the first served shape.
    mv = sleepy_version(0.5, 0.5)
    loader.warm(mv, 1, shapes=shapes, budget_s=warm_s * REPLAY_SHARE, compiled_before=True)
    assert mv.replayed == 0 and mv.replay_failed[0].startswith("3 served shape(s) left out")


def test_an_eager_model_on_a_cpu_replays_nothing_and_a_compiled_one_does() -> None:
    import torch

    from hotreload.worker import loader

    shapes = [[{"name": "x", "dtype": "float32", "shape": [n, 8]}] for n in (2, 3)]
    calls: list[tuple[int, ...]] = []

    def eager(x: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(x.shape))
        return x * 2

    mv = loader.ModelVersion(1, eager, "single", {"x": torch.ones(1, 8)}, torch.device("cpu"), None)
    loader.warm(mv, 1, shapes=shapes, budget_s=10.0)
    assert calls == [(1, 8)] and mv.replayed == 0 and not mv.replay_failed

    torch.manual_seed(0)
    module = torch.compile(torch.nn.Linear(8, 4), backend="eager", dynamic=False)
    mv = loader.ModelVersion(
        1, module, "single", {"x": torch.ones(1, 8)}, torch.device("cpu"), None
    )
    loader.warm(mv, 1, shapes=shapes, budget_s=60.0)
    assert mv.replayed == 2 and not mv.replay_failed
    assert mv.compile is not None and mv.compile.compiles >= 3  # the example's, then each shape's

    # A compiled function inside an eager module: dynamo compiled in the example's passes.
    compiled_fn = torch.compile(lambda x: x * 3, backend="eager", dynamic=False)
    mv = loader.ModelVersion(
        1, compiled_fn, "single", {"x": torch.ones(1, 5)}, torch.device("cpu"), None
    )
    loader.warm(mv, 1, shapes=[[{"name": "x", "dtype": "float32", "shape": [7, 5]}]])
    assert mv.replayed == 1


def test_compiles_are_tallied_per_thread_and_cuda_graph_recordings_apart() -> None:
    import threading

    import torch._dynamo
    from torch._dynamo.callback import CallbackTrigger

    from hotreload.worker import compile_watch

    assert compile_watch.hook()
    handler = torch._dynamo.callback_handler
    got: dict[str, compile_watch.CompileFigures] = {}
    a_inside, b_done = threading.Event(), threading.Event()

    def a() -> None:  # a compile on the loader thread...
        watch = compile_watch.Watch()
        with handler.install_callbacks(CallbackTrigger.DYNAMO, "0/0"):
            a_inside.set()
            assert b_done.wait(30)
        got["a"] = watch.done()

    def b() -> None:  # ...overlapped by one and a CUDA graph recording on the serving thread
        assert a_inside.wait(30)
        watch = compile_watch.Watch()
        with handler.install_callbacks(CallbackTrigger.DYNAMO, "1/0"):
            pass
        with handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "1/0"):
            pass
        with handler.install_callbacks(CallbackTrigger.LAZY_BACKWARD, "1/0"):
            pass
        got["b"] = watch.done()
        b_done.set()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert (got["a"].compiles, got["a"].recordings) == (1, 0)
    assert (got["b"].compiles, got["b"].recordings) == (1, 1)
    assert compile_watch.figures_wire(got["b"])["recordings"] == 1
    torch._dynamo.reset()  # clears dynamo's callbacks: the tally stays
    watch = compile_watch.Watch()
    with handler.install_callbacks(CallbackTrigger.DYNAMO, "2/0"):
        pass
    assert watch.done().compiles == 1


def test_compile_text_says_cuda_graph_recordings_apart() -> None:
    from hotreload.engine.compile_figures import compile_text

    text = compile_text({"compiles": 1, "seconds": 2.0, "recordings": 3})
    assert text.startswith("compiled 2.00 s (1 compile;") and "3 CUDA graph recording(s)" in text


def test_the_compile_cache_drops_its_oldest_files_past_its_size(tmp_path: Path) -> None:
    from hotreload.worker import compile_watch

    cache = tmp_path / "compile-cache" / "cm"
    for i, name in enumerate(("old/a.so", "old/b.py", "mid/c.so", "new/d.so")):
        path = cache / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 100)
        os.utime(path, (1000 + i, 1000 + i))
    assert compile_watch.trim_cache(cache, 250) == 200
    assert sorted(p.name for p in cache.rglob("*") if p.is_file()) == ["c.so", "d.so"]
    assert not (cache / "old").exists()  # left empty: gone
    assert compile_watch.trim_cache(cache, 250) == 0
    # At a worker's start, before its first compile.
    env: dict[str, str] = {}
    assert compile_watch.use_cache_dir({"compile_cache": str(cache)}, env) == str(cache)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(cache)
    # Inherited (torch's shared default, written into os.environ by any earlier compile in
    # the parent process): the model's folder still wins.
    env = {"TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_someone"}
    assert compile_watch.use_cache_dir({"compile_cache": str(cache)}, env) == str(cache)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(cache)
    # Set in the model's own `env`: the user's choice wins.
    mine = {"compile_cache": str(cache), "env": {"TORCHINDUCTOR_CACHE_DIR": "/data/ind"}}
    assert compile_watch.use_cache_dir(mine, {}) == "/data/ind"


def test_a_user_strip_prefix_also_strips_the_compiled_wrappers_names() -> None:
    import torch

    from hotreload.worker import compiled_names
    from hotreload.worker.weights import apply_prefix

    module = torch.compile(torch.nn.Linear(8, 4), backend="eager")
    prefix = compiled_names.prefix_for(module, {"strip": "module."})
    keys = ["_orig_mod.module.weight", "module.bias", "_orig_mod.bias"]
    assert apply_prefix(keys, prefix) == dict(zip(keys, ["weight", "bias", "bias"], strict=True))
    eager = compiled_names.prefix_for(torch.nn.Linear(8, 4), {"strip": "module."})
    assert apply_prefix(["_orig_mod.weight"], eager) == {"_orig_mod.weight": "_orig_mod.weight"}


def test_save_of_a_compiled_model_writes_names_the_eager_module_loads(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from hotreload.worker.save_weights import WEIGHTS_FILE, save_version

    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    compiled = torch.compile(eager, backend="eager")
    reply = save_version(compiled, 3, tmp_path, name="cm", digest=None)
    state = load_file(str(tmp_path / WEIGHTS_FILE))
    assert not any("_orig_mod" in k for k in state) and reply.tensors == len(state) == 4
    fresh = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    fresh.load_state_dict(state, strict=True)
    x = torch.ones(1, 8)
    assert torch.equal(fresh(x), eager(x))


def test_replayed_inputs_repeat_the_example_values_as_inference_tensors() -> None:
    import torch

    from hotreload.worker.inputs import replay_inputs

    ids = torch.tensor([[5, 7, 9]])
    with torch.inference_mode():
        got = replay_inputs(
            {"ids": ids}, [{"name": "ids", "dtype": "int64", "shape": [2, 4]}], torch.device("cpu")
        )
    assert got["ids"].tolist() == [[5, 7, 9, 5], [7, 9, 5, 7]]  # token ids stay in the vocabulary
    assert got["ids"].is_inference()

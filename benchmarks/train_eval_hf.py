"""The real Hugging Face `Trainer` path of benchmarks/train_eval.py (issue 26): a tiny Llama
(built from a config, random weights) trained on random tokens, with an eval thread.

Runs, one after another, on a `hotreload serve` of the same model (`threads = 1`,
`cpus = "auto"`) per strategy:
1. no pushes, the eval called in the trainer's process (a copy of the model, loaded with
   the trainer's weights every `--push-every` steps);
2. `HotreloadPush(every_n_steps=--push-every)` (pushes not waited for), the eval through
   hotreload with `min_version` of the latest served push;
3. no pushes, the eval through hotreload (the trainer's speed without pushes, same load).
2 and 3 run for `strategy = "inplace"` (a push builds in the serving worker, under its
interpreter lock) and `strategy = "respawn"` (a push builds in the standby process and is
handed over to: issue 26 item 2), each on a server of its own. Prints steps/s of each, the
eval's p50/p99 in-process and through hotreload, and the p99 of calls overlapping a push
(sent .. served) against calls between pushes.

    .venv/bin/python benchmarks/train_eval_hf.py [--steps 200] [--push-every 20]
        [--strategy inplace respawn]

Not a test: figures depend on the machine and its load; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from common import Server, percentile

from hotreload import Client
from hotreload.training import HotreloadPush, keep_off_serving_cpus

PY = sys.executable
LLAMA = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False,
)  # fmt: skip
MODEL = f"""
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{LLAMA!r}))


def example_input():
    return {{"input_ids": torch.arange(16).reshape(1, 16)}}
"""
CONFIG = """
[[models]]
name = "llm"
entry = "llama.py:build"
example = "llama.py:example_input"
device = "cpu"
threads = 1
warmup_iters = 2
strategy = "{strategy}"
"""
X = np.arange(16, dtype=np.int64).reshape(1, 16)


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.rows = torch.randint(0, 256, (n, 32), generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


class Evals:
    """An eval thread: calls `fn()` back to back, keeping (start, seconds) of each."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.calls, self._stop = fn, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            self.fn()
            self.calls.append((t0, time.perf_counter() - t0))
            time.sleep(0.02)  # an eval loop, not a load generator

    def __enter__(self) -> Evals:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join(60)


class Windows(transformers.TrainerCallback):  # type: ignore[misc]
    """Each push's window (sent .. served), from the HotreloadPush handles."""

    def __init__(self, push: HotreloadPush) -> None:
        self.push, self.open, self.windows = push, {}, []

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        now = time.perf_counter()
        for _, h in self.push._handles:
            self.open.setdefault(id(h), (now, h))
        for key, (t0, h) in list(self.open.items()):
            if h.done():
                self.windows.append((t0, now))
                del self.open[key]


def train(steps: int, callbacks: list[Any], out: Path) -> tuple[Any, float]:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=steps, per_device_train_batch_size=8,
        learning_rate=1e-3, logging_steps=10_000, report_to="none", save_strategy="no",
        use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=Tokens(512), callbacks=callbacks
    )
    t0 = time.perf_counter()
    trainer.train()
    return model, steps / (time.perf_counter() - t0)


def p(calls: list[tuple[float, float]], q: float) -> float:
    return percentile([d * 1000 for _, d in calls], q)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--push-every", type=int, default=20)
    ap.add_argument("--no-move", action="store_true", help="leave the trainer's CPUs alone")
    ap.add_argument(
        "--strategy", nargs="+", choices=("inplace", "respawn"), default=["inplace", "respawn"]
    )
    run(ap.parse_args())


def run(a: argparse.Namespace) -> None:
    """Part 3 of train_eval.py: `a.steps`, `a.push_every`, `a.no_move`, `a.strategy`."""
    strategies = getattr(a, "strategy", None) or ["inplace", "respawn"]
    here = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval()

    def eval_here() -> None:
        with torch.inference_mode():
            here(input_ids=torch.from_numpy(X))

    class Reload(transformers.TrainerCallback):  # type: ignore[misc]
        def on_step_end(
            self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any
        ) -> None:
            if state.global_step % a.push_every == 0:
                here.load_state_dict(copy.deepcopy(model.state_dict()))

    local: Evals | None = None
    sps_local = 0.0
    everywhere = os.sched_getaffinity(0)
    for strategy in strategies:
        # The last run moved this process (keep_off_serving_cpus); a server started from it
        # would inherit that and find no CPU to pin its worker to.
        os.sched_setaffinity(0, everywhere)
        folder = Path(tempfile.mkdtemp(prefix="hr-train-hf-"))
        (folder / "llama.py").write_text(MODEL)
        (folder / "hotreload.toml").write_text(CONFIG.format(strategy=strategy))
        config = folder / "hotreload.toml"
        cmd = [PY, "-m", "hotreload", "serve", "--config", str(config)]
        server = Server(cmd, "serving ", folder)
        try:
            client = Client(config=config, timeout_s=120)
            # The recipe (docs/training-push.md): every run here, in-process eval too, on
            # the CPUs the serving worker does not hold. Without it the trainer's OpenMP
            # threads spin on the serving CPU: measured 0.40 steps/s against 7.7 (2 busy
            # cores).
            move = keep_off_serving_cpus(client) if not a.no_move else "not moved (--no-move)"
            if local is None:
                with Evals(eval_here) as local:
                    _, sps_local = train(a.steps, [Reload()], folder / "o1")
            _served_runs(a, client, strategy, move, local, sps_local)
        finally:
            server.stop()


def _served_runs(
    a: argparse.Namespace, client: Client, strategy: str, move: Any, local: Evals, sps_local: float
) -> None:
    latest = {"v": 0}

    def eval_served() -> None:
        r = client.infer("llm", {"input_ids": X}, min_version=latest["v"] or None)
        assert r.version >= latest["v"]

    push = HotreloadPush(model="llm", every_n_steps=a.push_every, client=client)
    windows = Windows(push)

    class Latest(transformers.TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *args: Any, **kw: Any) -> None:
            if push.served:
                latest["v"] = push.served[-1][1]

    out = Path(tempfile.mkdtemp(prefix="hr-train-hf-out-"))
    with Evals(eval_served) as served:
        _, sps_push = train(a.steps, [push, windows, Latest()], out / "o2")
    with Evals(eval_served) as quiet:
        _, sps_none = train(a.steps, [], out / "o3")
    spans = windows.windows
    over = [c for c in served.calls if any(s <= c[0] + c[1] and c[0] <= e for s, e in spans)]
    between = [c for c in served.calls if c not in over]
    print(
        f"Trainer (tiny Llama, {a.steps} steps, push every {a.push_every}), strategy "
        f"{strategy}: {move}"
    )
    print(
        f"  steps/s  no pushes {sps_none:.2f}  pushes {sps_push:.2f}  "
        f"ratio {sps_push / sps_none:.3f} (target >= 0.95)  in-process eval {sps_local:.2f}"
    )
    for name, calls in (
        ("in-process", local.calls),
        ("hotreload, pushes", served.calls),
        ("hotreload, none", quiet.calls),
    ):
        print(
            f"  eval {name:18} n={len(calls):5} p50 {p(calls, 50):7.2f} ms  "
            f"p99 {p(calls, 99):7.2f} ms  p99/p50 {p(calls, 99) / p(calls, 50):.2f}"
        )
    print(
        f"  overlapping a push n={len(over)} p99 {p(over, 99):.2f} ms; between pushes "
        f"n={len(between)} p99 {p(between, 99):.2f} ms; ratio "
        f"{p(over, 99) / p(between, 99):.2f} (target <= 1.3)"
    )
    held = push.handover_s
    print(
        f"  pushes served {len(push.served)}, failed {len(push.errors)}; the trainer held "
        f"per push (pack + send): mean {1000 * np.mean(held):.2f} ms, max "
        f"{1000 * max(held):.2f} ms = {100 * sum(held) * sps_push / a.steps:.2f}% of "
        "its run"
    )


if __name__ == "__main__":
    main()

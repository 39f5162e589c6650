"""An adapter save against a full reload of the same model, side by side in one session.

A GPT-2 shaped base of ~127 MiB (float32, random weights, `save_pretrained`) with two LoRA
adapters of its attention (peft's `save_pretrained`), served by `hotreload watch`. Measured
from the save (a rename over the old file) to the first answer of the new version
(`Client.infer(min_version=...)`, which waits for it):

- adapter save: adapter b's file saved again. Target: within 0.1 s + warm-up, whatever the
  base weighs (no base read, no re-import: the base's tensors are shared);
- full reload: the base's weights file saved with one tensor changed (every weight read);
- adapter push: adapter b's tensors pushed alone (`Client.update_weights(strict=False)`).

Also the cost of a per-request switch between adapters against a request that stays on one.

    .venv/bin/python benchmarks/adapter_reload.py [--rounds 5] [--layers 8] [--width 576]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import REPO, Server, read_events

PY = sys.executable
MIB = 2**20
IDS = np.arange(16, dtype=np.int64).reshape(1, 16)

MODEL = """
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

BASE = Path(__file__).resolve().parent / "base"


def build():
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(BASE))


def example():
    return {"input_ids": torch.arange(16).reshape(1, 16)}
"""

CONFIG = """
[[models]]
name = "lm"
entry = "model.py:build"
example = "model.py:example"
weights = ["base/model.safetensors"]
adapters = { a = "adapters/a", b = "adapters/b" }
device = "cpu"
warmup_iters = 1
request_timeout_s = 120.0
shapes = { input_ids = [-1, -1] }

[models.deadlines]
load_s = 300.0

[watch]
quiet_ms = 20
max_wait_ms = 200
"""


def write_project(root: Path, layers: int, width: int) -> Path:
    import peft
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=512, n_positions=64, n_embd=width, n_layer=layers, n_head=8)
    base = GPT2LMHeadModel(config).eval()
    base.save_pretrained(root / "base")
    for i, name in enumerate(("a", "b")):
        save_adapter(root, name, i + 1)
    (root / "model.py").write_text(MODEL)
    (root / "hotreload.toml").write_text(CONFIG)
    del peft
    return root / "hotreload.toml"


def save_adapter(root: Path, name: str, seed: int) -> None:
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(root / "base")
    cfg = peft.LoraConfig(
        r=8, target_modules=["c_attn"], fan_in_fan_out=True, init_lora_weights=False
    )
    tmp = root / "adapters" / f".{name}.tmp"
    peft.get_peft_model(base, cfg).save_pretrained(tmp)
    folder = root / "adapters" / name
    folder.mkdir(parents=True, exist_ok=True)
    for f in tmp.iterdir():
        f.replace(folder / f.name)
    tmp.rmdir()


def rewrite_adapter(root: Path, step: int) -> None:
    """Adapter b's file saved again with new values (what a trainer's save does)."""
    from safetensors.torch import load_file, save_file

    path = root / "adapters" / "b" / "adapter_model.safetensors"
    state = {k: v * (1.0 + 0.01 * step) for k, v in load_file(str(path)).items()}
    tmp = path.with_suffix(".tmp")
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(path)


def rewrite_base(root: Path, step: int) -> None:
    from safetensors.torch import load_file, save_file

    path = root / "base" / "model.safetensors"
    state = load_file(str(path))
    key = next(k for k in state if k.endswith("ln_f.weight"))
    state[key] = state[key] + 0.001 * step
    tmp = path.with_suffix(".tmp")
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(path)


def first_answer(client: Any, version: int, adapter: str = "b") -> float:
    client.infer("lm", {"input_ids": IDS}, parameters={"adapter": adapter}, min_version=version)
    return time.perf_counter()


def last_reload(project: Path, version: int, timeout_s: float = 30.0) -> dict[str, float]:
    """The phases of the reload that made `version` (from the session's events). Its
    `reload_done` may come a moment after its first answer (a full reload's digest is
    settled after the swap), so wait for it."""
    deadline = time.monotonic() + timeout_s
    while True:
        for e in read_events(project):
            if e.get("kind") == "reload_done" and e.get("version") == version:
                return dict(e.get("phases") or {})
        if time.monotonic() > deadline:
            return {}
        time.sleep(0.02)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=576)
    ap.add_argument(
        "--settle", type=float, default=1.0,
        help="seconds idle before each change: the last one's background work (the old "
        "version's memory given back, its digest) is not timed as the next one's",
    )  # fmt: skip
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from hotreload import Client

    with tempfile.TemporaryDirectory(prefix="hr-adapters-") as tmp:
        root = Path(tmp)
        cfg = write_project(root, args.layers, args.width)
        base_mib = (root / "base" / "model.safetensors").stat().st_size / MIB
        adapter_mib = (root / "adapters" / "b" / "adapter_model.safetensors").stat().st_size / MIB
        server = Server([PY, "-m", "hotreload", "watch", "--no-tui", "--config", str(cfg)],
                        "serving ", root, timeout_s=300)  # fmt: skip
        try:
            client = Client(config=cfg, timeout_s=300)
            version = client.status()["models"][0]["version"]
            rows: dict[str, list[float]] = {"adapter save": [], "full reload": [], "push": []}
            warm: dict[str, list[float]] = {k: [] for k in rows}
            phases: dict[str, dict[str, float]] = {}
            for step in range(1, args.rounds + 1):
                for label, change in (
                    ("adapter save", rewrite_adapter),
                    ("full reload", rewrite_base),
                ):
                    time.sleep(args.settle)
                    t0 = time.perf_counter()
                    change(root, step)
                    version += 1
                    rows[label].append(first_answer(client, version) - t0)
                    phases[label] = last_reload(root, version)
                    warm[label].append(phases[label].get("warm", 0.0))
                from safetensors.torch import load_file

                path = root / "adapters" / "b" / "adapter_model.safetensors"
                state = {k: v * 0.9 for k, v in load_file(str(path)).items()}
                time.sleep(args.settle)
                t0 = time.perf_counter()
                client.update_weights("lm", state, strict=False)
                version += 1
                rows["push"].append(first_answer(client, version) - t0)
                phases["push"] = last_reload(root, version)
                warm["push"].append(phases["push"].get("warm", 0.0))
            switch = per_request_switch(client)
            status = client.status()["models"][0]
            client.close()
        finally:
            server.stop()
    print(f"base {base_mib:.1f} MiB, adapter {adapter_mib:.2f} MiB, {args.rounds} round(s)")
    print(f"{'change':<14} {'save->answer s':>15} {'warm s':>8} {'minus warm':>11} {'vs full':>8}")
    full = statistics.median(rows["full reload"])
    for label, values in rows.items():
        med, w = statistics.median(values), statistics.median(warm[label])
        print(f"{label:<14} {med:>15.3f} {w:>8.3f} {med - w:>11.3f} {med / full:>8.2f}")
    target = statistics.median(rows["adapter save"]) - statistics.median(warm["adapter save"])
    print(f"target adapter save minus warm-up <= 0.100 s: {target:.3f} s "
          f"({'met' if target <= 0.1 else 'MISSED'})")  # fmt: skip
    print(
        f"per-request switch a<->b: {switch[0]:.3f} ms a request, staying on b: {switch[1]:.3f} ms"
    )
    for label, ph in phases.items():
        print(f"{label} phases (last round, s):", {k: round(v, 3) for k, v in ph.items()})
    print("adapters:", {n: a["source"] for n, a in status["adapters"]["adapters"].items()})


def per_request_switch(client: Any, n: int = 40) -> tuple[float, float]:
    """Median request time alternating adapters, and staying on one (ms)."""

    def timed(names: list[str]) -> float:
        out = []
        for name in names:
            t0 = time.perf_counter()
            client.infer("lm", {"input_ids": IDS}, parameters={"adapter": name})
            out.append((time.perf_counter() - t0) * 1000)
        return statistics.median(out)

    timed(["a", "b"] * 4)
    return timed(["a", "b"] * (n // 2)), timed(["b"] * n)


if __name__ == "__main__":
    main()

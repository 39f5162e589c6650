"""A rollback against a code-edit reload of the same model (docs/rollback.md).

A model of `--mib` MiB of float32 weights (a stack of square Linear layers, one
safetensors file) served by `hotreload serve`. Each round: a code edit (the output scale)
and `hotreload reload`, then `Client.rollback` to the version before. Each is timed by its
own outcome (`total_s`: lock to history row) and the load phase alone. Target: a rollback
costs no more than the code edit's reload, whatever the weights weigh: the serving worker
shares its tensors (the weights files and pushes are those it holds), nothing is read again.

    .venv/bin/python benchmarks/rollback.py [--mib 1024] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from common import Server

from hotreload import Client

PY = sys.executable
MIB = 2**20
WIDTH = 2048  # 16 MiB per float32 layer

MODEL = """
import torch
from torch import nn

LAYERS = {layers}
SCALE = 1.0


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear({width}, {width}) for _ in range(LAYERS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers[-1](x) * SCALE  # one layer: the figure is the reload, not the math


def build() -> nn.Module:
    return Stack()


def example() -> torch.Tensor:
    return torch.zeros(1, {width})
"""

CONFIG = """
[[models]]
name = "big"
entry = "model.py:build"
example = "model.py:example"
weights = ["weights.safetensors"]
device = "cpu"
warmup_iters = 1
threads = 1
policy = "availability"
[models.deadlines]
load_s = 600
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024, help="weights size in MiB")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import torch
    from safetensors.torch import save_file

    layers = max(1, args.mib * MIB // (WIDTH * WIDTH * 4))
    with tempfile.TemporaryDirectory() as tmp:
        proj = Path(tmp)
        (proj / "model.py").write_text(MODEL.format(layers=layers, width=WIDTH))
        (proj / "hotreload.toml").write_text(CONFIG)
        state = {
            f"layers.{i}.{k}": torch.zeros(WIDTH, WIDTH) if k == "weight" else torch.zeros(WIDTH)
            for i in range(layers)
            for k in ("weight", "bias")
        }
        save_file(state, str(proj / "weights.safetensors"))
        size = (proj / "weights.safetensors").stat().st_size / MIB
        del state
        cfg = proj / "hotreload.toml"
        server = Server([PY, "-m", "hotreload", "serve", "--config", str(cfg)], "ready", proj)
        edits, backs, edit_loads, back_loads = [], [], [], []
        try:
            client = Client(config=cfg, timeout_s=600)
            for r in range(args.rounds):
                text = (proj / "model.py").read_text()
                (proj / "model.py").write_text(text.replace("SCALE = ", f"SCALE = {r + 2}.0 #", 1))
                edit = client.reload("big")["outcomes"][0]
                back = client.rollback("big")["outcomes"][0]
                assert edit["ok"] and back["ok"], (edit, back)
                edits.append(edit["total_s"])
                backs.append(back["total_s"])
                edit_loads.append(edit["phases"]["load"])
                back_loads.append(back["phases"]["load"])
        finally:
            server.stop()
    med = statistics.median
    print(f"weights {size:.0f} MiB ({layers} layers), {args.rounds} rounds, medians:")
    print(f"  code edit reload  total {med(edits):.3f} s   load {med(edit_loads):.3f} s")
    print(f"  rollback          total {med(backs):.3f} s   load {med(back_loads):.3f} s")


if __name__ == "__main__":
    main()

"""Memory across hundreds of reloads: worker RSS after reload 1, 10 and 100 of a model with
12.9 MB of float32 weights (64 -> 1024 x3 -> 16), for `inplace` and `respawn`, and the idle
standby's RSS against a bare `import torch` process, side by side in one run.

    .venv/bin/python benchmarks/soak.py [--reloads 100]

Targets (issue 19): RSS after 100 reloads within 2% of after the first; an idle standby
at most 1.1x a bare `import torch` process.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from common import Server

MODEL = """
import torch
from torch import nn

class Big(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(64, 1024)
        self.blocks = nn.ModuleList(nn.Linear(1024, 1024) for _ in range(3))
        self.out = nn.Linear(1024, 16)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = torch.relu(b(h))
        return self.out(h)

def build():
    return Big()

def example():
    return torch.ones(1, 64)
"""

CONFIG = """
[[models]]
name = "big"
entry = "model.py:build"
example = "model.py:example"
weights = ["weights.safetensors"]
threads = 1
warmup_iters = 1
strategy = "{strategy}"
"""


def mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def soak(folder: Path, strategy: str, reloads: int) -> dict[str, float]:
    (folder / "hotreload.toml").write_text(CONFIG.format(strategy=strategy))
    config = str(folder / "hotreload.toml")
    serve = [sys.executable, "-m", "hotreload", "serve", "--config", config]
    server = Server(serve, "serving ", folder)
    from hotreload import Client

    client = Client(config=config, timeout_s=60)
    out: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        for i in range(1, reloads + 1):
            outcome = client.reload("big", force=True)["outcomes"][0]
            assert outcome["ok"], outcome
            if i in (1, 10, reloads):
                time.sleep(0.5)  # the retired worker's trim runs after the reply
                status = client.status()["models"][0]
                out[f"rss_{i}"] = mib(status["pid"])
                standby = status.get("standby")
                if isinstance(standby, dict) and standby.get("pid"):
                    out["standby"] = mib(standby["pid"])
        out["s_per_reload"] = (time.perf_counter() - t0) / reloads
    finally:
        server.stop()
    return out


def bare_torch() -> float:
    proc = subprocess.Popen([sys.executable, "-c", "import torch, time; time.sleep(6)"])
    try:
        time.sleep(4)
        return mib(proc.pid)
    finally:
        proc.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reloads", type=int, default=100)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hr-soak-"))
    try:
        (tmp / "model.py").write_text(MODEL)
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import torch, model; from safetensors.torch import save_file; "
                "torch.manual_seed(0); "
                "save_file(model.build().state_dict(), 'weights.safetensors')",
            ],
            cwd=tmp,
            check=True,
        )
        rows = {s: soak(tmp, s, args.reloads) for s in ("inplace", "respawn")}
        bare = bare_torch()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = args.reloads
    print(f"worker RSS (MiB) over {n} reloads of a 12.9 MB model")
    print(
        f"{'strategy':<9} {'after 1':>9} {'after 10':>9} {f'after {n}':>10} {'growth':>8} "
        f"{'s/reload':>9}"
    )
    for strategy, r in rows.items():
        growth = r[f"rss_{n}"] / r["rss_1"] - 1
        print(
            f"{strategy:<9} {r['rss_1']:>9.1f} {r['rss_10']:>9.1f} {r[f'rss_{n}']:>10.1f} "
            f"{growth * 100:>+7.1f}% {r['s_per_reload']:>9.3f}   (target within 2%)"
        )
    standby = rows["respawn"].get("standby")
    if standby:
        print(
            f"idle standby {standby:.1f} MiB, bare `import torch` {bare:.1f} MiB: "
            f"{standby / bare:.2f}x (target <= 1.1x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

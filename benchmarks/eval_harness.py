"""lm-evaluation-harness through hotreload vs lm-eval's in-process `hf` model, same weights,
same tasks, side by side in one run: wall time, tokens per second and the ratio.

    .venv/bin/python benchmarks/eval_harness.py [--sizes tiny gpt2] [--repeat 2]

The tasks are tests/evalharness/tasks (a loglikelihood multiple-choice task and a greedy
generate_until task); the models are GPT-2 configs with seeded random weights and a BPE
tokenizer written by tests/evalharness/make_lm.py (`tiny`: 2 layers of 64, the size of
examples/tiny_lm; `gpt2`: GPT-2 small's 124M shape). The served model runs with `threads =
1` and lm-eval's process with one torch thread too, so neither has more CPU than the other.
Both runs go through lm-eval's own code (`simple_evaluate`); `hf`'s wall time includes its
model load (under a second for these). Needs `pip install -e '.[eval]'`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from common import REPO, Server

sys.path.insert(0, str(REPO))
from tests.evalharness.make_lm import served_project


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def token_counts(url: str) -> int:
    """Prompt + new tokens the session has processed (its /metrics counters)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("hotreload_prompt_tokens_total", "hotreload_completion_tokens_total")):
            total += float(line.split()[-1])
    return int(total)


def lm_eval(runs: list[dict[str, Any]], tmp: Path) -> list[dict[str, Any]]:
    spec, out = tmp / "runs.json", tmp / "out.json"
    spec.write_text(json.dumps(runs))
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HOME=str(tmp / "hf_home"),
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
        OPENAI_API_KEY="unused",
    )
    subprocess.run(
        [sys.executable, "-m", "tests.evalharness.run_lmeval", str(spec), str(out)],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        timeout=1800,
    )
    return json.loads(out.read_text())


def bench(size: str, repeat: int, tmp: Path) -> dict[str, Any]:
    config = served_project(tmp / size, size)
    port = free_port()
    server = Server(
        [
            sys.executable,
            "-m",
            "hotreload",
            "serve",
            "--config",
            str(config),
            "--http",
            f"127.0.0.1:{port}",
        ],
        "serving ",
        cwd=config.parent,
        timeout_s=300,
    )
    url = f"http://127.0.0.1:{port}"
    folder = config.parent / "lm"
    try:
        hf = {
            "label": "hf",
            "model": "hf",
            "model_args": {"pretrained": str(folder), "dtype": "float32", "device": "cpu"},
        }
        served = {
            "label": "served",
            "model": "local-completions",
            "model_args": {
                "model": "lm",
                "base_url": f"{url}/v1/completions",
                "tokenizer_backend": "huggingface",
                "tokenizer": str(folder),
            },
        }
        before = token_counts(url)
        # Alternate the two, `repeat` times each, in one lm-eval process: best of each.
        results = lm_eval([r for _ in range(repeat) for r in (hf, served)], tmp)
        tokens = (token_counts(url) - before) // repeat
    finally:
        server.stop()
    walls = {"hf": [], "served": []}
    for r in results:
        walls[r["label"]].append(r["wall_s"])
    same = all(r["metrics"] == results[0]["metrics"] for r in results)
    hf_s, served_s = min(walls["hf"]), min(walls["served"])
    return {"size": size, "hf_s": hf_s, "served_s": served_s, "tokens": tokens, "same": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "gpt2"])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="hr-bench-eval-") as tmp:
        for size in args.sizes:
            rows.append(bench(size, args.repeat, Path(tmp)))
    print(f"lm-eval hr_tiny_mc + hr_tiny_gen, best of {args.repeat}, 1 torch thread each")
    print(
        f"{'model':<6} {'tokens':>7} {'hf s':>8} {'hotreload s':>12} {'hf tok/s':>9} "
        f"{'hotreload tok/s':>16} {'ratio':>6}  same metrics"
    )
    for r in rows:
        print(
            f"{r['size']:<6} {r['tokens']:>7} {r['hf_s']:>8.2f} {r['served_s']:>12.2f} "
            f"{r['tokens'] / r['hf_s']:>9.0f} {r['tokens'] / r['served_s']:>16.0f} "
            f"{r['served_s'] / r['hf_s']:>5.2f}x  {r['same']}"
        )


if __name__ == "__main__":
    main()

"""The tiny LM example, served vs called in-process, side by side in one run: prompts in,
text out. Then edit -> first new answer: the sampling code is edited on disk and the clock
stops at the first reply that comes from the new code.

    .venv/bin/python benchmarks/tiny_lm.py [--requests 200] [--tokens 8] [--edits 5]

Needs transformers (`pip install -e '.[examples]'`).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, Server, percentile

PROMPTS = ["Once upon a time", "The quick brown fox jumps over", "hotreload"]


def in_process(proj: Path, requests: int, tokens: int) -> list[float]:
    import torch

    torch.set_num_threads(1)  # as the served model's `threads = 1`
    spec = importlib.util.spec_from_file_location("bench_tiny_lm", proj / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.build()
    lat = []
    with torch.inference_mode():
        for _ in range(3):
            model(PROMPTS, max_new_tokens=tokens)
        for _ in range(requests):
            t0 = time.perf_counter()
            model(PROMPTS, max_new_tokens=tokens)
            lat.append((time.perf_counter() - t0) * 1000)
    return lat


def served(client, requests: int, tokens: int) -> list[float]:  # type: ignore[no-untyped-def]
    lat = []
    for _ in range(3):
        client.infer("gen", PROMPTS, parameters={"max_new_tokens": tokens})
    for _ in range(requests):
        t0 = time.perf_counter()
        client.infer("gen", PROMPTS, parameters={"max_new_tokens": tokens})
        lat.append((time.perf_counter() - t0) * 1000)
    return lat


def edit_to_answer(client, code: Path, edits: int, tokens: int) -> list[float]:  # type: ignore[no-untyped-def]
    """Each edit flips TOP_K between 1 and 2 (different text); seconds until it shows."""
    out = []
    for i in range(edits):
        before = client.infer("gen", PROMPTS, parameters={"max_new_tokens": tokens}).output
        want = 2 if i % 2 == 0 else 1
        text = code.read_text()
        code.write_text(text.replace(f"TOP_K = {3 - want}\n", f"TOP_K = {want}\n"))
        t0 = time.perf_counter()
        deadline = t0 + 60
        while time.perf_counter() < deadline:
            r = client.infer("gen", PROMPTS, parameters={"max_new_tokens": tokens})
            if r.output != before:
                out.append(time.perf_counter() - t0)
                break
        time.sleep(0.5)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=8, help="max_new_tokens per prompt")
    parser.add_argument("--edits", type=int, default=5)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hr-bench-lm-"))
    proj = tmp / "tiny_lm"
    shutil.copytree(REPO / "examples" / "tiny_lm", proj)
    config = str(proj / "hotreload.toml")
    watch = [sys.executable, "-m", "hotreload", "watch", "--no-tui", "--config", config]
    server = Server(watch, "serving ", proj)
    try:
        from hotreload import Client

        client = Client(config=proj / "hotreload.toml", timeout_s=60)
        # Interleaved rounds, so both sides see the same machine.
        direct: list[float] = []
        routed: list[float] = []
        for _ in range(4):
            direct += in_process(proj, args.requests // 4, args.tokens)
            routed += served(client, args.requests // 4, args.tokens)
        edits = edit_to_answer(client, proj / "model.py", args.edits, args.tokens)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"tiny LM, {len(PROMPTS)} prompts x {args.tokens} new tokens per request, "
        f"{len(direct)} requests each"
    )
    print(f"{'path':<24} {'p50 ms':>9} {'p99 ms':>9}")
    for label, lat in (("in-process call", direct), ("hotreload Client", routed)):
        print(f"{label:<24} {percentile(lat, 50):>9.2f} {percentile(lat, 99):>9.2f}")
    print(
        f"overhead per request: p50 {percentile(routed, 50) - percentile(direct, 50):+.2f} ms, "
        f"p99 {percentile(routed, 99) - percentile(direct, 99):+.2f} ms"
    )
    if edits:
        print(
            f"edit -> first new answer over {len(edits)} edits: median "
            f"{percentile(edits, 50) * 1000:.0f} ms, max {max(edits) * 1000:.0f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Streamed completions (`"stream": true`, SSE) through hotreload vs the same model's decode
loop in this process, side by side in one run; then 8 concurrent streams across 5 code
edits.

    .venv/bin/python benchmarks/streaming.py [--size small] [--tokens 128] [--repeat 5]

The model is a GPT-2 built from a config with seeded random weights and a byte-level BPE
tokenizer (tests/evalharness/make_lm.py): `tiny` (2 layers of 64), `small` (4 layers of
256: 3.4M parameters, 14 MB, the default) or `gpt2` (GPT-2 small's 124M shape). The
served model runs with `threads = 1` and this process with one torch thread too.

1. Time to the first streamed token (request sent -> its chunk read by the client) against
   the in-process prefill (the decode loop's first token: the prompt's forward and the
   pick), target: at most prefill + 20 ms.
2. Streamed tokens per second (the client's reads, first token to last) against the
   in-process decode loop (hotreload's own `complete`, first token to last), target: at
   least 0.9x.
3. 8 clients streaming without pause while model.py is edited and reloaded 5 times
   (`/v2/repository/models/lm/load`): every stream must end with its finish_reason and
   `[DONE]`, no error, and every chunk of it name one version (`model_version`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import REPO, Server

sys.path.insert(0, str(REPO))
from tests.evalharness.make_lm import served_project

#: Sizes beyond make_lm's: (n_embd, n_layer, n_head).
SHAPES = {"small": (256, 4, 4)}
PROMPTS = [
    "Question: What color is the sky on a clear day?\nAnswer:",
    "The capital of France is",
    "Once upon a time, there was",
    "One, two, three, four,",
]
TTFT_SLACK_MS = 20.0
RATE_TARGET = 0.9


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def project(root: Path, size: str) -> Path:
    """The served project; `small` re-saves make_lm's weights at a bigger shape."""
    config = served_project(root, "tiny" if size in SHAPES else size)
    if size in SHAPES:
        import torch
        from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

        folder = config.parent / "lm"
        tok = AutoTokenizer.from_pretrained(folder)
        n_embd, n_layer, n_head = SHAPES[size]
        torch.manual_seed(0)
        cfg = GPT2Config(
            vocab_size=len(tok),
            n_positions=512,
            bos_token_id=tok.eos_token_id,
            eos_token_id=tok.eos_token_id,
            initializer_range=0.3,
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
        )
        GPT2LMHeadModel(cfg).eval().save_pretrained(folder)
    return config


# ---------------------------------------------------------------------- in this process


class InProcess:
    """The served folder's model and tokenizer, run by hotreload's own decode loop."""

    def __init__(self, folder: Path) -> None:
        import torch

        from hotreload.worker.generate import ModelCall
        from hotreload.worker.text_tokenizer import tokenizer_for

        torch.set_num_threads(1)
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.call = ModelCall.of(self.model)
        self.tok = tokenizer_for(self.model, str(folder))

    def run(self, prompt: str, tokens: int) -> tuple[float, float, int, str, str, str]:
        """(first token s, tokens/s first to last, tokens, finish_reason, text, the text
        the first token showed: "" when a stream would hold it back, half a character)."""
        import torch

        from hotreload.worker.generate import STREAM_TO, Sampling, complete

        stamps: list[float] = []
        shown: list[str] = []

        def hook(text: str, _logprobs: Any) -> None:
            stamps.append(time.perf_counter())
            shown.append(text)

        opened = STREAM_TO.set(lambda: hook)
        try:
            ids = self.tok.encode(prompt)
            t0 = time.perf_counter()
            with torch.inference_mode():
                done = complete(
                    self.call, self.tok, ids, Sampling(tokens, 0.0), torch.device("cpu")
                )
        finally:
            STREAM_TO.reset(opened)
        rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
        first = stamps[0] - t0
        return first, rate, done.completion_tokens, done.finish_reason, done.text, shown[0]


# ---------------------------------------------------------------------- served


def stream(url: str, doc: dict[str, Any]) -> dict[str, Any]:
    """One streamed request: when each chunk came, what it said, how it ended."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    body = json.dumps({**doc, "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    out: dict[str, Any] = {"status": resp.status, "stamps": [], "versions": set(), "text": ""}
    out.update(done=False, error=None, finish=None, tokens=0)
    if resp.status != 200:
        out["error"] = resp.read().decode()
        conn.close()
        return out
    buf = b""
    while not out["done"]:
        piece = resp.read1(65536)
        if not piece:
            break
        now = time.perf_counter() - t0
        buf += piece
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            data = event.decode().removeprefix("data: ")
            if data == "[DONE]":
                out["done"] = True
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                out["error"] = chunk["error"]["message"]
                continue
            out["versions"].add(chunk.get("model_version"))
            if chunk.get("usage"):
                out["tokens"] = chunk["usage"]["completion_tokens"]
            for c in chunk["choices"]:
                if c["text"]:
                    out["stamps"].append(now)
                out["text"] += c["text"]
                out["finish"] = c["finish_reason"] or out["finish"]
    conn.close()
    return out


def served_run(url: str, prompt: str, tokens: int) -> tuple[float, float, str]:
    """(first token s, tokens/s first to last, text) of one stream. The first chunk is the
    first token alone (the worker sends it at once); later ones may hold several (it sends
    at most one frame per 10 ms): tokens after the first over the time to the last."""
    got = stream(url, {"model": "lm", "prompt": prompt, "max_tokens": tokens, "temperature": 0})
    assert got["status"] == 200 and got["done"] and not got["error"], got
    stamps = got["stamps"]
    span = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
    rate = (got["tokens"] - 1) / span if span > 0 else 0.0
    return stamps[0], rate, got["text"]


def serving_cpus(server: Server) -> set[int]:
    """The CPUs the session's worker process runs on."""
    import psutil

    kids = psutil.Process(server.proc.pid).children(recursive=True)
    worker = next(k for k in kids if "hotreload.worker" in " ".join(k.cmdline()))
    return set(worker.cpu_affinity())


def pinned(cpus: set[int], fn: Callable[[], Any]) -> Any:
    """`fn()` with this thread on `cpus` (its torch thread is this one: 1 thread)."""
    import os

    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        return fn()
    finally:
        os.sched_setaffinity(0, before)


def edits_under_load(config: Path, url: str, clients: int, edits: int) -> dict[str, Any]:
    """`clients` threads streaming back to back while model.py is edited and reloaded
    `edits` times; every stream's outcome."""
    from hotreload.client import http_headers

    token = http_headers(config)
    code = config.parent / "model.py"
    original = code.read_text()
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(i: int) -> None:
        while not stop.is_set():
            prompt = PROMPTS[i % len(PROMPTS)]
            doc = {"model": "lm", "prompt": prompt, "max_tokens": 32, "temperature": 0}
            got = stream(url, doc)
            with lock:
                results.append(got)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    reloads: list[tuple[int, float]] = []
    try:
        for n in range(edits):
            time.sleep(1.0)
            code.write_text(original + f"\n# edit {n + 1}\n")
            t0 = time.perf_counter()
            req = urllib.request.Request(
                url + "/v2/repository/models/lm/load", data=b"{}", headers=token, method="POST"
            )
            with urllib.request.urlopen(req, timeout=300) as r:
                reloads.append((r.status, time.perf_counter() - t0))
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(300)
        code.write_text(original)
    broken = [
        r
        for r in results
        if r["status"] != 200 or r["error"] or not r["done"] or r["finish"] is None
    ]
    # A stream refused before its first chunk has no version: broken, not mixed.
    mixed = [r for r in results if len(r["versions"]) > 1]
    versions = sorted({v for r in results for v in r["versions"] if v is not None})
    return {
        "streams": len(results),
        "broken": broken,
        "mixed": mixed,
        "versions": versions,
        "reloads": reloads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", default="small", choices=["tiny", "small", "gpt2"])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--edits", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hr-bench-stream-") as tmp:
        config = project(Path(tmp) / args.size, args.size)
        folder = config.parent / "lm"
        local = InProcess(folder)
        # A prompt whose greedy answer runs to max_tokens (random weights may end early)
        # and whose first token is text (random weights may pick a byte that is half a
        # character, which a stream holds back to the next token: the model's delay).
        prompt = next(
            (p for p in PROMPTS if (r := local.run(p, args.tokens))[3] == "length" and r[5]),
            PROMPTS[0],
        )
        params = sum(p.numel() for p in local.model.parameters())
        port = free_port()
        args_ = [sys.executable, "-m", "hotreload", "serve", "--config", str(config)]
        server = Server(
            [*args_, "--http", f"127.0.0.1:{port}"], "serving ", cwd=config.parent, timeout_s=300
        )
        url = f"http://127.0.0.1:{port}"
        try:
            served_run(url, prompt, args.tokens)  # the first request's one-time costs
            # The in-process loop runs on the CPUs the served worker is pinned to
            # (engine/cpus.py gives it a core of its own), so neither has a quieter core.
            cpus = serving_cpus(server)
            local_runs, served_runs = [], []
            for _ in range(args.repeat):  # alternated: neither gets a quieter machine
                local_runs.append(pinned(cpus, lambda: local.run(prompt, args.tokens)))
                served_runs.append(served_run(url, prompt, args.tokens))
            load = edits_under_load(config, url, args.clients, args.edits)
        finally:
            server.stop()
    same = all(s[2] == local_runs[0][4] for s in served_runs)
    prefill_ms = statistics.median(r[0] for r in local_runs) * 1000
    ttft_ms = statistics.median(r[0] for r in served_runs) * 1000
    local_rate = statistics.median(r[1] for r in local_runs)
    served_rate = statistics.median(r[1] for r in served_runs)
    print(
        f"model: GPT-2 {args.size}, {params / 1e6:.1f}M parameters ({params * 4 / 2**20:.0f} MB),"
        f" 1 torch thread; prompt of {len(local.tok.encode(prompt))} tokens, "
        f"{local_runs[0][2]} new tokens, median of {args.repeat}"
    )
    print(f"streamed text equals the in-process decode loop's: {same}")
    print(
        f"time to first token: streamed {ttft_ms:.1f} ms, in-process prefill {prefill_ms:.1f} ms"
        f" (+{ttft_ms - prefill_ms:.1f} ms; target <= +{TTFT_SLACK_MS:.0f} ms: "
        f"{'met' if ttft_ms <= prefill_ms + TTFT_SLACK_MS else 'MISSED'})"
    )
    ratio = served_rate / local_rate if local_rate else 0.0
    print(
        f"tokens/s: streamed {served_rate:.0f}, in-process decode loop {local_rate:.0f} "
        f"(ratio {ratio:.2f}; target >= {RATE_TARGET}: "
        f"{'met' if ratio >= RATE_TARGET else 'MISSED'})"
    )
    reload_s = [s for _, s in load["reloads"]]
    print(
        f"{args.clients} concurrent streams across {args.edits} code edits: {load['streams']} "
        f"streams, {len(load['broken'])} broken, {len(load['mixed'])} with more than one "
        f"version; versions served {load['versions']}; reloads "
        f"{[status for status, _ in load['reloads']]} in "
        f"{', '.join(f'{s:.1f}' for s in reload_s)} s"
    )
    for r in (load["broken"] + load["mixed"])[:5]:
        print("  ", {k: r[k] for k in ("status", "error", "done", "finish", "versions")})


if __name__ == "__main__":
    main()

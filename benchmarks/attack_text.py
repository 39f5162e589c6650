"""The text and adapter cases of the attack (issue 38): a text model's worker under hostile
requests, adapter files saved in place, and a NaN push to an adapter that is not the default.

One `hotreload serve --http` of a small GPT-2 (built here from its config, 512 positions,
a BPE tokenizer trained on the bundled eval tasks) with two LoRA adapters of about 0.5 MiB
each, as peft saves them. While innocent clients ask the base and both adapters for short
completions in closed loops, the phase:

- sends each hostile request of `HOSTILE` (a prompt far past the context, a header-sized
  tokenize, echo+logprobs on a long prompt, token ids past the vocabulary, a lone
  surrogate, a seed past 64 bits, an adapter that does not exist, `best_of: true`, a body
  cut off mid-way): each must get a 4xx within `BAD_ANSWER_S`, and no worker may die;
- writes adapter a's file in place in two halves, `HALF_GAP_S` apart (the SIGBUS of item 1);
- pushes NaN into adapter b with `strict=False` (item 3): refused, b still answers.

Counted: bad requests answered in time, worker deaths, innocent requests lost, tracebacks in
the session's log. Run alone (`python benchmarks/attack_text.py`) or as the last phase of
`benchmarks/attack.py`.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import Server
from hotreload import Client
from hotreload.client import http_headers
from hotreload.errors import ClientError
from tests.http.test_adapters_http import CONFIG as ADAPTERS_CONFIG
from tests.http.test_adapters_http import MODEL as ADAPTERS_MODEL

#: A hostile request is answered (4xx) within this, or it counts as not clean.
BAD_ANSWER_S = 2.0
#: Between the two halves of an adapter file written in place.
HALF_GAP_S = 2.0

#: The adapters test's model and config (a GPT-2 from its config, adapters a and b).
MODEL = ADAPTERS_MODEL
CONFIG = ADAPTERS_CONFIG.replace('name = "lm"', 'name = "gen"')


def _completion(model: str, prompt: Any, **extra: Any) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": 4, **extra}


#: (what, route, JSON body as text): each must be refused with a 4xx at once; the tokenize
#: of 300k characters (a reply of 300k ids, over the frame's header limit, which killed the
#: worker) must be answered at once, 200 or 4xx.
HOSTILE: list[tuple[str, str, str]] = [
    ("prompt of 200k chars", "/v1/completions", json.dumps(_completion("gen", "x" * 200_000))),
    ("tokenize 300k chars", "/tokenize", json.dumps({"model": "gen", "prompt": "x" * 300_000})),
    (
        "echo+logprobs 20, 60k prompt",
        "/v1/completions",
        json.dumps(_completion("gen", "ab " * 20_000, echo=True, logprobs=20, max_tokens=0)),
    ),
    ("token id past vocab", "/v1/completions", json.dumps(_completion("gen", [5, 10**6]))),
    ("lone surrogate", "/v1/completions", '{"model": "gen", "prompt": "a\\ud800b"}'),
    ("seed 2**80", "/v1/completions", json.dumps(_completion("gen", "hi", seed=2**80))),
    ("adapter gen:nope", "/v1/completions", json.dumps(_completion("gen:nope", "hi"))),
    ("best_of: true", "/v1/completions", json.dumps(_completion("gen", "hi", best_of=True))),
]


@dataclass
class TextTally:
    bad_tried: int = 0
    bad_clean: int = 0
    bad_slowest_s: float = 0.0
    innocent_sent: int = 0
    innocent_lost: int = 0
    deaths: int = 0
    tracebacks: int = 0
    in_place_ok: bool = False
    nan_push_refused: bool = False
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if len(self.notes) < 12:
            self.notes.append(text)


def make_project(folder: Path) -> Path:
    """The GPT-2 and its two adapters, as `save_pretrained` writes them."""
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    from tests.evalharness.make_lm import make_lm

    root = folder / "proj"
    make_lm(root / "lm")
    (root / "model.py").write_text(MODEL)
    base = AutoModelForCausalLM.from_pretrained(root / "lm")
    for name, seed in (("a", 1), ("b", 2)):
        torch.manual_seed(seed)
        cfg = peft.LoraConfig(
            r=64,
            target_modules=["c_attn", "c_proj", "c_fc"],
            fan_in_fan_out=True,
            init_lora_weights=False,
        )
        peft.get_peft_model(base, cfg).save_pretrained(root / "adapters" / name)
        base = AutoModelForCausalLM.from_pretrained(root / "lm")  # get_peft_model wraps it
    (root / "hotreload.toml").write_text(CONFIG)
    return root / "hotreload.toml"


@dataclass
class TextSession:
    server: Server
    config: Path
    host: str
    port: int

    @property
    def lines(self) -> list[str]:
        return self.server.lines


def start(config: Path) -> TextSession:
    cmd = [sys.executable, "-m", "hotreload", "serve", "--config", str(config)]
    server = Server([*cmd, "--http", "127.0.0.1:0"], "serving ", config.parent, 180)
    for line in server.lines:
        if m := re.search(r"http: listening on http://(\S+):(\d+)", line):
            return TextSession(server, config, m.group(1), int(m.group(2)))
    server.stop()
    raise SystemExit("the text session printed no HTTP address:\n" + "".join(server.lines))


def post(s: TextSession, path: str, body: bytes, timeout: float = 30.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(s.host, s.port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json", **http_headers(s.config)}
        conn.request("POST", path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def _innocent(s: TextSession, tally: TextTally, stop: threading.Event, model: str) -> None:
    body = json.dumps(_completion(model, "the cat")).encode()
    while not stop.is_set():
        tally.innocent_sent += 1
        try:
            status, reply = post(s, "/v1/completions", body, timeout=15)
        except OSError as exc:
            status, reply = 0, repr(exc).encode()
        if status != 200:
            tally.innocent_lost += 1
            tally.note(f"innocent {model}: {status} {reply[:160]!r}")


def _deaths(s: TextSession) -> int:
    return sum("worker died" in line or "worker_died" in line for line in s.lines)


def _cut_body(s: TextSession) -> None:
    """A client that sends half its body and goes away (item 7)."""
    import socket

    with socket.create_connection((s.host, s.port), timeout=5) as sock:
        head = (
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 10000\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in http_headers(s.config).items())
            + "\r\n"
        )
        sock.sendall(head.encode() + b'{"model": "gen", "prompt": "')


def _in_place(path: Path) -> None:
    """Item 1's save: the file rewritten through one descriptor, in two halves."""
    data = path.read_bytes()
    with open(path, "wb") as fh:
        fh.write(data[: len(data) // 2])
        fh.flush()
        time.sleep(HALF_GAP_S)
        fh.write(data[len(data) // 2 :])


def run_text_attack(folder: Path) -> TextTally:
    tally = TextTally()
    config = make_project(folder)
    s = start(config)
    stop = threading.Event()
    threads = [
        threading.Thread(target=_innocent, args=(s, tally, stop, m), daemon=True)
        for m in ("gen", "gen:a", "gen:b")
    ]
    try:
        for t in threads:
            t.start()
        deaths = _deaths(s)
        for what, route, body in HOSTILE:
            t0 = time.monotonic()
            try:
                status, reply = post(s, route, body.encode(), timeout=30)
            except OSError as exc:
                status, reply = 0, repr(exc).encode()
            took = time.monotonic() - t0
            tally.bad_tried += 1
            tally.bad_slowest_s = max(tally.bad_slowest_s, took)
            low = 200 if route == "/tokenize" else 400
            ok = low <= status < 500 and took <= BAD_ANSWER_S
            tally.bad_clean += ok
            if not ok:
                tally.note(f"{what}: {status} in {took:.2f} s: {reply[:160]!r}")
        for _ in range(3):
            _cut_body(s)
        adapter = config.parent / "adapters" / "a" / "adapter_model.safetensors"
        _in_place(adapter)
        time.sleep(3.0)  # the reload of a's save, while the innocent clients go on
        tally.in_place_ok = _deaths(s) == deaths
        from safetensors.numpy import load_file

        saved = load_file(str(config.parent / "adapters" / "b" / "adapter_model.safetensors"))
        # peft's names with the adapter's in them: "...lora_A.b.weight" is adapter b's.
        poisoned = {
            k.replace(".lora_A.weight", ".lora_A.b.weight"): np.full_like(v, np.nan)
            for k, v in saved.items()
            if k.endswith(".lora_A.weight")
        }
        try:
            with Client(config=config, timeout_s=60) as c:
                c.update_weights("gen", dict(list(poisoned.items())[:1]), strict=False)
            tally.note("NaN push to gen:b was accepted")
        except ClientError as exc:
            tally.nan_push_refused = "nan" in str(exc).lower() or "finite" in str(exc).lower()
            if not tally.nan_push_refused:
                tally.note(f"NaN push refused, but not for NaN: {exc}")
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(20)
        tally.deaths = _deaths(s)
        s.server.stop()
        tally.tracebacks = sum("Traceback" in line for line in s.lines)
    return tally


def report(t: TextTally) -> None:
    print(f"\n{'text and adapter cases':<34} {'result':>20}")
    print(f"{'hostile requests answered in ' + str(BAD_ANSWER_S) + ' s':<34} "
          f"{t.bad_clean:>9} of {t.bad_tried:<8}")  # fmt: skip
    print(f"{'slowest hostile answer':<34} {t.bad_slowest_s:>18.2f} s")
    print(f"{'innocent requests lost':<34} {t.innocent_lost:>9} of {t.innocent_sent:<8}")
    print(f"{'worker deaths':<34} {t.deaths:>20}")
    print(f"{'adapter saved in place, halves':<34} {'no death' if t.in_place_ok else 'DIED':>20}")
    print(f"{'NaN push to gen:b':<34} {'refused' if t.nan_push_refused else 'ACCEPTED':>20}")
    print(f"{'tracebacks in the log':<34} {t.tracebacks:>20}")
    for note in t.notes:
        print(f"  {note}")


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="hotreload-attack-text-"))
    try:
        report(run_text_attack(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

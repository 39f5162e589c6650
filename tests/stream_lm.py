"""A text generator whose greedy answer is known and never ends early, for the streaming
tests: each token is the one after the last (printable ASCII, wrapping), it has no
end-of-text token, so a stream runs for exactly `max_tokens` tokens unless stopped. With
`DELAY_S` each forward sleeps: a stream that was not stopped would then hold the serving
thread for seconds, which a test sees as the next request timing out. Its chat template
is the messages' contents, one after the other.
"""

from __future__ import annotations

from pathlib import Path

from tests.support import make_project

COUNT_LM = '''
import time

import torch
from torch import nn

#: Printable ASCII as ids 0..94 (chr(32 + id)).
VOCAB = 95
DELAY_S = 0.0
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def encode(text, add_special_tokens=True):
    return [ord(c) - 32 for c in text if 32 <= ord(c) < 127]


def decode(ids):
    return "".join(chr(32 + int(i) % VOCAB) for i in ids)


class CountLM(nn.Module):
    """Logits whose argmax is the id after each input id."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, input_ids):
        if DELAY_S:
            time.sleep(DELAY_S)
        nxt = (input_ids + 1) % VOCAB
        return torch.nn.functional.one_hot(nxt, VOCAB).float() * self.scale


def build():
    return CountLM()


def example():
    return torch.zeros((1, 3), dtype=torch.long)
'''


def count_section(name: str = "count", timeout_s: float = 60.0, drain_s: float = 10.0) -> str:
    """The `[[models]]` table serving count_lm.py as `name`."""
    return f"""
[[models]]
name = "{name}"
entry = "count_lm.py:build"
example = "count_lm.py:example"
generator = true
threads = 1
warmup_iters = 1
request_timeout_s = {timeout_s}
[models.deadlines]
drain_s = {drain_s}
"""


def count_lm(delay_s: float = 0.0) -> str:
    """count_lm.py, each forward sleeping `delay_s`."""
    return COUNT_LM.replace("DELAY_S = 0.0", f"DELAY_S = {delay_s!r}")


def count_project(tmp_path: Path, *, delay_s: float = 0.0) -> Path:
    """A project serving the counting LM as model "count"; its hotreload.toml."""
    return make_project(tmp_path, config=count_section(), files={"count_lm.py": count_lm(delay_s)})

"""A session with three text generators for the chat tests, built with no download:

- "chat": the tiny GPT-2 of tests/evalharness/make_lm.py with a Llama-style tokenizer (its
  BOS added by default, as `tokenizer(text)` does for Llama or Gemma) and a chat template
  that writes the BOS itself, declared as a user would: `tokenizer.chat_template = ...`,
  then `save_pretrained`.
- "lm": the same weights with make_lm's own tokenizer, which has no chat template.
- "gen": examples/tiny_lm (encode/decode and CHAT_TEMPLATE in its module).

`lm_project` serves "lm" alone as a generator, beside "plain", which is not one.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.evalharness.make_lm import EOS, SERVED_MODEL, served_project
from tests.support import REPO

#: A Hugging Face chat template: the BOS as text first (tokenized back to its id, since the
#: chat route adds no special tokens of its own), then one line per message. It refuses a
#: developer message, as some templates refuse roles they do not know.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'developer' %}{{ raise_exception('no developer messages') }}{% endif %}"
    "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

EXTRA_MODELS = """
[[models]]
name = "chat"
entry = "chat_model.py:build"
example = "chat_model.py:example"
device = "cpu"
warmup_iters = 1
threads = 1
request_timeout_s = 60.0
shapes = { input_ids = [-1, -1] }
generator = true
tokenizer = "chat_lm"

[[models]]
name = "gen"
entry = "tiny.py:build"
example = "tiny.py:example"
device = "cpu"
warmup_iters = 1
threads = 1
request_timeout_s = 60.0
generator = true
"""


def llama_style(folder: Path, into: Path) -> None:
    """make_lm's tokenizer with a BOS added by default (a template processor, as Llama's
    tokenizer.json has) and CHAT_TEMPLATE, saved as a user saves one."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    bos = tok.convert_tokens_to_ids(EOS)  # GPT-2's BOS is its end of text
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{EOS} $A", pair=f"{EOS} $A $B", special_tokens=[(EOS, bos)]
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(into)


def chat_project(root: Path) -> Path:
    """The project (its config path): lm/ and chat_lm/ hold the same weights."""
    config = served_project(root)
    lm, chat_lm = root / "lm", root / "chat_lm"
    if not chat_lm.is_dir():
        shutil.copytree(lm, chat_lm)
        llama_style(lm, chat_lm)
    (root / "chat_model.py").write_text(SERVED_MODEL.replace('/ "lm"', '/ "chat_lm"'))
    shutil.copy(REPO / "examples" / "tiny_lm" / "model.py", root / "tiny.py")
    config.write_text(config.read_text() + EXTRA_MODELS)
    return config


#: A model that is not a text generator, beside "lm" in `lm_project`.
PLAIN = """
import torch

def build():
    return torch.nn.Linear(4, 2)

def example():
    return torch.ones(1, 4)
"""


def lm_project(root: Path) -> Path:
    """The project (its config path) of make_lm's "lm" alone as a text generator, and
    "plain", a linear layer that is not one."""
    config = served_project(root)
    (root / "plain.py").write_text(PLAIN)
    config.write_text(
        config.read_text()
        + '\n[[models]]\nname = "plain"\nentry = "plain.py:build"\nexample = "plain.py:example"'
        "\nthreads = 1\nwarmup_iters = 1\n"
    )
    return config


def in_process(root: Path, name: str) -> tuple[Any, Any]:
    """(model, tokenizer) of generator `name` ("chat" or "lm"), loaded in this process."""
    import transformers

    folder = root / ("chat_lm" if name == "chat" else "lm")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    return model, transformers.AutoTokenizer.from_pretrained(folder)


def greedy(logits_of: Any, ids: list[int], n: int, eos: int | None) -> list[int]:
    """Greedy decoding by re-running the whole sequence (no cache, nothing shared with the
    server's decode loop), stopping after an end-of-text token as the server does."""
    import torch

    out = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            nxt = int(logits_of(torch.tensor([out]))[0, -1].argmax())
            out.append(nxt)
            if nxt == eos:
                break
    return out[len(ids) :]

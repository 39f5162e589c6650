"""A small causal LM as `save_pretrained` writes it (model and tokenizer), with no download:
a byte-level BPE tokenizer trained here on the tasks' own text, GPT-2 weights from a seed.

Both lm-eval's `hf` model and a hotreload session load this very folder, so any difference
in their scores is the serving path's. `size="gpt2"` is GPT-2 small's shape (124M) for the
benchmark.
"""

from __future__ import annotations

import json
from pathlib import Path

TASKS = Path(__file__).resolve().parent / "tasks"
EOS = "<|endoftext|>"

SIZES = {
    "tiny": {"n_embd": 64, "n_layer": 2, "n_head": 4},
    "gpt2": {"n_embd": 768, "n_layer": 12, "n_head": 12},
}


def corpus() -> list[str]:
    """Every string in the tasks' JSONL files: what the tokenizer is trained on."""
    texts: list[str] = []
    for path in sorted(TASKS.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            doc = json.loads(line)
            for v in doc.values():
                texts.extend(v if isinstance(v, list) else [v] if isinstance(v, str) else [])
    return texts


def make_lm(folder: Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write model + tokenizer into `folder` (once: an existing folder is reused)."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus(), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, bos_token=EOS)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(folder)
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tok),
        n_positions=512,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        # Wide random weights: varied (meaningless) text rather than one token repeated.
        initializer_range=0.3,
        **SIZES[size],
    )
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(folder)
    return folder


#: The hotreload model module that serves the folder: the same weights, read by the same
#: transformers call lm-eval's `hf` model makes.
SERVED_MODEL = """
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

FOLDER = Path(__file__).resolve().parent / "lm"


def build():
    return AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float32).eval()


def example():
    return {"input_ids": torch.arange(8).reshape(1, 8)}
"""

SERVED_CONFIG = """
[[models]]
name = "lm"
entry = "model.py:build"
example = "model.py:example"
device = "cpu"
warmup_iters = 1
threads = 1
request_timeout_s = 60.0
shapes = { input_ids = [-1, -1] }
generator = true
tokenizer = "lm"
"""


def served_project(root: Path, size: str = "tiny") -> Path:
    """A hotreload project serving the LM of `make_lm`: returns its config path."""
    root.mkdir(parents=True, exist_ok=True)
    make_lm(root / "lm", size)
    (root / "model.py").write_text(SERVED_MODEL)
    (root / "hotreload.toml").write_text(SERVED_CONFIG)
    return root / "hotreload.toml"

"""A weights file rewritten in place never faults the process serving from it (issue 38,
item 1: "a file mapped by a serving worker cannot fault it when rewritten or truncated").

safetensors maps the file; the worker copies the file's tensors out of the mapping. A
Hugging Face checkpoint whose fused tensors the module holds split (GTE's `qkv_proj` into
q, k and v: transformers' `Chunk`) made views of the mapping that escaped the copy, so a
save in place (`open(path, "wb")` truncates first) killed the process with SIGBUS at its
next forward. Run in a child process: the fault would take pytest down with it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("transformers")

SCRIPT = """
import sys
from pathlib import Path

import torch
from transformers import GteConfig, GteModel

from hotreload.worker.weights import load_weights

config = GteConfig(
    vocab_size=64, hidden_size=256, num_hidden_layers=1, num_attention_heads=2,
    intermediate_size=1024, max_position_embeddings=32,
)
folder = Path(sys.argv[1])
torch.manual_seed(0)
GteModel(config).save_pretrained(folder)  # qkv_proj fused in the file, as GTE ships it
path = folder / "model.safetensors"
model = GteModel(config).eval()
load_weights(model, [str(path)], None, assign=True, device=torch.device("cpu"))
ids = torch.tensor([[1, 5, 9, 3]])
with torch.inference_mode():
    before = model(input_ids=ids).last_hidden_state
data = path.read_bytes()
with open(path, "wb") as f:  # a save in place: truncated, then half written
    f.write(data[: len(data) // 2])
    f.flush()
    with torch.inference_mode():
        after = model(input_ids=ids).last_hidden_state
print("same answer:", bool(torch.equal(before, after)))
"""


def test_a_converted_checkpoint_rewritten_in_place_leaves_the_loaded_weights_alone(
    tmp_path: Path,
) -> None:
    script = tmp_path / "serve_then_save.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "gte")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # -7: SIGBUS
    assert "same answer: True" in done.stdout, done.stdout

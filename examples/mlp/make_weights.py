"""Write weights.safetensors for the example MLP (deterministic for a given seed).

    python examples/mlp/make_weights.py [--seed N] [--out PATH]

Changing the seed and saving over the file is a weights-only edit: hotreload rebuilds the
module from the same code and loads the new weights, without re-importing model.py.
"""

import argparse
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
from model import build


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).with_name("weights.safetensors")))
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    state = {k: v.contiguous() for k, v in build().state_dict().items()}
    # Atomically, as docs/weights.md advises trainers: the watch only ever sees whole files.
    tmp = args.out + ".tmp"
    save_file(state, tmp)
    os.replace(tmp, args.out)
    print(f"wrote {args.out} (seed {args.seed})")


if __name__ == "__main__":
    main()

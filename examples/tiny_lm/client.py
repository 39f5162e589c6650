"""Ask the tiny LM: prompts in, text out, over hotreload's Unix socket.

python examples/tiny_lm/client.py "Once upon a time" "Another prompt" [--tokens 16]
"""

import argparse
from pathlib import Path

from hotreload import Client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("prompts", nargs="+")
    parser.add_argument("--tokens", type=int, default=16, help="max_new_tokens per prompt")
    args = parser.parse_args()
    with Client(config=Path(__file__).with_name("hotreload.toml")) as client:
        texts, version, _ = client.infer(
            "gen", args.prompts, parameters={"max_new_tokens": args.tokens}
        )
    for prompt, text in zip(args.prompts, texts, strict=True):
        print(f"v{version} {prompt!r} -> {text!r}")


if __name__ == "__main__":
    main()

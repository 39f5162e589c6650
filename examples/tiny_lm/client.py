"""Ask the tiny LM: prompts in, text out, over hotreload's Unix socket, or through the
OpenAI-compatible completions route of `hotreload serve --http`.

python examples/tiny_lm/client.py "Once upon a time" "Another prompt" [--tokens 16]
python examples/tiny_lm/client.py --openai http://127.0.0.1:8000 "Once upon a time"
"""

import argparse
from pathlib import Path

from hotreload import Client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("prompts", nargs="+")
    parser.add_argument("--tokens", type=int, default=16, help="max_new_tokens per prompt")
    parser.add_argument(
        "--openai", metavar="URL", help="ask /v1/completions at URL with the openai client"
    )
    args = parser.parse_args()
    if args.openai:
        from openai import OpenAI  # pip install -e '.[eval]'

        client = OpenAI(base_url=args.openai.rstrip("/") + "/v1", api_key="unused")
        done = client.completions.create(
            model="gen", prompt=args.prompts, max_tokens=args.tokens, temperature=0
        )
        version = (done.model_extra or {}).get("model_version")
        for prompt, choice in zip(args.prompts, done.choices, strict=True):
            # system_fingerprint is the digest of the weights that answered.
            print(f"v{version} {done.system_fingerprint} {prompt!r} -> {choice.text!r}")
        return
    with Client(config=Path(__file__).with_name("hotreload.toml")) as client:
        texts, version, _ = client.infer(
            "gen", args.prompts, parameters={"max_new_tokens": args.tokens}
        )
    for prompt, text in zip(args.prompts, texts, strict=True):
        print(f"v{version} {prompt!r} -> {text!r}")


if __name__ == "__main__":
    main()

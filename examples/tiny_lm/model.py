"""A tiny causal LM for hotreload's second example: prompts in, text out.

Built from a transformers config (Qwen2 architecture) with seeded random weights, so it
needs no download; its answers are gibberish, but deterministic: the same prompt gives the
same text in every process. Edit the sampling code (`pick_next`), save, and the next answer
comes from the new code.
"""

import torch
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM

# Byte-level tokens: ids 0-2 are special, byte b is id b + 3.
PAD, BOS, EOS = 0, 1, 2
VOCAB = 256 + 3
SEED = 0
#: How many of the most likely tokens the sampler picks from (1 = greedy). An easy edit.
TOP_K = 1
#: The chat template /v1/chat/completions renders messages with: Jinja, as a Hugging Face
#: tokenizer's `chat_template` (it reads `messages` and `add_generation_prompt`). The text is
#: then encoded without BOS, as vLLM encodes a chat.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def encode(text: str, add_special_tokens: bool = True) -> list[int]:
    """Bytes as ids, after BOS unless told not to (an eval harness splitting context from
    continuation asks without, and a chat's rendered text is encoded without)."""
    ids = [b + 3 for b in text.encode()]
    return [BOS, *ids] if add_special_tokens else ids


def decode(ids: list[int]) -> str:
    out = bytearray()
    for i in ids:
        if i == EOS:
            break
        if i >= 3:
            out.append(i - 3)
    return out.decode(errors="replace")


def pick_next(logits: torch.Tensor) -> torch.Tensor:
    """The next token of each row: the TOP_K-th most likely byte (1 = the most likely).
    Only printable ASCII is picked (random weights would babble bytes that are not UTF-8),
    and never a special token, so every answer has max_new_tokens characters."""
    logits = logits.clone()
    logits[:, : 32 + 3] = float("-inf")
    logits[:, 127 + 3 :] = float("-inf")
    best = torch.topk(logits, TOP_K, dim=-1).indices
    return best[:, -1]


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        config = Qwen2Config(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
            # Wide random weights: varied (still meaningless) text instead of one letter.
            initializer_range=0.5,
            pad_token_id=PAD,
            bos_token_id=BOS,
            eos_token_id=EOS,
        )
        torch.manual_seed(SEED)
        self.lm = Qwen2ForCausalLM(config).eval()

    def forward(
        self,
        prompts: list[str] | None = None,
        max_new_tokens: int = 16,
        *,
        input_ids: torch.Tensor | None = None,
        cache: object | None = None,
        use_cache: bool = False,
    ) -> list[str] | object:
        """Greedy-style decoding with the KV cache; each prompt's answer does not depend on
        the others in the batch (left padding, positions from the attention mask).

        With `input_ids` instead: the logits of those tokens (an output with `.logits` and
        `.cache`), which is what the text routes call (`generator = true` in the config:
        /v1/completions, lm-eval), tokenized by `encode`/`decode` above."""
        if input_ids is not None:
            return self.lm(input_ids=input_ids, cache=cache, use_cache=use_cache)
        assert prompts is not None, "pass prompts (a list of str) or input_ids"
        rows = [encode(p) for p in prompts]
        width = max(len(r) for r in rows)
        ids = torch.tensor([[PAD] * (width - len(r)) + r for r in rows])
        mask = (ids != PAD).long()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.lm(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        generated: list[list[int]] = [[] for _ in rows]
        for _ in range(int(max_new_tokens)):
            nxt = pick_next(out.logits[:, -1, :])
            for row, token in zip(generated, nxt.tolist(), strict=True):
                row.append(token)
            mask = torch.cat([mask, torch.ones_like(nxt)[:, None]], dim=1)
            positions = positions[:, -1:] + 1
            out = self.lm(
                input_ids=nxt[:, None],
                attention_mask=mask,
                position_ids=positions,
                cache=out.cache,
                use_cache=True,
            )
        return [decode(g) for g in generated]


def build() -> nn.Module:
    """The factory hotreload calls: the model with its seeded weights."""
    return TinyLM()


def example() -> list[str]:
    """A list of str: the model takes strings (BYTES on the wire) and returns strings."""
    return ["Hello, hotreload!"]

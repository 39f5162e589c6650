"""The worker's `text` op in this process (worker/text_op.py over worker/generate.py), on a
tiny Hugging Face style model and tokenizer built in code: generation stops at every
end-of-text id its generation config lists (Llama-3 instruct's `<|eot_id|>` beside its
`<|end_of_text|>`) as vLLM's does, the answer leaves out the special tokens generated
unless `skip_special_tokens` is false, and a string no UTF-8 tokenizer can take is the
request's 400, never a model error."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from hotreload.protocol.framing import Frame  # noqa: E402
from hotreload.protocol.messages import CANCELLED, PARTIAL  # noqa: E402
from hotreload.worker.loader import ModelVersion  # noqa: E402
from hotreload.worker.text_op import op_text  # noqa: E402

VOCAB = {"<eos>": 0, "<eot>": 1, "<mark>": 2, "a": 3, "b": 4, "c": 5, "[UNK]": 6}
#: Each id's greedy next id: "a" -> <mark> -> b -> <eot> -> c -> c ...
NEXT = [5, 5, 4, 2, 1, 5, 5]
TEMPLATE = "{% for m in messages %}{{ m.get('name', '') }}{{ m['content'] }} {% endfor %}"


class TableLM(torch.nn.Module):
    """Logits whose argmax is NEXT[id]; its generation config lists two end-of-text ids,
    <eot> first (the tokenizer's own eos is <eos>)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(1))
        self.generation_config = transformers.GenerationConfig(eos_token_id=[1, 0])

    def forward(self, input_ids: Any) -> Any:
        nxt = torch.tensor(NEXT)[input_ids]
        return torch.nn.functional.one_hot(nxt, len(VOCAB)).float() * self.scale


def tokenizer_folder(folder: Path) -> Path:
    model = tokenizers.models.WordLevel(VOCAB, unk_token="[UNK]")
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<eos>",
        unk_token="[UNK]",
        additional_special_tokens=["<eot>", "<mark>"],
    )
    tok.chat_template = TEMPLATE
    tok.save_pretrained(folder)
    return folder


class Worker:
    """What op_text reads and counts on the worker (worker/server.py's `Worker`)."""

    def __init__(self, folder: Path, model: Any) -> None:
        self.spec: dict[str, Any] = {"tokenizer": str(folder)}
        self.served = self.failed = self.cancelled = 0
        self.busy_since: float | None = None
        self.busy_total = 0.0
        self.streams: dict[Any, threading.Event] = {}
        self.sent: list[dict[str, Any]] = []
        self.mv = ModelVersion(1, model, "single", {}, torch.device("cpu"), None, digest="d")

    def admit(self, h: dict[str, Any]) -> ModelVersion:
        self.busy_since = time.monotonic()
        return self.mv

    def send(self, header: dict[str, Any], blobs: Any = None) -> None:
        self.sent.append(header)

    def ask(self, text: dict[str, Any], flag: threading.Event | None = None) -> dict[str, Any]:
        rid = len(self.sent) + 1
        self.streams[rid] = flag or threading.Event()  # the reader thread registers each
        op_text(self, Frame({"id": rid, "op": "text", "text": text}, b""))
        return self.sent[-1]


@pytest.fixture
def worker(tmp_path: Path) -> Worker:
    return Worker(tokenizer_folder(tmp_path / "tok"), TableLM().eval())


def completion(**sampling: Any) -> dict[str, Any]:
    asked = {"max_tokens": 8, "temperature": 0.0, **sampling}
    return {"task": "complete", "prompts": ["a"], "add_special_tokens": False, "sampling": asked}


def test_generation_stops_at_each_end_of_text_id_of_the_generation_config(
    worker: Worker,
) -> None:
    reply = worker.ask(completion())
    (choice,) = reply["choices"]
    # <mark>, b, then <eot>: the config's first eos (the tokenizer's is <eos>) ends it.
    assert choice["finish_reason"] == "stop" and reply["usage"]["completion_tokens"] == 3
    assert choice["text"] == "b"  # <mark> is special: left out, as vLLM leaves it
    kept = worker.ask(completion(skip_special_tokens=False))["choices"][0]
    assert kept["text"].replace(" ", "") == "<mark>b" and kept["finish_reason"] == "stop"


def test_the_loglikelihood_path_keeps_its_special_tokens(worker: Worker) -> None:
    """lm-eval's echo + logprobs: the prompt and each token as decoded alone, specials
    kept (what it compares with `hf`), whatever skip_special_tokens says of the answer."""
    asked = completion(max_tokens=1, echo=True, logprobs=0)
    asked["prompts"] = ["a <mark>"]
    (choice,) = worker.ask(asked)["choices"]
    assert choice["logprobs"]["tokens"] == ["a", "<mark>", "b"]
    assert choice["text"].replace(" ", "") == "a<mark>b"


def test_a_stream_sends_only_the_answers_text_without_its_special_tokens(
    worker: Worker,
) -> None:
    text = {**completion(skip_special_tokens=True), "stream": True}
    final = worker.ask(text)
    parts = [h for h in worker.sent if h.get(PARTIAL)]
    assert final["choices"][0]["text"] == "b"
    assert "".join(p["choices"][0]["text"] for p in parts) in ("", "b")
    assert all("<mark>" not in p["choices"][0]["text"] for p in parts)


def test_a_module_tokenizers_special_ids_are_left_out_of_the_answer() -> None:
    from hotreload.worker.text_tokenizer import Tokenizer

    tok = Tokenizer(
        lambda text: [3],
        lambda ids: "".join("<s>" if i == 1 else "x" for i in ids),
        takes_special=False,
        eos_id=0,
        bos_id=1,
        info={},
        source="module m",
        special_ids=frozenset({0, 1}),
    )
    assert tok.decode([3, 1, 3]) == "x<s>x" and tok.decode([3, 1, 3], skip_special=True) == "xx"


def test_a_lone_surrogate_the_tokenizer_cannot_take_is_a_400_naming_its_field(
    worker: Worker,
) -> None:
    """The HTTP front refuses one; the worker too, as a bad request (400), not a model
    error (500): a chat template writes a message's name, and the tokenizer raises
    UnicodeEncodeError on it."""
    chat = {
        "task": "chat",
        "messages": [{"role": "user", "content": "a", "name": "\ud800"}],
        "sampling": {"max_tokens": 2, "temperature": 0.0},
    }
    reply = worker.ask(chat)
    assert reply["ok"] is False and reply["error"]["code"] == "bad_request", reply
    assert reply["error"]["param"] == "messages"
    assert "(U+D800 at character" in reply["error"]["message"]
    prompt = worker.ask({**completion(), "prompts": ["a\udc00"]})
    assert prompt["error"]["code"] == "bad_request" and prompt["error"]["param"] == "prompt"


def test_a_text_request_not_streamed_stops_at_a_cancel(worker: Worker) -> None:
    """The flag a CANCEL sets stops a request not streamed too (its deadline passed, its
    client went away): at its next token, answered `cancelled` and counted."""
    flag = threading.Event()
    flag.set()
    reply = worker.ask(completion(max_tokens=None), flag)
    assert reply["error"]["code"] == CANCELLED and worker.cancelled == 1

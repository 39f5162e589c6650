"""Streaming as plain data, in this process (no worker): the decode loop's hook sends only
text no later token changes (not half a character, not the start of a stop string), so
the pieces add up to the answer not streamed; and the OpenAI chunks made of the worker's
frames, in OpenAI's exact shapes (tests/http/test_streaming.py reads them with the
`openai` client from a live session)."""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

import pytest

from hotreload.errors import WorkerUnavailableError
from hotreload.http.streaming import DONE, Chunks
from hotreload.protocol.framing import Frame

torch = pytest.importorskip("torch")

from hotreload.worker.generate import (  # noqa: E402
    STREAM_TO,
    ModelCall,
    Sampling,
    complete,
    settled,
)
from hotreload.worker.text_tokenizer import Tokenizer  # noqa: E402

ANSWER = "héllo wörld"


class ScriptLM(torch.nn.Module):
    """Makes ANSWER's UTF-8 bytes after a one-token prompt ("é" and "ö" are two tokens)."""

    def __init__(self) -> None:
        super().__init__()
        self.script = list(ANSWER.encode())

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        at = min(input_ids.shape[1] - 1, len(self.script) - 1)
        logits = torch.zeros((1, input_ids.shape[1], 256))
        logits[0, -1, self.script[at]] = 1.0
        return logits


def byte_tokenizer(decode_extends: bool = False) -> Tokenizer:
    return Tokenizer(
        lambda text: list(text.encode()),
        lambda ids: bytes(ids).decode("utf-8", errors="replace"),
        takes_special=False,
        eos_id=None,
        bos_id=None,
        info={},
        source="bytes",
        decode_extends=decode_extends,
    )


def streamed(stop: list[str], decode_extends: bool = False) -> tuple[list[str], Any]:
    """What the hook was shown, token by token, and the completion."""
    shown: list[str] = []
    token = STREAM_TO.set(lambda: lambda text, _logprobs: shown.append(text))
    try:
        done = complete(
            ModelCall.of(ScriptLM()),
            byte_tokenizer(decode_extends),
            [0],
            Sampling(max_tokens=len(ANSWER.encode()), temperature=0.0, stop=stop),
            torch.device("cpu"),
        )
    finally:
        STREAM_TO.reset(token)
    return shown, done


@pytest.mark.parametrize("extends", [False, True])
@pytest.mark.parametrize("stop", [[], ["wö"], ["lo w"]])
def test_the_hook_shows_only_text_that_stays(stop: list[str], extends: bool) -> None:
    shown, done = streamed(stop, extends)
    plain = complete(
        ModelCall.of(ScriptLM()),
        byte_tokenizer(),
        [0],
        Sampling(max_tokens=len(ANSWER.encode()), temperature=0.0, stop=stop),
        torch.device("cpu"),
    )
    # The hook changes nothing of the answer (but the clock).
    assert (done.text, done.finish_reason, done.completion_tokens, done.logprobs) == (
        plain.text,
        plain.finish_reason,
        plain.completion_tokens,
        plain.logprobs,
    )
    assert done.text == ANSWER.split(stop[0])[0] if stop else ANSWER
    assert all("\ufffd" not in s for s in shown)
    assert all(done.text.startswith(s) for s in shown)  # never text the answer drops
    assert all(a == b[: len(a)] for a, b in itertools.pairwise(shown))
    assert len(set(shown)) >= 3  # it grew token by token


def test_a_decode_that_only_appends_shows_each_tokens_text_at_that_token() -> None:
    """A tokenizer whose decode only appends: the first token's text is shown at the
    first token (time to the first streamed token is the prefill's), and "é", two byte
    tokens, at its second byte. Where a decode may rewrite, each waits one token more."""
    shown, _ = streamed([], decode_extends=True)
    assert shown[:4] == ["h", "h", "hé", "hél"]
    held, _ = streamed([], decode_extends=False)
    assert held[:4] == ["", "h", "h", "hé"]


@pytest.mark.parametrize("clean_up", [False, True])
def test_a_tokenizer_folder_says_whether_its_decode_only_appends(
    tmp_path: Any, clean_up: bool
) -> None:
    """transformers' clean_up_tokenization_spaces rewrites text before a later token
    ("I '" + "s" -> "I's"): only a tokenizer without it streams each token at once."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from hotreload.worker.text_tokenizer import from_folder

    vocab = {"[UNK]": 0, "I": 1, "'": 2, "s": 3}
    raw = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, unk_token="[UNK]", clean_up_tokenization_spaces=clean_up
    )
    hf.save_pretrained(tmp_path / f"tok-{clean_up}")
    tok = from_folder(tmp_path / f"tok-{clean_up}")
    assert tok.decode_extends is (not clean_up)
    assert tok.decode(tok.encode("I ' s")) == ("I's" if clean_up else "I ' s")


def test_a_byte_fallback_tokenizer_holds_the_newest_token_back(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Byte fallback (Llama 2, Mistral, Gemma) decodes a run of byte tokens as one: "0"
    then "0" + half a character decodes two U+FFFD, rewriting the "0" a stream sent. Such
    a tokenizer is held back a token, and its stream still adds up to the answer."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from hotreload.worker.text_tokenizer import from_folder

    vocab = {"<unk>": 0, "\u2581Hi": 1, "<0x30>": 2, "<0xB2>": 3, "\u2581world": 4}
    raw = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    d = tokenizers.decoders
    steps = [d.Replace("\u2581", " "), d.ByteFallback(), d.Fuse(), d.Strip(" ", 1, 0)]
    raw.decoder = d.Sequence(steps)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>")
    hf.save_pretrained(tmp_path / "bytes")
    tok = from_folder(tmp_path / "bytes")
    assert tok.decode([1, 2]) == "Hi0" and tok.decode([1, 2, 3]) == "Hi\ufffd\ufffd"
    assert tok.decode_extends is False

    class Script(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            at = min(input_ids.shape[1] - 1, 3)
            logits = torch.zeros((1, input_ids.shape[1], len(vocab)))
            logits[0, -1, [2, 3, 4, 4][at]] = 1.0
            return logits

    sampling = Sampling(max_tokens=3, temperature=0.0)
    done: list[Any] = []

    def shows(opened: Any) -> None:
        token = STREAM_TO.set(opened)
        try:
            done.append(complete(ModelCall.of(Script()), tok, [1], sampling, torch.device("cpu")))
        finally:
            STREAM_TO.reset(token)

    frames = worker_frames(monkeypatch, shows)
    assert done[0].text == "\ufffd\ufffd world"
    assert client_text(frames, done[0].text) == done[0].text


def test_settled_holds_back_a_character_or_a_stop_string_half_made() -> None:
    assert settled("ab\ufffd", []) == "ab"
    assert settled("hello wo", ["world"]) == "hello "
    assert settled("hello w", ["xyz", "wor"]) == "hello "
    assert settled("hello", ["lo!"]) == "hel"
    assert settled("hello", ["x", ""]) == "hello"


#: A decode that rewrites earlier text once a later token comes, as transformers'
#: clean_up_tokenization_spaces does: "I '" then "s" decodes "I's", not "I 's".
WORDS = ["<p>", "I", " '", "s", " a", " cat"]


class WordsLM(torch.nn.Module):
    """Makes WORDS[1:] in order after a one-token prompt."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        at = input_ids.shape[1]
        logits = torch.zeros((1, input_ids.shape[1], len(WORDS)))
        logits[0, -1, at if at < len(WORDS) else 0] = 1.0
        return logits


def rewriting_tokenizer() -> Tokenizer:
    def decode(ids: list[int]) -> str:
        return "".join(WORDS[i] for i in ids if i).replace(" 's", "'s")

    return Tokenizer(
        lambda text: [0],
        decode,
        takes_special=False,
        eos_id=None,
        bos_id=None,
        info={},
        source="words",
    )


def worker_frames(monkeypatch: pytest.MonkeyPatch, shows: Any) -> list[Frame]:
    """The PARTIAL frames the worker's stream sender (text_op._Stream) sends while
    `shows(hook)` runs, one per token (no grouping)."""
    from types import SimpleNamespace

    from hotreload.worker import text_op

    monkeypatch.setattr(text_op, "STREAM_FRAME_S", 0.0)
    sent: list[dict[str, Any]] = []
    mv = SimpleNamespace(version=3, digest="sha256:ab", digest_future=None)
    worker = SimpleNamespace(send=sent.append)
    stream = text_op._Stream(worker, 1, mv, threading.Event(), {"sampling": {"temperature": 0}})  # type: ignore[arg-type]
    shows(stream.open)
    stream.finish()  # as the text op does once the answer is whole, before its reply
    return [Frame(h, b"") for h in sent]


def client_text(frames: list[Frame], whole: str) -> str:
    chunks = Chunks("completion", "lm", include_usage=False)
    data = b"".join(chunks.frame(f) for f in frames) + chunks.frame(final([whole]))
    *docs, _ = parsed(data)
    return "".join(d["choices"][0]["text"] for d in docs)


def test_a_decode_that_rewrites_earlier_text_streams_the_whole_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stream holds back the newest token's text to the next token (what two decodes
    agree on): the client's pieces add up to the answer not streamed, not a cut one."""
    sampling = Sampling(max_tokens=5, temperature=0.0)
    plain = complete(
        ModelCall.of(WordsLM()), rewriting_tokenizer(), [0], sampling, torch.device("cpu")
    )
    assert plain.text == "I's a cat"
    done: list[Any] = []

    def shows(opened: Any) -> None:
        token = STREAM_TO.set(opened)
        try:
            done.append(
                complete(
                    ModelCall.of(WordsLM()),
                    rewriting_tokenizer(),
                    [0],
                    sampling,
                    torch.device("cpu"),
                )
            )
        finally:
            STREAM_TO.reset(token)

    frames = worker_frames(monkeypatch, shows)
    assert done[0].text == plain.text
    assert len(frames) >= 2  # it streamed token by token, not all in the reply
    assert "".join(f.header["choices"][0]["text"] for f in frames) == plain.text
    assert client_text(frames, done[0].text) == plain.text


def test_text_rewritten_further_back_than_a_token_does_not_cut_the_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Text sent cannot be taken back: a decode rewriting it goes on past the length sent
    (the client's text differs only where it was rewritten), to the answer's end."""

    def shows(opened: Any) -> None:
        show = opened()
        show("ab", None)
        show("xbcd", None)  # rewrote "a", added "cd"
        show("xbcdef", None)

    frames = worker_frames(monkeypatch, shows)
    assert [f.header["choices"][0]["text"] for f in frames] == ["ab", "cd", "ef"]
    assert client_text(frames, "xbcdefgh") == "abcdefgh"


def part(index: int, text: str, version: int = 3) -> Frame:
    header = {"id": 1, "ok": True, "partial": True, "version": version, "digest": "sha256:ab"}
    return Frame({**header, "choices": [{"index": index, "text": text}]}, b"")


def final(texts: list[str], finish: str = "length") -> Frame:
    choices = [
        {"index": i, "text": t, "logprobs": None, "finish_reason": finish}
        for i, t in enumerate(texts)
    ]
    usage = {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
    header = {"id": 1, "ok": True, "version": 3, "digest": "sha256:ab", "choices": choices}
    return Frame({**header, "usage": usage}, b"")


def parsed(data: bytes) -> list[Any]:
    out = []
    for block in data.decode().split("\n\n")[:-1]:
        assert block.startswith("data: ")
        body = block.removeprefix("data: ")
        out.append(body if body == "[DONE]" else json.loads(body))
    return out


class EndingLM(ScriptLM):
    """ScriptLM, then its end-of-text token (0)."""

    def __init__(self) -> None:
        super().__init__()
        self.script = [*self.script, 0]


@pytest.mark.parametrize("extends", [False, True])
@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_streamed_logprobs_add_up_to_the_answers(
    monkeypatch: pytest.MonkeyPatch, kind: str, extends: bool
) -> None:
    """Each chunk carries the log-probabilities of the tokens it completes: a byte that
    ends inside "é" comes with the chunk of its text, the end-of-text token (its text all
    sent) with the final reply's chunk. Together they are the answer's list, in the
    route's shape (legacy or chat)."""
    tok = byte_tokenizer(extends)
    tok.eos_id = 0
    sampling = Sampling(max_tokens=40, temperature=0.0, logprobs=2)
    plain = complete(ModelCall.of(EndingLM()), tok, [0], sampling, torch.device("cpu"))
    assert plain.finish_reason == "stop" and plain.text == ANSWER
    whole = plain.logprobs
    assert whole is not None and len(whole["tokens"]) == len(ANSWER.encode()) + 1
    done: list[Any] = []

    def shows(opened: Any) -> None:
        token = STREAM_TO.set(opened)
        try:
            done.append(complete(ModelCall.of(EndingLM()), tok, [0], sampling, torch.device("cpu")))
        finally:
            STREAM_TO.reset(token)

    frames = worker_frames(monkeypatch, shows)
    assert done[0].logprobs == whole  # streaming changes nothing of the answer
    sent = [f.header["choices"][0].get("logprobs") for f in frames]
    # "é" is two bytes: its first waits, unsent, for the frame of the text it makes.
    assert all(lp is None or lp["tokens"] for lp in sent)
    assert any(lp is not None and len(lp["tokens"]) == 2 for lp in sent)
    chunks = Chunks(kind, "lm", include_usage=False)
    reply = final([ANSWER], "stop")
    reply.header["choices"][0]["logprobs"] = whole
    data = b"".join(chunks.frame(f) for f in [*frames, reply])
    *docs, done_line = parsed(data)
    assert done_line == "[DONE]"
    lps = [d["choices"][0]["logprobs"] for d in docs]
    if kind == "completion":
        got: dict[str, list[Any]] = {k: [] for k in whole}
        for lp in lps:
            for k in got:
                got[k] += lp[k] if lp else []
        assert got == whole
        assert "".join(d["choices"][0]["text"] for d in docs) == ANSWER
    else:
        content = [e for lp in lps if lp for e in lp["content"]]
        assert [e["token"] for e in content] == whole["tokens"]
        assert [e["logprob"] for e in content] == whole["token_logprobs"]
        assert [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in content] == [
            top for top in whole["top_logprobs"]
        ]
    eos = whole["tokens"][-1]
    if extends:  # the text was all sent: the end-of-text token's comes with the reply
        assert sent[-1] is not None and sent[-1]["tokens"][-1] != eos
        assert lps[-1] is not None
    else:  # the last token's text was held back: it goes with the held-back text
        assert sent[-1] is not None and sent[-1]["tokens"][-1] == eos


def test_completion_chunks_with_usage_are_openais() -> None:
    chunks = Chunks("completion", "lm", include_usage=True)
    out = parsed(chunks.frame(part(0, "he")) + chunks.frame(final(["hello"])))
    first, last, usage, done = out
    assert set(first) == {
        "id",
        "object",
        "created",
        "model",
        "system_fingerprint",
        "choices",
        "usage",
        "model_version",
    }
    assert first["object"] == "text_completion" and first["usage"] is None
    assert first["choices"] == [{"index": 0, "text": "he", "logprobs": None, "finish_reason": None}]
    # The rest of the answer comes with its finish_reason.
    assert last["choices"] == [
        {"index": 0, "text": "llo", "logprobs": None, "finish_reason": "length"}
    ]
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 7
    assert done == "[DONE]"
    assert {c["id"] for c in (first, last, usage)} == {chunks.id}
    assert {c["system_fingerprint"] for c in (first, last, usage)} == {"sha256:ab"}
    assert {c["model_version"] for c in (first, last, usage)} == {3}


def test_without_include_usage_no_chunk_has_usage() -> None:
    chunks = Chunks("completion", "lm", include_usage=False)
    *docs, done = parsed(chunks.frame(part(0, "a")) + chunks.frame(final(["ab"])))
    assert done == "[DONE]" and len(docs) == 2
    assert all("usage" not in d for d in docs)


def test_chat_chunks_say_the_role_then_the_content_then_the_finish() -> None:
    chunks = Chunks("chat", "lm", include_usage=False)
    data = chunks.frame(part(0, "Hi")) + chunks.frame(part(0, " there"))
    data += chunks.frame(final(["Hi there!"], "stop"))
    *docs, done = parsed(data)
    assert {d["object"] for d in docs} == {"chat.completion.chunk"}
    deltas = [(d["choices"][0]["delta"], d["choices"][0]["finish_reason"]) for d in docs]
    assert deltas == [
        ({"role": "assistant", "content": "Hi"}, None),
        ({"content": " there"}, None),
        ({"content": "!"}, None),
        ({}, "stop"),
    ]
    assert done == "[DONE]" and chunks.id.startswith("chatcmpl-")


def test_each_choice_streams_in_its_own_index() -> None:
    chunks = Chunks("completion", "lm", include_usage=False)
    data = chunks.frame(part(0, "a")) + chunks.frame(part(1, "x"))
    data += chunks.frame(final(["ab", "xy"]))
    *docs, _ = parsed(data)
    texts: dict[int, str] = {}
    for d in docs:
        (c,) = d["choices"]
        texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    assert texts == {0: "ab", 1: "xy"}


def test_a_final_text_that_does_not_extend_the_stream_adds_nothing() -> None:
    """Never two versions of an answer: text sent is not taken back or sent again."""
    chunks = Chunks("completion", "lm", include_usage=False)
    *docs, _ = parsed(chunks.frame(part(0, "ab")) + chunks.frame(final(["xb"])))
    assert [d["choices"][0]["text"] for d in docs] == ["ab", ""]


def test_an_error_after_the_first_token_is_an_error_event_then_done() -> None:
    chunks = Chunks("completion", "lm", include_usage=True)
    error = WorkerUnavailableError("model 'lm': stream ended: model reloading to v4; retry")
    data = chunks.error("/v1/completions", error)
    assert data.endswith(DONE)
    (doc, done) = parsed(data)
    assert done == "[DONE]"
    assert doc["error"]["message"] == str(error)
    assert doc["error"]["type"] == "service_unavailable"

"""Run a version on the golden inputs during its smoke test: the example, and the list the
config's `golden = "model.py:golden"` returns. The outputs go to the engine as raw bytes
(engine/golden.py has the wire form), which compares them with the serving version's.

A generator's golden inputs are prompts (its example's, when it is text, and the golden
callable's), continued greedily (temperature 0) by `NEW_TOKENS` tokens at most: the same
code gives the same tokens, so a difference is the edit's. A generator with neither (its
example is token ids, no `golden`) compares the example's logits. Each input runs alone,
as the example does, in this worker's threads; the example's outputs are the smoke test's
own (no second forward).

The outputs' raw bytes go as the reply's payload (no base64). Outputs past the size bound
(`bound`: 16 MiB, at most half the frame limit) are not sent: those inputs are left out of
the comparison, said in one note; a model never fails its build for its outputs' size.
Each input goes with a digest of its values: the engine compares only inputs fed the same
values to both versions.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hotreload.protocol.text import is_text
from hotreload.worker.generate import ModelCall
from hotreload.worker.inputs import to_device
from hotreload.worker.load_error import LoadError
from hotreload.worker.signatures import SignatureError, normalise_example, normalise_output
from hotreload.worker.text_tokenizer import tokenizer_for

#: New tokens a generator's golden prompt is continued by.
NEW_TOKENS = 16
#: Golden outputs a version sends, all inputs together: they travel in one reply and are
#: kept per version in the session's state folder. Past it, the rest are not compared.
MAX_BYTES = 16 * 2**20


def bound(spec: dict[str, Any]) -> int:
    """The bytes of golden outputs a version sends: MAX_BYTES, and at most half the frame
    limit (max_frame_mib), so the reply is never one the session must refuse."""
    frame = int(spec.get("max_frame_bytes") or 64 * 2**20)
    return min(MAX_BYTES, frame // 2)


def golden_inputs(spec: dict[str, Any], root: Path) -> list[Any]:
    """What the golden callable returns (checked to be a list); [] without one."""
    from hotreload.worker.loader import resolve  # loader imports this module

    entry = spec.get("golden")
    if not entry:
        return []
    try:
        made = resolve(entry, root)()
    except LoadError:
        raise
    except Exception as exc:
        raise LoadError(f"golden: {entry['spec']} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(made, (list, tuple)):
        raise LoadError(
            f"golden: {entry['spec']} returned {type(made).__name__}; return a list of "
            "inputs, each like the example (a list of prompts, for a generator)"
        )
    return list(made)


def _as_array(v: Any) -> Any:
    """An output as numpy (None: neither a tensor nor text, not compared)."""
    import numpy as np

    if isinstance(v, np.ndarray):
        return v
    if isinstance(v, torch.Tensor):
        t = v.detach()
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds it exactly
            t = t.float()
        return t.cpu().contiguous().numpy()
    if is_text(v):
        return np.array([v] if isinstance(v, str) else list(v), dtype=str)
    return None


def _size(v: Any) -> int:
    """Bytes an output takes on the wire, known before it is copied off the device."""
    if isinstance(v, torch.Tensor):
        return v.numel() * (4 if v.dtype == torch.bfloat16 else v.element_size())
    if hasattr(v, "nbytes") and hasattr(v, "dtype"):  # numpy (the smoke test's, copied)
        return int(v.nbytes)
    if not is_text(v):
        return 0
    texts = _strings(v)  # numpy's str arrays: 4 bytes a character, each as long as the longest
    return max((len(t) for t in texts), default=0) * 4 * len(texts)


def snapshot(outputs: dict[str, Any]) -> dict[str, Any]:
    """The smoke test's outputs of the example, copied to the host now: a CUDA graph's next
    replay writes its outputs into the same memory."""
    return {k: a for k, v in outputs.items() if (a := _as_array(v)) is not None}


def digest(named: dict[str, Any]) -> str:
    """What an input feeds the model, as a digest: equal for equal values (an unseeded
    generator gives another each version)."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(named):
        v = named[name]
        h.update(name.encode() + b"\0")
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            if t.dtype == torch.bfloat16:
                t = t.float()
            h.update(f"{t.dtype}{list(t.shape)}".encode())
            h.update(t.numpy().tobytes())
        else:
            h.update(repr(v).encode())
        h.update(b"\0")
    return h.hexdigest()


class Sent:
    """The golden outputs a reply carries: header entries, payload pieces, and the inputs
    left out for their size."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.blobs: list[Any] = []
        self.over: list[tuple[int, int]] = []  # (input, its bytes)

    def add(self, index: int, outputs: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Input `index`'s outputs as header entries (their bytes to `blobs`); None when
        they would take the golden outputs past the bound."""
        size = sum(_size(v) for v in outputs.values())
        if self.size + size > self.limit:
            self.over.append((index, size))
            return None
        import numpy as np

        entries = []
        for name, v in outputs.items():
            a = _as_array(v)
            if a is not None:  # engine/golden.py from_wire reads them back
                entries.append(
                    {"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "nbytes": a.nbytes}
                )
                self.blobs.append(memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)))
                self.size += a.nbytes
        return entries

    def note(self) -> str | None:
        """Said once: which inputs are not compared, and what to do."""
        if not self.over:
            return None
        which = ", ".join(str(i) for i, _ in self.over)
        took = sum(n for _, n in self.over) / 2**20
        return (
            f"golden input(s) {which} not compared: their outputs take {took:.1f} MiB, past "
            f"the {self.limit / 2**20:g} MiB golden outputs carry per version (at most half "
            "max_frame_mib); compare on smaller inputs: return them from `golden` (a model "
            "whose example answers this much: golden inputs of a smaller batch or sequence)"
        )


def run_tensors(
    mv: Any,
    inputs: list[Any],
    forward: Callable[[Any, str, dict[str, Any]], Any],
    step_done: Callable[[], None],
    sent: Sent,
    example_outputs: dict[str, Any] | None = None,
) -> tuple[list[list[dict[str, Any]] | None], list[str]]:
    """The example (its smoke test's outputs, when given), then each golden input, through
    `forward` (loader.forward): their outputs as wire entries, and each input's digest."""
    out: list[list[dict[str, Any]] | None] = []
    digests: list[str] = []
    for i, value in enumerate([None, *inputs]):
        what = "the example" if i == 0 else f"golden input {i} (golden()[{i - 1}])"
        if i == 0 and example_outputs is not None:
            digests.append(digest(mv.example))
            outputs = example_outputs
        else:
            named, form = _named(mv, value, what)
            digests.append(digest(named))
            try:
                _, outputs, _ = normalise_output(forward(mv, form, named))
            except Exception as exc:
                raise LoadError(f"golden: {what} failed: {type(exc).__name__}: {exc}") from None
            step_done()
        out.append(sent.add(i, outputs))
    return out, digests


def _named(mv: Any, value: Any, what: str) -> tuple[dict[str, Any], str]:
    """An input as the model's call takes it: named values on its device, inference tensors
    as requests are (None: the example)."""
    if value is None:
        named, form = mv.example, mv.example_form
    else:
        try:
            form, named = normalise_example(value)
        except SignatureError as exc:
            raise LoadError(f"golden: {what}: {exc}") from None
        if form != mv.example_form:
            raise LoadError(
                f"golden: {what} is a {form} input, the example a {mv.example_form} one; "
                "return inputs of the example's form"
            )
    with torch.inference_mode():
        moved = {
            k: to_device(v, mv.device).clone() if isinstance(v, torch.Tensor) else v
            for k, v in named.items()
        }
    return moved, form


def run_prompts(
    mv: Any, prompts: list[Any], folder: str | None, step_done: Callable[[], None]
) -> list[dict[str, Any]]:
    """The example's prompts, then each golden one, continued greedily by up to NEW_TOKENS
    tokens."""
    flat: list[str] = [p for v in mv.example.values() if is_text(v) for p in _strings(v)]
    for i, p in enumerate(prompts):
        items = [p] if isinstance(p, str) else p
        if not is_text(items) or isinstance(items, str):
            raise LoadError(
                f"golden: golden input {i} is {type(p).__name__}; a generator's golden inputs are "
                "prompts (str, or lists of str)"
            )
        flat.extend(items)
    call = ModelCall.of(mv.model)
    tok = tokenizer_for(mv.model, folder)
    texts = []
    with torch.inference_mode():
        for prompt in flat:
            ids = tok.encode(prompt)
            if not ids:
                raise LoadError(f"golden: prompt {prompt!r} is empty after tokenization")
            made: list[int] = []
            for _ in range(NEW_TOKENS):
                # The whole sequence each step, no cache: one path for every model, and
                # the same arithmetic on both versions.
                seq = torch.tensor([ids + made], dtype=torch.long, device=mv.device)
                logits, _ = call(seq)
                nxt = int(torch.argmax(logits[0, -1]).item())
                if tok.eos_id is not None and nxt == tok.eos_id:
                    break
                made.append(nxt)
            texts.append({"prompt": prompt, "tokens": made, "text": tok.decode(made)})
            step_done()
    return texts


def _strings(v: Any) -> list[str]:
    return [v] if isinstance(v, str) else [str(x) for x in v]


def run(
    mv: Any,
    spec: dict[str, Any],
    forward: Callable[[Any, str, dict[str, Any]], Any],
    step_done: Callable[[], None],
    example_outputs: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[Any], str | None]:
    """The version's golden outputs: what SmokeReply.golden carries, the payload's pieces
    (their raw bytes), and a note naming the inputs left out for their size (None: none).
    `example_outputs`: the smoke test's outputs of the example, reused."""
    started = time.perf_counter()
    inputs = golden_inputs(spec, Path(spec["root"]))
    text_example = any(is_text(v) for v in mv.example.values())
    sent = Sent(bound(spec))
    if spec.get("generator") and (inputs or text_example):
        wire: dict[str, Any] = {
            "outputs": [],
            "texts": run_prompts(mv, inputs, spec.get("tokenizer"), step_done),
        }
    else:  # a generator whose example is token ids, and no prompts: its logits
        outputs, digests = run_tensors(mv, inputs, forward, step_done, sent, example_outputs)
        wire = {"outputs": outputs, "digests": digests, "texts": []}
    wire["seconds"] = time.perf_counter() - started
    return wire, sent.blobs, sent.note()

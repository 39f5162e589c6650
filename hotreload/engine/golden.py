"""Golden outputs: what a version answered to the golden inputs, and how two versions'
answers differ. Pure (numpy only): the worker runs the inputs (worker/golden_run.py), the
engine compares the new version's outputs with those of the version it replaces.

On the wire, SmokeReply.golden carries a version's golden outputs as

    {"outputs": [[{name, dtype, shape, nbytes}, ...] per input, or None: not sent (its
                  outputs passed the size bound)],
     "digests": [a digest of each input (what it was fed), per input],
     "texts": [{"prompt", "tokens": [ids], "text"} per prompt]  (a generator),
     "seconds": what running them took}

and the raw bytes of every output, in that order, travel as the frame's payload
(SmokeReply.payload), never as text: two versions are compared bit for bit, and 16 MiB of
outputs cost no base64 and no JSON on either side.

A comparison (`compare`) is a plain dict, as events, `hotreload status` and the report
carry it: `identical`, `same`, `tolerance`, per output `max_abs`, `max_rel`, `flips` (top-1
changes along the last dimension, for an output with a class or vocabulary dimension), per
prompt the first differing token and both texts, and `input_notes`: the inputs not
compared (changed, new, gone, or over the size bound). Only inputs fed the same values to
both versions are compared: a changed input (an unseeded generator) is the input's change,
not the edit's, and never refuses a version. Every number in it is finite (strict JSON).

`GoldenStore` keeps each version's outputs in the session's state folder (an .npz per
version, the last `KEEP`), so `hotreload diff` compares kept versions without running them.
Version numbers restart with each session, so a session's first build clears the folder
and marks it with the session (`begin_session`).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hotreload.engine.golden_text import refusal as refusal  # the engine reads both here
from hotreload.engine.golden_text import summary as summary
from hotreload.errors import HotreloadError

#: Versions whose golden outputs the store keeps, per model.
KEEP = 8
#: Below this many values along the last dimension an output is not read as classes.
MIN_CLASSES = 2
#: The file in a model's golden folder that names the session whose versions it holds.
SESSION_FILE = "session.json"


class GoldenMissing(HotreloadError):
    """`hotreload diff` named a version whose golden outputs are not kept, or unreadable."""


@dataclass(frozen=True)
class GoldenText:
    """A generator's greedy continuation of one golden prompt."""

    prompt: str
    tokens: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class GoldenSet:
    """One version's answers to the golden inputs: per input, its named outputs (None: not
    sent, over the size bound), and per input a digest of what it was fed."""

    outputs: tuple[dict[str, np.ndarray] | None, ...] = ()
    texts: tuple[GoldenText, ...] = ()
    #: Seconds the worker took to run them.
    seconds: float = 0.0
    #: Per entry of `outputs`, a digest of the input's values (empty: not known).
    digests: tuple[str, ...] = ()

    @property
    def inputs(self) -> int:
        return len(self.outputs) + len(self.texts)


def from_wire(wire: dict[str, Any], payload: bytes | memoryview | None = None) -> GoldenSet:
    """A version's golden outputs as the worker sent them (SmokeReply.golden, and its raw
    bytes in `payload`). ValueError when the two do not fit each other."""
    data = memoryview(payload if payload is not None else b"").cast("B")
    at = 0
    outputs: list[dict[str, np.ndarray] | None] = []
    for entries in wire.get("outputs") or []:
        if entries is None:
            outputs.append(None)
            continue
        one: dict[str, np.ndarray] = {}
        for e in entries:
            dtype, shape = np.dtype(e["dtype"]), [int(d) for d in e["shape"]]
            n = int(e["nbytes"])
            if n != dtype.itemsize * math.prod(shape) or at + n > len(data):
                raise ValueError(
                    f"golden output {e['name']!r} ({dtype}{shape}, {n} bytes) does not fit "
                    f"the {len(data)}-byte payload at {at}"
                )
            one[str(e["name"])] = np.frombuffer(data[at : at + n], dtype=dtype).reshape(shape)
            at += n
        outputs.append(one)
    if at != len(data):
        raise ValueError(f"golden outputs take {at} bytes of a {len(data)}-byte payload")
    texts = tuple(
        GoldenText(str(t["prompt"]), tuple(int(i) for i in t["tokens"]), str(t["text"]))
        for t in wire.get("texts") or []
    )
    digests = tuple(str(d) for d in wire.get("digests") or [])
    return GoldenSet(tuple(outputs), texts, float(wire.get("seconds") or 0.0), digests)


def to_wire(golden: GoldenSet) -> tuple[dict[str, Any], list[memoryview]]:
    """The inverse of `from_wire`: the header's part and the payload's pieces (the worker
    builds the same; the fake worker of the tests sends this)."""
    outputs: list[list[dict[str, Any]] | None] = []
    blobs: list[memoryview] = []
    for one in golden.outputs:
        if one is None:
            outputs.append(None)
            continue
        entries = []
        for name, a in one.items():
            entries.append(entry(name, a))
            blobs.append(raw_bytes(a))
        outputs.append(entries)
    wire = {
        "outputs": outputs,
        "digests": list(golden.digests),
        "texts": [
            {"prompt": t.prompt, "tokens": list(t.tokens), "text": t.text} for t in golden.texts
        ],
        "seconds": golden.seconds,
    }
    return wire, blobs


def entry(name: str, a: np.ndarray) -> dict[str, Any]:
    """One output's header entry; its bytes are `raw_bytes(a)`."""
    return {"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "nbytes": a.nbytes}


def raw_bytes(a: np.ndarray) -> memoryview:
    """The array's bytes, uncopied when it is contiguous (a frame's payload piece)."""
    return memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def _label(index: int, name: str, count: int) -> str:
    """`logits` for the one input (the example alone), `input 2 logits` past it."""
    return name if count == 1 else f"input {index} {name}"


def _input_name(index: int) -> str:
    """An input as the notes name it (the numbering of the output labels: 0 the example,
    1 the first of `golden`'s list)."""
    return "golden input 0 (the example)" if index == 0 else f"golden input {index}"


def _numeric(a: np.ndarray) -> bool:
    return a.dtype.kind in "biufc"


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _kinds(a: np.ndarray) -> np.ndarray:
    """Per value: 0 finite, 1 NaN, 2 +inf, 3 -inf (a complex value: both parts)."""
    if a.dtype.kind == "c":
        return _kinds(a.real) * 4 + _kinds(a.imag)
    k = np.zeros(a.shape, np.int8)
    k[np.isnan(a)] = 1
    k[np.isposinf(a)] = 2
    k[np.isneginf(a)] = 3
    return k


def _output_diff(label: str, old: np.ndarray, new: np.ndarray, tolerance: float) -> dict[str, Any]:
    out: dict[str, Any] = {"output": label}
    if old.shape != new.shape or old.dtype != new.dtype:
        out.update(
            changed=True,
            note=f"{old.dtype}{list(old.shape)} -> {new.dtype}{list(new.shape)}",
            max_abs=None,
            max_rel=None,
            flips=None,
        )
        return out
    if not _numeric(old):
        same = bool(np.array_equal(old, new))
        out.update(changed=not same, max_abs=None, max_rel=None, flips=None)
        return out
    # Bit-equal first: identical code on the same inputs gives the same bytes (NaN too).
    bits_equal = old.tobytes() == new.tobytes()
    moved = 0
    a, b = old, new
    if old.dtype.kind in "fc" and not (np.isfinite(old).all() and np.isfinite(new).all()):
        # Numbers are compared where both versions answered one: an inf in both made every
        # difference NaN. Non-finite values must be where they were, and of the same kind.
        ko, kn = _kinds(old), _kinds(new)
        moved = int((ko != kn).sum())
        both = (ko == 0) & (kn == 0)
        a, b = old[both], new[both]
    wide = np.complex128 if old.dtype.kind == "c" else np.float64
    a, b = a.reshape(-1).astype(wide), b.reshape(-1).astype(wide)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        diff = np.abs(a - b)  # may overflow near float64's range: said in a note below
        max_abs = float(diff.max()) if diff.size else 0.0
        scale = np.abs(a)
        rel = np.where(
            scale > 0, diff / np.where(scale > 0, scale, 1.0), np.where(diff > 0, np.inf, 0.0)
        )
    max_rel = float(rel.max()) if rel.size else 0.0
    flips: int | None = None
    positions: int | None = None
    if old.ndim >= 1 and old.shape[-1] >= MIN_CLASSES and old.dtype.kind in "fc":
        top_old = old.reshape(-1, old.shape[-1]).argmax(-1)
        top_new = new.reshape(-1, new.shape[-1]).argmax(-1)
        flips, positions = int((top_old != top_new).sum()), int(top_old.size)
    within = math.isfinite(max_abs) and max_abs <= tolerance
    out.update(
        changed=not bits_equal and (moved > 0 or not within),
        bit_equal=bits_equal,
        max_abs=_finite_or_none(max_abs),
        max_rel=_finite_or_none(max_rel),
        flips=flips,
        positions=positions,
    )
    if not math.isfinite(max_abs):  # finite values a float64 difference overflows
        out["note"] = "differences past float64's range"
    if moved:
        out["note"] = (
            f"non-finite values (inf, nan) differ at {moved} of {old.size} position(s)"
            f"; max abs {max_abs:.3g} where both are finite"
        )
    return out


def _text_diff(index: int, old: GoldenText, new: GoldenText) -> dict[str, Any]:
    first = next(
        (i for i, (x, y) in enumerate(zip(old.tokens, new.tokens, strict=False)) if x != y),
        None,
    )
    if first is None and len(old.tokens) != len(new.tokens):
        first = min(len(old.tokens), len(new.tokens))
    return {
        "prompt": old.prompt,
        "index": index,
        "changed": first is not None,
        "first_token": first,
        "old": old.text,
        "new": new.text,
    }


def _digest(g: GoldenSet, i: int) -> str | None:
    return g.digests[i] if i < len(g.digests) else None


def compare(
    old: GoldenSet,
    new: GoldenSet,
    *,
    tolerance: float = 0.0,
    old_version: int | None = None,
    new_version: int | None = None,
) -> dict[str, Any]:
    """How `new`'s golden outputs differ from `old`'s: `identical` (bit-equal everywhere
    compared), `same` (within `tolerance`; tokens always equal), per output and prompt what
    changed, and `input_notes`: the inputs left out (fed other values, added, removed, not
    sent), which never make a version differ on their own."""
    outputs: list[dict[str, Any]] = []
    notes: list[str] = []
    compared = 0
    count = max(len(old.outputs), len(new.outputs))
    for i in range(count):
        what = _input_name(i)
        if i >= len(old.outputs):
            notes.append(f"{what} is new: compared from the next version on")
            continue
        if i >= len(new.outputs):
            notes.append(f"{what} is gone")
            continue
        o, n = old.outputs[i], new.outputs[i]
        od, nd = _digest(old, i), _digest(new, i)
        if od is not None and nd is not None and od != nd:
            notes.append(f"{what} changed (seed its generator): not compared, not held against it")
            continue
        if o is None or n is None:
            notes.append(f"{what} not compared: its outputs are over the golden size bound")
            continue
        compared += 1
        for name in sorted(set(o) | set(n), key=lambda k: (k not in o, k)):
            label = _label(i, name, count)
            if name not in o or name not in n:
                where = "new" if name not in o else "gone"
                outputs.append(
                    {
                        "output": label,
                        "changed": True,
                        "note": f"output {where}",
                        "max_abs": None,
                        "max_rel": None,
                        "flips": None,
                    }
                )
                continue
            outputs.append(_output_diff(label, o[name], n[name], tolerance))
    texts = []
    for i in range(max(len(old.texts), len(new.texts))):
        if i >= len(old.texts) or i >= len(new.texts):
            where = "new: compared from the next version on" if i >= len(old.texts) else "gone"
            notes.append(f"golden prompt {i} is {where}")
        elif old.texts[i].prompt != new.texts[i].prompt:
            notes.append(f"golden prompt {i} changed: not compared, not held against it")
        else:
            compared += 1
            texts.append(_text_diff(i, old.texts[i], new.texts[i]))
    same = not any(e["changed"] for e in outputs + texts)
    identical = (
        same and compared > 0 and all(e.get("bit_equal", not e["changed"]) for e in outputs)
    )
    return {
        "from": old_version,
        "to": new_version,
        "identical": identical,
        "same": same,
        "tolerance": tolerance,
        "inputs": new.inputs,
        "compared": compared,
        "inputs_changed": bool(notes),
        "input_notes": notes,
        "outputs": outputs,
        "texts": texts,
        "seconds": new.seconds,
    }


# ------------------------------------------------------------------ kept versions

_FILE_RE = re.compile(r"^v(\d+)\.npz$")


def session_marker() -> dict[str, Any]:
    """What names this session in a golden folder: the manager's pid and when it began."""
    return {"pid": os.getpid(), "started_at": time.time()}


@dataclass
class GoldenStore:
    """Each version's golden outputs, one .npz per version in `folder` (the model's
    folder under the session's state), the last `keep` versions of one session."""

    folder: Path
    keep: int = KEEP
    _cache: dict[int, GoldenSet] = field(default_factory=dict)

    def path(self, version: int) -> Path:
        return self.folder / f"v{version}.npz"

    def begin_session(self, marker: dict[str, Any]) -> None:
        """A session's first build: the versions another session kept go (its numbers
        restart at 1 here), and the folder names this one. OSError when it cannot."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for v in self.versions():
            self.path(v).unlink(missing_ok=True)
        self._cache.clear()
        tmp = self.folder / f".{SESSION_FILE}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(marker) + "\n")
        os.replace(tmp, self.folder / SESSION_FILE)

    def session(self) -> dict[str, Any] | None:
        """The marker of the session whose versions the folder holds (None: unmarked)."""
        try:
            got = json.loads((self.folder / SESSION_FILE).read_text())
        except (OSError, ValueError):
            return None
        return got if isinstance(got, dict) else None

    def save(self, version: int, golden: GoldenSet) -> None:
        """Written to a temporary file and renamed: a reader never sees half a file."""
        self.folder.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        names: list[list[str] | None] = []
        for i, one in enumerate(golden.outputs):
            names.append(list(one) if one is not None else None)
            for j, a in enumerate((one or {}).values()):
                arrays[f"o{i}_{j}"] = a
        meta = {
            "names": names,
            "digests": list(golden.digests),
            "texts": [
                {"prompt": t.prompt, "tokens": list(t.tokens), "text": t.text} for t in golden.texts
            ],
            "seconds": golden.seconds,
        }
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        tmp = self.folder / f".v{version}.{os.getpid()}.tmp.npz"
        try:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)  # type: ignore[arg-type]
            os.replace(tmp, self.path(version))
        except BaseException:
            tmp.unlink(missing_ok=True)  # a full disk leaves no half file behind
            raise
        self._cache[version] = golden
        self._trim()

    def load(self, version: int) -> GoldenSet | None:
        """Version `version`'s golden outputs (None: not kept). GoldenMissing, saying what
        to do, when its file cannot be read (cut short, not written by hotreload)."""
        if version in self._cache:
            return self._cache[version]
        p = self.path(version)
        if not p.is_file():
            return None
        try:
            return self._read(p)
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
            raise GoldenMissing(
                f"the golden outputs of version {version} ({p}) cannot be read "
                f"({type(exc).__name__}: {exc}); delete the file (the next reload writes "
                "its version's again)"
            ) from None

    @staticmethod
    def _read(p: Path) -> GoldenSet:
        with np.load(p, allow_pickle=False) as z:  # never pickle: a file is data, not code
            meta = json.loads(bytes(z["meta"]).decode())
            outputs = tuple(
                {name: z[f"o{i}_{j}"] for j, name in enumerate(names)}
                if names is not None
                else None
                for i, names in enumerate(meta["names"])
            )
        texts = tuple(
            GoldenText(str(t["prompt"]), tuple(int(x) for x in t["tokens"]), str(t["text"]))
            for t in meta["texts"]
        )
        digests = tuple(str(d) for d in meta.get("digests") or [])
        return GoldenSet(outputs, texts, float(meta.get("seconds") or 0.0), digests)

    def versions(self) -> list[int]:
        if not self.folder.is_dir():
            return []
        found = (_FILE_RE.match(p.name) for p in self.folder.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def _trim(self) -> None:
        for v in self.versions()[: -self.keep]:
            self.path(v).unlink(missing_ok=True)
            self._cache.pop(v, None)


def diff_kept(
    store: GoldenStore,
    model: str,
    a: int | None,
    b: int | None,
    serving: int | None,
    *,
    tolerance: float = 0.0,
) -> dict[str, Any]:
    """`hotreload diff`: kept versions `a` and `b` compared within `tolerance` (default:
    the one before the serving version, and the serving one). GoldenMissing says which
    versions are kept, or which file cannot be read."""
    kept = store.versions()
    if b is None:
        b = serving if serving in kept else (kept[-1] if kept else None)
    if a is None and b is not None:
        earlier = [v for v in kept if v < b]
        a = earlier[-1] if earlier else None
    if a is None or b is None:
        have = ", ".join(f"v{v}" for v in kept) or "none"
        raise GoldenMissing(
            f"model {model!r}: hotreload diff needs two kept versions' golden outputs "
            f"(kept: {have}); reload it once more, or name two of them: hotreload diff "
            f"{model} A B"
        )
    sets = {}
    for v in (a, b):
        got = store.load(v)
        if got is None:
            have = ", ".join(f"v{k}" for k in kept) or "none"
            raise GoldenMissing(
                f"model {model!r}: no golden outputs kept for version {v} (kept: {have}; "
                f"the last {store.keep} versions of the session are kept)"
            )
        sets[v] = got
    return compare(sets[a], sets[b], tolerance=tolerance, old_version=a, new_version=b)
